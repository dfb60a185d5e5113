// ioredis and node-redis, unmodified, against the RESP transport (tests/transport.rs runs it).
// ioredis checks readiness with INFO; node-redis opens with HELLO 3 and does not fall back.
const assert = require('assert');
const Redis = require('ioredis');
const { createClient } = require('redis');

const port = Number(process.argv[2]);
(async () => {
  const io = new Redis({ port, host: '127.0.0.1', lazyConnect: true, maxRetriesPerRequest: 0 });
  await io.connect();
  assert.deepStrictEqual(await io.call('THROTTLE', 'io', '3', '10', '60'), [1, 3, 2, 0, 6]);
  io.disconnect();
  const c = createClient({ url: `redis://127.0.0.1:${port}` });
  c.on('error', (e) => { console.error('node-redis:', e.message); process.exit(1); });
  await c.connect();
  assert.deepStrictEqual(await c.sendCommand(['THROTTLE', 'nr', '3', '10', '60']), [1, 3, 2, 0, 6]);
  await c.quit();
  console.log('ioredis and node-redis ok');
})().catch((e) => { console.error(e.message); process.exit(1); });
