#!/usr/bin/env python3
"""Limitador's workload: Kuadrant-shaped limits, N in one namespace, servers started as
limitador-operator starts them, side by side in paired rounds.

  benches/load/limitador.py --bins limitador=PATH [turnstile=PATH ...]
                            [--limits 1 10 100 1000] [--rounds N] [--seconds S] [--no-pin]

Every `--bins name=path` is a server. Each is reached through a symlink named
`limitador-server` (turnstile dispatches on its program name) and started with the operator's
argv, in its order (limitador-operator `pkg/limitador/k8s_objects.go`):

  limitador-server --http-port P --rls-port Q --metric-labels-default 'descriptors[1]' FILE memory

with ENVOY_RLS_HOST and HTTP_API_HOST set to 127.0.0.1 (Limitador's own environment defaults for
`--rls-ip` and `--http-ip`, so the argv stays the operator's and nothing listens beyond loopback).

For each N, FILE holds N limits as Kuadrant writes them (kuadrant-operator, one RateLimitPolicy
with N limits on one route):

  - name: l<i>
    namespace: ns/route
    max_value: 1000000000
    seconds: 60
    conditions: ['descriptors[0]["limit.l<i>__<8 hex>"] == "1"']
    variables: ['descriptors[0]["auth.identity.userid"]']

plus one limit of 3 an hour in a namespace of its own (`sanity`), so ns/route holds exactly N.
The request bodies are what the wasm-shim sends for the first limit (l0) and for the last
(l<N-1>): domain `ns/route`, descriptors[0] with the entry `limit.l<i>__<hex>` = "1" and the
entry keyed by the variable's text, `auth.identity.userid` = "alice".

Before measuring, each server must count: the sanity limit admits three calls and refuses the
fourth, the first and last bodies answer OK, and after the warm-up `GET /counters/ns%2Froute`
lists a counter for l0 and for l<N-1> (so the last body really matched the last limit). Then,
in each round, each (server, first|last) gets one `h2load -c 10 -m 10` run on `ShouldRateLimit`
(the order turning by one each round) of about S seconds (the call count is set from the
warm-up's rate). Per run: calls/s, server CPU per call (utime + stime from /proc/PID/stat
before and after), p50 and p99. Ratios are taken within each round: each server against the
first one given (`vs <first>`; calls/s and CPU a call), and each server's last limit against
its first (`last/first`). The report gives medians and their range.

Pinned by default as peers.py --pin pins: servers on CPU 1, h2load on CPU 0 (taskset);
`--no-pin` leaves both free. Run it under `flock /work/bench.lock` on a shared machine.
"""

import argparse
import hashlib
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
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_body  # noqa: E402
from procs import HZ, METHOD, cpu_ticks, free_port, should_rate_limit  # noqa: E402

NAMESPACE = "ns/route"
USER_VAR = "auth.identity.userid"
HIGH = 1_000_000_000
PIN_SERVER, PIN_CLIENT = [], []


def log(msg):
    print(f"limitador.py: {msg}", file=sys.stderr, flush=True)


def limit_key(i):
    """The entry key the wasm-shim sends for limit l<i>: limit.<name>__<8 hex>."""
    return f"limit.l{i}__{hashlib.sha256(f'ns/route/l{i}'.encode()).hexdigest()[:8]}"


def limits_yaml(n):
    out = []
    for i in range(n):
        out.append(f"""- name: l{i}
  namespace: {NAMESPACE}
  max_value: {HIGH}
  seconds: 60
  conditions:
  - 'descriptors[0]["{limit_key(i)}"] == "1"'
  variables:
  - 'descriptors[0]["{USER_VAR}"]'
""")
    out.append("""- name: sanity
  namespace: sanity
  max_value: 3
  seconds: 3600
  conditions:
  - 'descriptors[0]["limit.sanity__00000000"] == "1"'
  variables: []
""")
    return "".join(out)


def body(domain, entries):
    return make_body.grpc_frame(make_body.encode_request(domain, [entries]))


def wait_port(port, proc, what, err_path, seconds=30):
    end = time.time() + seconds
    while time.time() < end:
        if proc.poll() is not None:
            sys.exit(f"limitador.py: {what} exited (code {proc.returncode}):\n"
                     f"{open(err_path).read()}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.1)
    sys.exit(f"limitador.py: {what} not listening on {port}")


class Server:
    """One server, started through a symlink named limitador-server with the operator's argv."""

    def __init__(self, name, path, limits_file, work):
        self.name = name
        link_dir = os.path.join(work, "bin", name)
        os.makedirs(link_dir, exist_ok=True)
        link = os.path.join(link_dir, "limitador-server")
        if not os.path.lexists(link):
            os.symlink(os.path.abspath(path), link)
        self.http, self.grpc = free_port(), free_port()
        self.argv = [link, "--http-port", str(self.http), "--rls-port", str(self.grpc),
                     "--metric-labels-default", "descriptors[1]", limits_file, "memory"]
        tag = f"{name}.{os.path.basename(limits_file)}"
        self.err_path = os.path.join(work, f"{tag}.err")
        env = {**os.environ, "ENVOY_RLS_HOST": "127.0.0.1", "HTTP_API_HOST": "127.0.0.1",
               # turnstile's own debug and Prometheus ports, on ports the kernel picks: two
               # servers up at once would otherwise both ask for 6070 and 9090.
               "DEBUG_HOST": "127.0.0.1", "DEBUG_PORT": "0", "PROMETHEUS_ADDR": "127.0.0.1:0"}
        self.proc = subprocess.Popen(PIN_SERVER + self.argv, env=env,
                                     stdout=open(os.path.join(work, f"{tag}.out"), "w"),
                                     stderr=open(self.err_path, "w"))
        for port in (self.grpc, self.http):
            wait_port(port, self.proc, name, self.err_path)

    def ticks(self):
        return cpu_ticks(self.proc.pid)

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def counters(port, namespace):
    url = f"http://127.0.0.1:{port}/counters/{urllib.request.quote(namespace, safe='')}"
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.load(r)


def sanity(s, n, bodies):
    got = [should_rate_limit(s.grpc, bodies["sanity"]) for _ in range(4)]
    if got != [1, 1, 1, 2]:
        sys.exit(f"limitador.py: {s.name} does not count: the sanity limit of 3 answered {got}, "
                 "expected [1, 1, 1, 2]")
    for which in ("first", "last"):
        code = should_rate_limit(s.grpc, bodies[which])
        if code != 1:
            sys.exit(f"limitador.py: {s.name} at N={n} answered {code} to the {which} body")


def check_counted(s, n):
    names = {c.get("limit", {}).get("name") for c in counters(s.http, NAMESPACE)}
    want = {"l0", f"l{n - 1}"}
    if not want <= names:
        sys.exit(f"limitador.py: {s.name} at N={n}: /counters/{NAMESPACE} has {sorted(names)}, "
                 f"expected {sorted(want)} among them")


def h2load(port, body_file, n, work):
    logf = f"{work}/h2load.log"
    # h2load appends to its --log-file: start each run from an empty one, or the percentiles
    # pool every earlier run.
    if os.path.exists(logf):
        os.remove(logf)
    out = subprocess.run(
        PIN_CLIENT + ["h2load", "-n", str(n), "-c", "10", "-m", "10", "-d", body_file, "-H",
                      "content-type: application/grpc", "-H", "te: trailers",
                      f"--log-file={logf}", f"http://127.0.0.1:{port}{METHOD}"],
        capture_output=True, text=True, check=True).stdout
    if f" {n} succeeded" not in out:
        sys.exit(f"limitador.py: h2load against {port}:\n{out}")
    rps = float(re.search(r"finished in .*?, ([\d.]+) req/s", out).group(1))
    with open(logf) as f:
        lat = sorted(int(line.split("\t")[2]) for line in f if line.split("\t")[1] != "-1")
    return rps, lat[len(lat) // 2], lat[min(len(lat) - 1, int(len(lat) * 0.99))]


def measure(s, body_file, n, work):
    t0 = s.ticks()
    rps, p50, p99 = h2load(s.grpc, body_file, n, work)
    return rps, (s.ticks() - t0) / HZ * 1e6 / n, p50, p99


def run_n(a, n, work):
    limits_file = os.path.join(work, f"limits-{n}.yaml")
    with open(limits_file, "w") as f:
        f.write(limits_yaml(n))
    bodies = {}
    for which, i in (("first", 0), ("last", n - 1)):
        bodies[which] = os.path.join(work, f"body-{n}-{which}.bin")
        with open(bodies[which], "wb") as f:
            f.write(body(NAMESPACE, [(limit_key(i), "1"), (USER_VAR, "alice")]))
    bodies["sanity"] = os.path.join(work, "body-sanity.bin")
    with open(bodies["sanity"], "wb") as f:
        f.write(body("sanity", [("limit.sanity__00000000", "1")]))
    servers = []
    try:
        for name, path in a.bins:
            servers.append(Server(name, path, limits_file, work))
        calls = {}
        for s in servers:
            sanity(s, n, bodies)
            for which in ("first", "last"):
                # Warm-up, not measured; its rate sets the calls of a measured run.
                t = time.time()
                warm = 2000
                measure(s, bodies[which], warm, work)
                rate = warm / max(time.time() - t, 1e-3)
                calls[(s.name, which)] = max(2000, int(rate * a.seconds) // 100 * 100)
            check_counted(s, n)
        plan = [(s, which) for s in servers for which in ("first", "last")]
        rows = {}  # (server, which) -> [(rps, cpu, p50, p99)] per round
        for r in range(a.rounds):
            k = r % len(plan)
            for s, which in plan[k:] + plan[:k]:
                rows.setdefault((s.name, which), []).append(
                    measure(s, bodies[which], calls[(s.name, which)], work))
            log(f"N={n}: round {r + 1} of {a.rounds} done "
                f"(load {open('/proc/loadavg').read().strip()})")
        return rows
    finally:
        for s in servers:
            s.stop()


def ratio(xs, ys, i):
    rs = [x[i] / y[i] for x, y in zip(xs, ys) if y[i] > 0]
    if not rs:
        return "-"
    return f"{statistics.median(rs):.2f} ({min(rs):.2f}-{max(rs):.2f})"


def report(a, results):
    ref = a.bins[0][0]
    print(f"{a.rounds} rounds of about {a.seconds:g} s per server, N and limit; h2load -c 10 "
          f"-m 10 on ShouldRateLimit{', servers pinned to CPU 1, h2load to CPU 0' if a.pin else ''}"
          f"; medians, ratios taken within each round (range in brackets).\n")
    print(f"| limits | server | limit | calls/s | CPU µs/call | p50 µs | p99 µs "
          f"| calls/s vs {ref} | CPU/call vs {ref} | last/first calls/s |")
    print("|---:|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for n, rows in results:
        for name, _ in a.bins:
            for which in ("first", "last"):
                got = rows[(name, which)]
                med = [statistics.median(g[i] for g in got) for i in range(4)]
                vs = cpu_vs = "-"
                if name != ref:
                    vs = ratio(got, rows[(ref, which)], 0)
                    cpu_vs = ratio(got, rows[(ref, which)], 1)
                lf = ratio(rows[(name, "last")], rows[(name, "first")], 0) \
                    if which == "last" else "-"
                print(f"| {n} | {name} | {which} | {med[0]:.0f} | {med[1]:.1f} | {med[2]:.0f} "
                      f"| {med[3]:.0f} | {vs} | {cpu_vs} | {lf} |")


def parse_bin(text):
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"expected name=path, got {text!r}")
    if not os.path.isfile(path):
        raise argparse.ArgumentTypeError(f"{path}: no such file")
    return name, path


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bins", nargs="+", type=parse_bin, required=True,
                    help="name=path of each server; the first is the one the ratios are to")
    ap.add_argument("--limits", nargs="+", type=int, default=[1, 10, 100, 1000])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=5.0,
                    help="about how long each measured run lasts")
    ap.add_argument("--no-pin", dest="pin", action="store_false",
                    help="leave servers and h2load on any CPU")
    a = ap.parse_args()
    if len({name for name, _ in a.bins}) != len(a.bins):
        sys.exit("limitador.py: two --bins share a name")
    if any(n < 1 for n in a.limits):
        sys.exit("limitador.py: --limits must be at least 1")
    if a.pin:
        PIN_SERVER.extend(["taskset", "-c", "1"])
        PIN_CLIENT.extend(["taskset", "-c", "0"])
    for tool in ("h2load", "curl") + (("taskset",) if a.pin else ()):
        if not shutil.which(tool):
            sys.exit(f"limitador.py: {tool} not found")
    work = tempfile.mkdtemp(prefix="turnstile-limitador.")
    try:
        results = [(n, run_n(a, n, work)) for n in a.limits]
        report(a, results)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
