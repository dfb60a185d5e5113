"""redis-py, unmodified, against the RESP transport (tests/it/direct/throttle.rs runs it).

redis-py opens with `HELLO 3` and does not fall back to RESP2: the transport must speak it.
Prints one line per check; exits non-zero on the first failure.
"""
import sys

import redis



def expect(got, want, what):
    """An explicit check: `assert` is dropped under PYTHONOPTIMIZE."""
    if got != want:
        sys.exit(f"{what}: got {got!r}, want {want!r}")


port = int(sys.argv[1])
r = redis.Redis(host="127.0.0.1", port=port)
expect(r.ping(), True, 'r.ping()')
# ThrottleCrab: [allowed, limit, remaining, reset_after, retry_after] (T = 6 s, tau = 12 s)
expect(r.execute_command("THROTTLE", "py", "3", "10", "60"), [1, 3, 2, 12, 0], 'r.execute_command("THROTTLE", "py", "3", "10", "60")')
# redis-cell: README "Response"; tests/e2e.rs it_works (limited, then retry in 2 s)
expect(r.execute_command("CL.THROTTLE", "py:user123", "15", "30", "60"), [0, 16, 15, -1, 2], 'r.execute_command("CL.THROTTLE", "py:user123", "15", "30", "60")')
expect(r.execute_command("CL.THROTTLE", "py:e2e", "0", "1", "2", "1"), [0, 1, 0, -1, 2], 'r.execute_command("CL.THROTTLE", "py:e2e", "0", "1", "2", "1")')
expect(r.execute_command("CL.THROTTLE", "py:e2e", "0", "1", "2", "1"), [1, 1, 0, 2, 2], 'r.execute_command("CL.THROTTLE", "py:e2e", "0", "1", "2", "1")')
expect(r.echo("hi"), b"hi", 'r.echo("hi")')
p = r.pipeline(transaction=False)
for _ in range(3):
    p.execute_command("THROTTLE", "py-pipe", "2", "10", "60")
expect([a[0] for a in p.execute()], [1, 1, 0], '[a[0] for a in p.execute()]')
expect(r.client_setname("app"), True, 'r.client_setname("app")')
print(f"redis-py {redis.__version__} ok")
