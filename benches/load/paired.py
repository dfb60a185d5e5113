#!/usr/bin/env python3
"""Paired load rounds: ratios that hold on a machine whose speed drifts.

run.sh measures one server after another, tens of seconds apart; on a shared VM whose speed
drifts by 10-20 % over such spans, a ratio of two of its rows moves as much as the change
being measured. This script starts every server at once (idle ones cost nothing), then in
each round sends each of them the same short h2load run, one after another, a second or two
apart, and takes each ratio within the round. It prints, per server and mix, the median
req/s and server CPU per call, and the median (and range) of the per-round ratios:

  - vs noop: req/s against the do-nothing server;
  - vs memory: a turnstile-redis-wN's or turnstile-durable-wN's req/s (and CPU per call)
    against the turnstile-wN of the same binaries (durable: TURNSTILE_STATE_DIR set);
  - vs first: against the same server of the first binaries, when several are given.

  benches/load/paired.py [--bins DIR ...] [--servers ...] [--mixes ...] [--rounds N]
                         [--requests N]

DIR holds turnstile and noop_rls (default target/release and target/release/examples). The
order of the servers turns by one each round, so none is always first after a pause.
"""

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from procs import HZ, cpu_ticks, free_port  # noqa: E402

METHOD = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
CONFIG = "benches/load/bench.conf.yaml"
# --pin: the server on CPU 1, the load client and redis-server on CPU 0.
PIN_SERVER, PIN_CLIENT = [], []


class Server:
    def __init__(self, name, bins, work):
        self.name, self.bins, self.label = name, bins, f"{name}@{os.path.basename(bins)}"
        self.redis = None
        out = open(os.path.join(work, f"{self.label}.out"), "w+")
        err = open(os.path.join(work, f"{self.label}.err"), "w")
        # Every server runs at once: each on debug and Prometheus ports of its own (a taken port
        # stops a start).
        env = dict(os.environ, DEBUG_HOST="127.0.0.1", DEBUG_PORT="0",
                   PROMETHEUS_ADDR="127.0.0.1:0")
        if name == "noop":
            cmd = [noop_bin(bins), "127.0.0.1:0"]
        else:
            m = re.fullmatch(r"turnstile-(redis-|durable-)?w(\d+)", name)
            if not m:
                sys.exit(f"paired.py: unknown server {name}")
            cmd = [turnstile_bin(bins), "serve", "--config", CONFIG, "--grpc-addr",
                   "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--workers", m.group(2)]
            if m.group(1) == "durable-":
                env.update(TURNSTILE_STATE_DIR=os.path.join(work, f"{self.label}.state"))
            elif m.group(1):
                port = free_port()
                self.redis = subprocess.Popen(
                    PIN_CLIENT + ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                     "--appendonly", "no"], stdout=subprocess.DEVNULL)
                wait_for(lambda: subprocess.run(["redis-cli", "-p", str(port), "ping"],
                                                capture_output=True).returncode == 0,
                         f"redis-server on {port}")
                env.update(BACKEND_TYPE="redis", REDIS_URL=f"127.0.0.1:{port}",
                           TURNSTILE_LOCAL_FIRST="false")
        self.proc = subprocess.Popen(PIN_SERVER + cmd, stdout=out, stderr=err, env=env)

        def listening():
            if self.proc.poll() is not None:
                err.flush()
                sys.exit(f"paired.py: {self.label} exited: {open(err.name).read()}")
            out.seek(0)
            m = re.search(r"listening grpc=(\S+)", out.read())
            self.addr = m and m.group(1)
            return bool(self.addr)

        wait_for(listening, f"{self.label} to listen")

    def ticks(self):
        return cpu_ticks(self.proc.pid) + (cpu_ticks(self.redis.pid) if self.redis else 0)

    def stop(self):
        for p in (self.proc, self.redis):
            if p:
                p.terminate()
                p.wait()


def noop_bin(d):
    return next(p for p in (f"{d}/noop_rls", f"{d}/examples/noop_rls") if os.path.exists(p))


def turnstile_bin(d):
    return f"{d}/turnstile"


def wait_for(check, what, seconds=10):
    end = time.time() + seconds
    while time.time() < end:
        if check():
            return
        time.sleep(0.1)
    sys.exit(f"paired.py: timed out waiting for {what}")


def h2load(addr, body, n):
    """req/s of `n` calls, failing on any call that did not succeed."""
    out = subprocess.run(
        PIN_CLIENT + ["h2load", "-n", str(n), "-c", "10", "-m", "10", "-d", body,
         "-H", "content-type: application/grpc", "-H", "te: trailers", f"http://{addr}{METHOD}"],
        capture_output=True, text=True, check=True).stdout
    if f" {n} succeeded" not in out:
        sys.exit(f"paired.py: h2load against {addr}:\n{out}")
    return float(re.search(r"finished in .*?, ([\d.]+) req/s", out).group(1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bins", nargs="+", default=["target/release"])
    ap.add_argument("--servers", nargs="+", default=["noop", "turnstile-w1"])
    ap.add_argument("--mixes", nargs="+", default=["one", "multi"])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--pin", action="store_true",
                    help="the server on CPU 1, h2load and redis-server on CPU 0 (taskset)")
    a = ap.parse_args()
    if a.pin:
        PIN_SERVER.extend(["taskset", "-c", "1"])
        PIN_CLIENT.extend(["taskset", "-c", "0"])
    for tool in ("h2load",) + (("redis-server", "redis-cli") if any(
            "redis" in s for s in a.servers) else ()):
        if not shutil.which(tool):
            sys.exit(f"paired.py: {tool} not found")
    os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
    work = tempfile.mkdtemp(prefix="turnstile-paired.")
    subprocess.run([sys.executable, "benches/load/make_body.py", f"{work}/bodies"], check=True)
    servers = []
    try:
        # The floor once (its code is not what the binaries compare), then every other server
        # of every binaries' directory.
        for name in a.servers:
            for b in a.bins[:1] if name == "noop" else a.bins:
                servers.append(Server(name, b, work))
        for s in servers:
            for mix in a.mixes:
                h2load(s.addr, f"{work}/bodies/{mix}.bin", max(a.requests // 5, 5000))
        rows = {}  # (label, mix) -> [(req/s, cpu µs per call)] per round
        for r in range(a.rounds):
            turn = servers[r % len(servers):] + servers[:r % len(servers)]
            for mix in a.mixes:
                for s in turn:
                    t0 = s.ticks()
                    rps = h2load(s.addr, f"{work}/bodies/{mix}.bin", a.requests)
                    cpu = (s.ticks() - t0) / HZ * 1e6 / a.requests
                    rows.setdefault((s.label, mix), []).append((rps, cpu))
            print(f"paired.py: round {r + 1} of {a.rounds} done", file=sys.stderr)
        report(a, servers, rows)
    finally:
        for s in servers:
            s.stop()
        shutil.rmtree(work, ignore_errors=True)


def report(a, servers, rows):
    def ratios(x, y, mix, i=0):
        if (y, mix) not in rows or x == y:
            return "-"
        rs = [p[i] / q[i] for p, q in zip(rows[(x, mix)], rows[(y, mix)])]
        return f"{statistics.median(rs):.3f} ({min(rs):.2f}-{max(rs):.2f})"

    noop = next((s.label for s in servers if s.name == "noop"), None)
    first = os.path.basename(a.bins[0])
    print(f"{a.rounds} rounds of {a.requests} calls per server and mix, h2load -c 10 -m 10; "
          f"medians, ratios taken within each round (range in brackets).\n")
    print("| server | mix | req/s | CPU µs/call (server and its redis) | vs noop | vs memory "
          "| CPU vs memory | vs first |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for s in servers:
        for mix in a.mixes:
            got = rows[(s.label, mix)]
            rps = statistics.median(g[0] for g in got)
            cpu = statistics.median(g[1] for g in got)
            mem = re.sub(r"turnstile-(redis|durable)-", "turnstile-", s.label)
            same = re.sub(r"@.*", f"@{first}", s.label)
            print(f"| {s.label} | {mix} | {rps:.0f} | {cpu:.2f} | {ratios(s.label, noop, mix)} | "
                  f"{ratios(s.label, mem, mix)} | {ratios(s.label, mem, mix, 1)} | "
                  f"{ratios(s.label, same, mix)} |")


if __name__ == "__main__":
    main()
