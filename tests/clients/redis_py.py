"""redis-py, unmodified, against the RESP transport (tests/transport.rs runs it).

redis-py opens with `HELLO 3` and does not fall back to RESP2: the transport must speak it.
Prints one line per check; exits non-zero on the first failure.
"""
import sys

import redis

port = int(sys.argv[1])
r = redis.Redis(host="127.0.0.1", port=port)
assert r.ping() is True
# ThrottleCrab: [allowed, limit, remaining, reset_after, retry_after] (T = 6 s, tau = 12 s)
assert r.execute_command("THROTTLE", "py", "3", "10", "60") == [1, 3, 2, 12, 0]
# redis-cell: README "Response"; tests/e2e.rs it_works (limited, then retry in 2 s)
assert r.execute_command("CL.THROTTLE", "py:user123", "15", "30", "60") == [0, 16, 15, -1, 2]
assert r.execute_command("CL.THROTTLE", "py:e2e", "0", "1", "2", "1") == [0, 1, 0, -1, 2]
assert r.execute_command("CL.THROTTLE", "py:e2e", "0", "1", "2", "1") == [1, 1, 0, 2, 2]
assert r.echo("hi") == b"hi"
p = r.pipeline(transaction=False)
for _ in range(3):
    p.execute_command("THROTTLE", "py-pipe", "2", "10", "60")
assert [a[0] for a in p.execute()] == [1, 1, 0]
assert r.client_setname("app") is True
print(f"redis-py {redis.__version__} ok")
