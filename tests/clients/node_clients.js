// ioredis and node-redis, unmodified, against the RESP transport (tests/it/direct/throttle.rs
// runs it).
// ioredis checks readiness with INFO; node-redis opens with HELLO 3 and does not fall back.
const assert = require('assert');
const Redis = require('ioredis');
const { createClient } = require('redis');

const port = Number(process.argv[2]);
(async () => {
  const io = new Redis({ port, host: '127.0.0.1', lazyConnect: true, maxRetriesPerRequest: 0 });
  await io.connect();
  // ThrottleCrab: [allowed, limit, remaining, reset_after, retry_after] (T = 6 s, tau = 12 s).
  assert.deepStrictEqual(await io.call('THROTTLE', 'io', '3', '10', '60'), [1, 3, 2, 12, 0]);
  // redis-cell: README "Response"; tests/e2e.rs it_works (limited, then retry in 2 s).
  assert.deepStrictEqual(await io.call('CL.THROTTLE', 'io:user123', '15', '30', '60'), [0, 16, 15, -1, 2]);
  assert.deepStrictEqual(await io.call('CL.THROTTLE', 'io:e2e', '0', '1', '2', '1'), [0, 1, 0, -1, 2]);
  assert.deepStrictEqual(await io.call('CL.THROTTLE', 'io:e2e', '0', '1', '2', '1'), [1, 1, 0, 2, 2]);
  io.disconnect();
  const c = createClient({ url: `redis://127.0.0.1:${port}` });
  c.on('error', (e) => { console.error('node-redis:', e.message); process.exit(1); });
  await c.connect();
  assert.deepStrictEqual(await c.sendCommand(['THROTTLE', 'nr', '3', '10', '60']), [1, 3, 2, 12, 0]);
  assert.deepStrictEqual(await c.sendCommand(['CL.THROTTLE', 'nr:user123', '15', '30', '60']), [0, 16, 15, -1, 2]);
  assert.deepStrictEqual(await c.sendCommand(['CL.THROTTLE', 'nr:e2e', '0', '1', '2', '1']), [0, 1, 0, -1, 2]);
  assert.deepStrictEqual(await c.sendCommand(['CL.THROTTLE', 'nr:e2e', '0', '1', '2', '1']), [1, 1, 0, 2, 2]);
  await c.quit();
  console.log('ioredis and node-redis ok');
})().catch((e) => { console.error(e.message); process.exit(1); });
