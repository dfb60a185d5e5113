#!/usr/bin/env python3
"""turnstile against the peers' own servers, side by side, in paired rounds.

  benches/load/peers.py [--pin] [--rounds N] [--requests N] [--bins DIR]
                        [--throttlecrab-root DIR] [--redis-cell PATH] [--limitador PATH]
                        [--workloads ...]

Every server is up at once (idle ones cost nothing): turnstile (RESP on one port, HTTP on
another, gRPC), throttlecrab-server 0.4.40 (`--redis --http`; installed with `cargo install
throttlecrab-server --version 0.4.40 --root DIR` when DIR/bin has none, default
target/peers/throttlecrab), and when given a path, redis-server with the redis-cell module
(`CL.THROTTLE`) and a `limitador-server` binary (`ShouldRateLimit`, in memory).

Before measuring, each server must really count: a limit of 3 answers allowed three times and
refuses the fourth (THROTTLE max_burst 3, CL.THROTTLE max_burst 2, POST /throttle max_burst 3, a
ShouldRateLimit descriptor limited to 3 an hour). Then, in each round, each workload is sent to
each server that answers it, one after another (the order turns by one each round); per run:
calls/s, server CPU per call (utime + stime from /proc/PID/stat before and after), p50 and p99.
Ratios turnstile / peer are taken within each round; the report gives medians and ranges.

Workloads:
  resp       redis-benchmark -c 50 -P 1 -r 10000: THROTTLE key:__rand_int__ 1000 10000 60 1
  resp-p16   the same, -P 16
  cell       CL.THROTTLE ... against turnstile and redis-cell, -P 1
  http       h2load -c 10 -m 10 over h2c: POST /throttle, one key, a limit never reached
  grpc       h2load -c 10 -m 10: ShouldRateLimit, one descriptor (turnstile and Limitador)

--pin puts the servers on CPU 1 and the load clients on CPU 0 (taskset).
"""

import argparse
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_body  # noqa: E402
from procs import HZ, METHOD, cpu_ticks, free_port, should_rate_limit  # noqa: E402

PIN_SERVER, PIN_CLIENT = [], []
THROTTLECRAB_VERSION = "0.4.40"
HTTP_BODY = {"key": "bench", "max_burst": 1000000, "count_per_period": 1000000, "period": 60}

# turnstile's config: bench.conf.yaml plus the sanity limit.
SANITY_YAML = """
  - key: sanity
    rate_limit:
      unit: hour
      requests_per_unit: 3
"""
# Limitador's limits (CEL conditions, its main branch): the same two.
LIMITADOR_LIMITS = """
- namespace: bench
  max_value: 1000000000
  seconds: 1
  conditions: ["descriptors[0].api_key == 'k1'"]
  variables: []
- namespace: bench
  max_value: 3
  seconds: 3600
  conditions: ["descriptors[0].sanity == 'x'"]
  variables: []
"""


def log(msg):
    print(f"peers.py: {msg}", file=sys.stderr, flush=True)


def wait_port(port, proc, what, seconds=20):
    end = time.time() + seconds
    while time.time() < end:
        if proc.poll() is not None:
            sys.exit(f"peers.py: {what} exited (code {proc.returncode})")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.1)
    sys.exit(f"peers.py: {what} not listening on {port}")


class Server:
    """One server process: its name, which workloads it answers, and where."""

    def __init__(self, name, cmd, work, env=None, ports=None):
        self.name, self.ports = name, ports or {}
        out = open(os.path.join(work, f"{name}.out"), "w")
        err = open(os.path.join(work, f"{name}.err"), "w")
        self.proc = subprocess.Popen(PIN_SERVER + cmd, stdout=out, stderr=err,
                                     env={**os.environ, **(env or {})})
        for port in self.ports.values():
            wait_port(port, self.proc, name)

    def ticks(self):
        return cpu_ticks(self.proc.pid)

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def install_throttlecrab(root):
    binary = os.path.join(root, "bin", "throttlecrab-server")
    if not os.path.exists(binary):
        log(f"installing throttlecrab-server {THROTTLECRAB_VERSION} into {root}")
        subprocess.run(["cargo", "install", "throttlecrab-server", "--version",
                        THROTTLECRAB_VERSION, "--locked", "--root", root], check=True)
    return binary


def start_servers(a, work):
    servers = []
    conf = os.path.join(work, "turnstile.yaml")
    with open("benches/load/bench.conf.yaml") as f:
        base = f.read()
    with open(conf, "w") as f:
        f.write(base.replace("descriptors:\n", "descriptors:" + SANITY_YAML, 1))
    for bins in a.bins:
        name = "turnstile" if len(a.bins) == 1 else f"turnstile@{os.path.basename(bins)}"
        p = {"resp": free_port(), "http": free_port(), "grpc": free_port()}
        servers.append(Server(name, [
            os.path.join(bins, "turnstile"), "serve", "--config", conf,
            "--grpc-addr", f"127.0.0.1:{p['grpc']}", "--http-addr", f"127.0.0.1:{p['http']}",
            "--workers", "1"], work, env={"TURNSTILE_RESP_ADDR": f"127.0.0.1:{p['resp']}"},
            ports=p))
        # turnstile answers CL.THROTTLE on its RESP port.
        p["cell"] = p["resp"]
    crab = install_throttlecrab(os.path.abspath(a.throttlecrab_root))
    p = {"resp": free_port(), "http": free_port()}
    servers.append(Server("throttlecrab", [
        crab, "--redis", "--redis-host", "127.0.0.1", "--redis-port", str(p["resp"]),
        "--http", "--http-host", "127.0.0.1", "--http-port", str(p["http"]),
        "--log-level", "error"], work, ports=p))
    if a.redis_cell:
        p = {"cell": free_port()}
        servers.append(Server("redis-cell", [
            "redis-server", "--port", str(p["cell"]), "--bind", "127.0.0.1", "--save", "",
            "--appendonly", "no", "--loadmodule", os.path.abspath(a.redis_cell)], work, ports=p))
    if a.limitador:
        limits = os.path.join(work, "limits.yaml")
        with open(limits, "w") as f:
            f.write(LIMITADOR_LIMITS)
        p = {"grpc": free_port()}
        servers.append(Server("limitador", [
            os.path.abspath(a.limitador), "--rls-ip", "127.0.0.1", "--rls-port", str(p["grpc"]),
            "--http-ip", "127.0.0.1", "--http-port", str(free_port()), limits, "memory"],
            work, ports=p))
    return servers


# ---------------------------------------------------------------- sanity
def redis_cli(port, *args):
    out = subprocess.run(["redis-cli", "-p", str(port), *args], capture_output=True, text=True,
                         check=True).stdout.split()
    return out


def post_throttle(port, body):
    out = subprocess.run(["curl", "-s", "-XPOST", f"http://127.0.0.1:{port}/throttle", "-H",
                          "content-type: application/json", "-d", json.dumps(body)],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def sanity(s, work):
    """Each server counts: a limit of 3 allows three calls and refuses the fourth."""
    key = f"sanity{time.time_ns()}"
    checks = {}
    if "resp" in s.ports:
        got = [redis_cli(s.ports["resp"], "THROTTLE", key, "3", "3", "3600")[0] for _ in range(4)]
        checks["THROTTLE"] = (got, ["1", "1", "1", "0"])
    if "cell" in s.ports:
        got = [redis_cli(s.ports["cell"], "CL.THROTTLE", key, "2", "3", "3600")[0]
               for _ in range(4)]
        checks["CL.THROTTLE"] = (got, ["0", "0", "0", "1"])
    if "http" in s.ports:
        body = {"key": key + "http", "max_burst": 3, "count_per_period": 3, "period": 3600}
        got = [post_throttle(s.ports["http"], body)["allowed"] for _ in range(4)]
        checks["POST /throttle"] = (got, [True, True, True, False])
    if "grpc" in s.ports:
        got = [should_rate_limit(s.ports["grpc"], f"{work}/bodies/sanity.bin") for _ in range(4)]
        checks["ShouldRateLimit"] = (got, [1, 1, 1, 2])
    for what, (got, want) in checks.items():
        if got != want:
            sys.exit(f"peers.py: {s.name} does not count on {what}: {got}, expected {want}")
        log(f"{s.name}: {what} allowed 3 of a limit of 3 and refused the 4th")


# ---------------------------------------------------------------- load
def redis_benchmark(port, n, pipeline, command):
    out = subprocess.run(
        PIN_CLIENT + ["redis-benchmark", "-p", str(port), "-c", "50", "-P", str(pipeline),
                      "-n", str(n), "-r", "10000", *command],
        capture_output=True, text=True, check=True).stdout
    rps = float(re.search(r"throughput summary: ([\d.]+) requests per second", out).group(1))
    lat = re.search(r"avg\s+min\s+p50\s+p95\s+p99\s+max\s*\n\s*([\d.]+)\s+([\d.]+)\s+([\d.]+)"
                    r"\s+([\d.]+)\s+([\d.]+)", out)
    return rps, float(lat.group(3)) * 1000, float(lat.group(5)) * 1000


def h2load(url, body, n, content_type, work):
    logf = f"{work}/h2load.log"
    out = subprocess.run(
        PIN_CLIENT + ["h2load", "-n", str(n), "-c", "10", "-m", "10", "-d", body, "-H",
                      f"content-type: {content_type}", "-H", "te: trailers",
                      f"--log-file={logf}", url],
        capture_output=True, text=True, check=True).stdout
    if f" {n} succeeded" not in out:
        sys.exit(f"peers.py: h2load against {url}:\n{out}")
    rps = float(re.search(r"finished in .*?, ([\d.]+) req/s", out).group(1))
    with open(logf) as f:
        lat = sorted(int(line.split("\t")[2]) for line in f if line.split("\t")[1] != "-1")
    return rps, lat[len(lat) // 2], lat[min(len(lat) - 1, int(len(lat) * 0.99))]


WORKLOADS = {
    # name: (port kind, driver)
    "resp": ("resp", lambda s, n, w: redis_benchmark(
        s.ports["resp"], n, 1, ["THROTTLE", "key:__rand_int__", "1000", "10000", "60", "1"])),
    "resp-p16": ("resp", lambda s, n, w: redis_benchmark(
        s.ports["resp"], n, 16, ["THROTTLE", "key:__rand_int__", "1000", "10000", "60", "1"])),
    "cell": ("cell", lambda s, n, w: redis_benchmark(
        s.ports["cell"], n, 1, ["CL.THROTTLE", "key:__rand_int__", "1000", "10000", "60", "1"])),
    "http": ("http", lambda s, n, w: h2load(
        f"http://127.0.0.1:{s.ports['http']}/throttle", f"{w}/bodies/http.json", n,
        "application/json", w)),
    "grpc": ("grpc", lambda s, n, w: h2load(
        f"http://127.0.0.1:{s.ports['grpc']}{METHOD}", f"{w}/bodies/one.bin", n,
        "application/grpc", w)),
}


def measure(s, workload, n, work):
    t0 = s.ticks()
    rps, p50, p99 = WORKLOADS[workload][1](s, n, work)
    cpu = (s.ticks() - t0) / HZ * 1e6 / n
    return rps, cpu, p50, p99


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bins", nargs="+", default=["target/release"],
                    help="directories holding a turnstile binary (several: each is a server)")
    ap.add_argument("--throttlecrab-root", default="target/peers/throttlecrab")
    ap.add_argument("--redis-cell", help="the redis-cell module (libredis_cell.so)")
    ap.add_argument("--limitador", help="a limitador-server binary")
    ap.add_argument("--workloads", nargs="+", default=["resp", "resp-p16", "cell", "http", "grpc"])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--pin", action="store_true",
                    help="servers on CPU 1, load clients on CPU 0 (taskset)")
    a = ap.parse_args()
    if a.pin:
        PIN_SERVER.extend(["taskset", "-c", "1"])
        PIN_CLIENT.extend(["taskset", "-c", "0"])
    for tool in ("redis-benchmark", "redis-cli", "redis-server", "h2load", "curl"):
        if not shutil.which(tool):
            sys.exit(f"peers.py: {tool} not found")
    os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
    work = tempfile.mkdtemp(prefix="turnstile-peers.")
    os.makedirs(f"{work}/bodies")
    with open(f"{work}/bodies/http.json", "w") as f:
        json.dump(HTTP_BODY, f)
    for mix, descriptors in (("one", make_body.MIXES["one"]), ("sanity", [[("sanity", "x")]])):
        with open(f"{work}/bodies/{mix}.bin", "wb") as f:
            f.write(make_body.grpc_frame(make_body.encode_request("bench", descriptors)))
    servers = []
    try:
        servers = start_servers(a, work)
        for s in servers:
            sanity(s, work)
        rows = {}  # (server, workload) -> [(rps, cpu, p50, p99)] per round
        plan = [(w, [s for s in servers if WORKLOADS[w][0] in s.ports]) for w in a.workloads]
        for w, group in plan:
            for s in group:  # warm-up, not measured
                measure(s, w, max(a.requests // 5, 5000), work)
        for r in range(a.rounds):
            for w, group in plan:
                k = r % len(group)
                for s in group[k:] + group[:k]:
                    rows.setdefault((s.name, w), []).append(measure(s, w, a.requests, work))
            log(f"round {r + 1} of {a.rounds} done (load {open('/proc/loadavg').read().strip()})")
        report(a, plan, rows)
    finally:
        for s in servers:
            s.stop()
        shutil.rmtree(work, ignore_errors=True)


def report(a, plan, rows):
    print(f"{a.rounds} rounds of {a.requests} calls per server and workload"
          f"{', pinned' if a.pin else ''}; medians, ratios turnstile / peer taken within each "
          f"round (range in brackets).\n")
    print("| workload | server | calls/s | CPU µs/call | p50 µs | p99 µs "
          "| calls/s vs peer | CPU/call vs peer |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for w, group in plan:
        # The peer: the first server of the group that is not turnstile.
        peer = next((s.name for s in group if not s.name.startswith("turnstile")), None)
        for s in group:
            got = rows[(s.name, w)]
            med = [statistics.median(g[i] for g in got) for i in range(4)]
            ratio = cpu_ratio = "-"
            if peer and s.name.startswith("turnstile"):
                theirs = rows[(peer, w)]
                rs = [m[0] / p[0] for m, p in zip(got, theirs)]
                cs = [m[1] / p[1] for m, p in zip(got, theirs) if p[1] > 0]
                ratio = f"{statistics.median(rs):.2f} ({min(rs):.2f}-{max(rs):.2f})"
                if cs:
                    cpu_ratio = f"{statistics.median(cs):.2f} ({min(cs):.2f}-{max(cs):.2f})"
            print(f"| {w} | {s.name} | {med[0]:.0f} | {med[1]:.2f} | {med[2]:.0f} | "
                  f"{med[3]:.0f} | {ratio} | {cpu_ratio} |")


if __name__ == "__main__":
    main()
