#!/usr/bin/env python3
"""Config size against load time, memory, start, reload, wildcard matching, and calls during a
reload, for one or more binaries side by side.

One domain of tenants, each `key: tenant, value: tN` with a limit and one child
(`key: path`) with a limit, as a SaaS with a limit per customer writes it: a
tenant is two descriptors. Every tenant has the same two limits (a plan), but the
last; with --distinct, no two tenants' limits are alike. For each size (in descriptors) and each binary given,
in turn:

  check      `turnstile check`: wall time and peak RSS (getrusage of the child)
  start      `turnstile serve`: spawn to the readiness line
  load peak  serve's peak RSS (VmHWM) once ready: the load's peak
  steady     serve's RSS once ready and settled, less that of the same binary on a
             one-tenant config, per descriptor
  reload     the file edited (the last tenant's limit changed) until /json answers
             with the new limit, polled every 10 ms (the file is polled every
             TURNSTILE_RELOAD_INTERVAL_MS, 1 s by default: up to 1 s of it); then
             the peak RSS (VmHWM) the reload reached, over the empty process, per
             descriptor

xDS (--xds path/to/examples/xds_serve): each size again, the config pushed by an ADS
server as one RateLimitConfig (Envoy Gateway's way): start is the spawn to the first
config live, reload a second push until /json answers with its limit; the "check"
column shows the resource's size in bytes. Per descriptor, less the same binary served one
tenant over xDS (the xDS client's own connection and buffers are not the config's).

Servers run with MIMALLOC_PURGE_DELAY=0 (freed memory goes back to the system at
once) unless --purge-delay says otherwise, so RSS shows what is held.

Wildcards (--wildcards N, 2000 by default, 0: off): one key with N patterns
`value: p0000-*` ... in file order; ShouldRateLimit calls whose value matches the
first and the last pattern, h2load -c 10 -m 10, alternated on one server for
--rounds rounds of --seconds each; calls/s (median) and last / first.

Latency (--latency): at the largest size, ShouldRateLimit calls (h2load, one
connection, one stream at a time) while the config is reloaded four times,
against the same run with no reload: p50 / p99 / max.

Usage:
  flock /work/bench.lock python3 benches/load/config_load.py \\
      [--bins /path/a/turnstile,target/release/turnstile] \\
      [--sizes 1000,10000,100000,400000] [--wildcards 2000] [--latency] \\
      [--xds target/release/examples/xds_serve]
Needs: python3, h2load (nghttp2-client) for the calls.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(__file__))
from make_body import encode_request, grpc_frame  # noqa: E402

PURGE = {"MIMALLOC_PURGE_DELAY": "0"}
# A RateLimitConfig of 100 000 descriptors is about 3 MB: under gRPC's 4 MB default, which the
# reference keeps too (XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES unset); bigger sizes need it raised.
XDS_ENV = {"XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES": str(64 << 20)}


# --distinct: every tenant's two limits differ from every other's (no two lists alike).
DISTINCT = False


def saas(tenants: int, last_rpu: int) -> str:
    out = ["domain: saas\ndescriptors:\n"]
    for i in range(tenants):
        rpu = last_rpu if i == tenants - 1 else (1000 + i if DISTINCT else 100)
        child = 10 + i if DISTINCT else 10
        out.append(
            f"  - key: tenant\n    value: t{i}\n"
            f"    rate_limit: {{unit: minute, requests_per_unit: {rpu}}}\n"
            "    descriptors:\n      - key: path\n"
            f"        rate_limit: {{unit: second, requests_per_unit: {child}}}\n"
        )
    return "".join(out)


def wildcards(n: int) -> str:
    out = ["domain: wild\ndescriptors:\n"]
    for i in range(n):
        out.append(
            f"  - key: path\n    value: p{i:04d}-*\n"
            "    rate_limit: {unit: second, requests_per_unit: 1000000000}\n"
        )
    return "".join(out)


def check(binary: str, path: str):
    """Wall time and peak RSS of `turnstile check`, in a child of its own (wait4's rusage)."""
    t = time.monotonic()
    p = subprocess.Popen([binary, "check", "--config", path], stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, env=dict(PURGE))
    _, status, usage = os.wait4(p.pid, 0)
    wall = time.monotonic() - t
    if status != 0:
        sys.exit(f"check failed: {p.stderr.read().decode()[-500:]}")
    return wall, usage.ru_maxrss * 1024


class Server:
    def __init__(self, binary: str, config: str = None, env: dict = None):
        """Serves `config`, or with no config what `env` says (xDS)."""
        env = {
            "DEBUG_HOST": "127.0.0.1", "DEBUG_PORT": "0", "PROMETHEUS_ADDR": "127.0.0.1:0",
            "LOG_LEVEL": "warn", **PURGE, **(env or {}),
        }
        t = time.monotonic()
        where = ["--config", config] if config else []
        self.p = subprocess.Popen(
            [binary, "serve", *where,
             "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, text=True)
        for line in self.p.stdout:
            if line.startswith("turnstile: listening"):
                break
        self.start = time.monotonic() - t
        fields = dict(f.split("=", 1) for f in line.split()[2:] if "=" in f)
        self.grpc, self.http = fields["grpc"], fields["http"]
        threading.Thread(target=lambda: [None for _ in self.p.stdout], daemon=True).start()

    def status(self, field: str) -> int:
        with open(f"/proc/{self.p.pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
        return 0

    def rss(self) -> int:
        return self.status("VmRSS")

    def peak(self) -> int:
        return self.status("VmHWM")

    def settled_rss(self) -> int:
        """RSS once it stops falling (the allocator returning what the load freed)."""
        last = self.rss()
        for _ in range(20):
            time.sleep(0.25)
            now = self.rss()
            if now >= last:
                return now
            last = now
        return last

    def limit_of(self, tenant: str):
        body = ('{"domain":"saas","descriptors":[{"entries":[{"key":"tenant","value":"%s"}]}]}'
                % tenant).encode()
        try:
            with urllib.request.urlopen(f"http://{self.http}/json", body, timeout=5) as r:
                return json.load(r)["statuses"][0]["currentLimit"]["requestsPerUnit"]
        except Exception:
            return None

    def stop(self):
        self.p.terminate()
        self.p.wait()


def reload_time(srv: Server, path: str, tenants: int, rpu: int) -> float:
    with open(path, "w") as f:
        f.write(saas(tenants, rpu))
    t = time.monotonic()
    while srv.limit_of(f"t{tenants - 1}") != rpu:
        if time.monotonic() - t > 600:
            return float("inf")
        time.sleep(0.01)
    return time.monotonic() - t


class Ads:
    """examples/xds_serve.rs: an ADS server with `tenants` tenants; `push(rpu)` sends a new
    version with the last tenant's limit at `rpu`."""

    def __init__(self, example: str, tenants: int):
        self.p = subprocess.Popen([example, str(tenants)], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)
        line = self.p.stdout.readline()
        if not line.startswith("xds_serve: listening"):
            sys.exit(f"xds_serve did not start: {line!r}")
        self.addr = line.split()[2]
        self.bytes = int(line.split("bytes=")[1])

    def env(self) -> dict:
        return {"CONFIG_TYPE": "GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL": self.addr,
                "CONFIG_GRPC_XDS_NODE_ID": "bench", **XDS_ENV}

    def push(self, rpu: int):
        self.p.stdin.write(f"{rpu}\n")
        self.p.stdin.flush()

    def stop(self):
        self.p.stdin.close()
        self.p.wait()


def until_limit(srv: Server, tenant: str, rpu: int) -> float:
    t = time.monotonic()
    while srv.limit_of(tenant) != rpu:
        if time.monotonic() - t > 600:
            return float("inf")
        time.sleep(0.01)
    return time.monotonic() - t


def xds_empty(binary: str, example: str) -> int:
    """The settled RSS of `binary` served one tenant over xDS: the xDS client's own fixed cost
    (its connection, its buffers) is not the config's."""
    ads = Ads(example, 1)
    srv = Server(binary, env=ads.env())
    until_limit(srv, "t0", 7)
    rss = srv.settled_rss()
    srv.stop()
    ads.stop()
    return rss


def xds_row(binary: str, example: str, n: int, base: int, i: int):
    """The same columns as the YAML rows, the config pushed over xDS: ready is the first
    config live, the reload a second push; `base` is the binary's one-tenant xDS process."""
    tenants = n // 2
    ads = Ads(example, tenants)
    t = time.monotonic()
    srv = Server(binary, env=ads.env())
    until_limit(srv, f"t{tenants - 1}", 7)
    ready = time.monotonic() - t
    peak = srv.peak()
    steady = srv.settled_rss()
    ads.push(9)
    rl = until_limit(srv, f"t{tenants - 1}", 9)
    reload_peak = srv.peak()
    print(f"{n:>11} {str(i) + ' xds':>6} {ads.bytes / 1e6:>7.1f}M {'':>9} {ready:>8.2f} "
          f"{peak / 1e6:>8.1f} {(peak - base) / n:>9.0f} {steady / 1e6:>10.1f} "
          f"{(steady - base) / n:>11.0f} {rl:>9.2f} {(reload_peak - base) / n:>16.0f}",
          flush=True)
    srv.stop()
    ads.stop()


def h2load(srv: Server, body_path: str, seconds: float, clients: int, streams: int,
           log: str = None):
    cmd = ["h2load", "-c", str(clients), "-m", str(streams), "-D", str(seconds),
           "-d", body_path, "-H", "content-type: application/grpc", "-H", "te: trailers",
           f"http://{srv.grpc}/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"]
    if log:
        cmd[1:1] = ["--log-file", log]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)


def calls_per_s(out: str) -> float:
    # "finished in 5.00s, 123456.78 req/s, ..."; and every call must have been a success.
    rate = None
    for line in out.splitlines():
        if line.startswith("finished in"):
            rate = float(line.split(",")[1].split()[0])
        if line.startswith("requests:"):
            f = line.split()
            failed, errored = int(f[f.index("failed,") - 1]), int(f[f.index("errored,") - 1])
            if failed or errored:
                sys.exit(f"h2load: calls failed: {line}")
    return rate


def h2load_latency(srv: Server, body_path: str, seconds: float, during=None):
    log = body_path + ".log"
    if os.path.exists(log):
        os.remove(log)  # h2load appends to its log
    p = h2load(srv, body_path, seconds, 1, 1, log)
    if during:
        during()
    p.communicate()
    lat = []
    with open(log) as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 3:
                lat.append(int(parts[2]) / 1000.0)  # µs -> ms
    lat.sort()
    if not lat:
        return None
    q = lambda x: lat[min(len(lat) - 1, int(x * len(lat)))]
    return len(lat), q(0.5), q(0.99), lat[-1]


def wildcard_rates(binary: str, work: str, n: int, rounds: int, seconds: float):
    path = os.path.join(work, f"wild-{n}.yaml")
    with open(path, "w") as f:
        f.write(wildcards(n))
    bodies = {}
    for name, value in (("first", "p0000-x"), ("last", f"p{n - 1:04d}-x")):
        bodies[name] = os.path.join(work, f"wild-{name}.bin")
        with open(bodies[name], "wb") as f:
            f.write(grpc_frame(encode_request("wild", [[("path", value)]])))
    srv = Server(binary, path)
    rates = {"first": [], "last": []}
    for r in range(rounds):
        order = ("first", "last") if r % 2 == 0 else ("last", "first")
        for name in order:
            out, _ = h2load(srv, bodies[name], seconds, 10, 10).communicate()
            rates[name].append(calls_per_s(out))
    srv.stop()
    return statistics.median(rates["first"]), statistics.median(rates["last"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bins", default="target/release/turnstile",
                    help="comma-separated binaries, measured in turn at each size")
    ap.add_argument("--bin", help="one binary (same as --bins with one)")
    ap.add_argument("--sizes", default="1000,10000,100000,400000")
    ap.add_argument("--wildcards", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--seconds", type=float, default=4)
    ap.add_argument("--latency", action="store_true")
    ap.add_argument("--xds", metavar="XDS_SERVE",
                    help="also push each size over xDS, from this build of examples/xds_serve.rs")
    ap.add_argument("--purge-delay", help="MIMALLOC_PURGE_DELAY for the servers (default 0)")
    ap.add_argument("--distinct", action="store_true",
                    help="YAML rows with every tenant's limits distinct (xDS rows keep the shape)")
    a = ap.parse_args()
    global DISTINCT
    DISTINCT = a.distinct
    if a.purge_delay is not None:
        PURGE["MIMALLOC_PURGE_DELAY"] = a.purge_delay
    bins = [a.bin] if a.bin else a.bins.split(",")
    work = tempfile.mkdtemp(prefix="config-load-")
    empty = os.path.join(work, "empty.yaml")
    with open(empty, "w") as f:
        f.write(saas(1, 100))
    base_rss = {}
    for b in bins:
        srv = Server(b, empty)
        base_rss[b] = srv.settled_rss()
        srv.stop()
        print(f"{b}: empty process {base_rss[b] / 1e6:.1f} MB")
    xds_base = {}
    for b in bins if a.xds else []:
        xds_base[b] = xds_empty(b, a.xds)
        print(f"{b}: empty process over xDS {xds_base[b] / 1e6:.1f} MB")
    print(f"{'descriptors':>11} {'binary':>6} {'check s':>8} {'check MB':>9} {'start s':>8} "
          f"{'peak MB':>8} {'peak B/d':>9} {'steady MB':>10} {'steady B/d':>11} "
          f"{'reload s':>9} {'reload peak B/d':>16}")
    sizes = [int(x) for x in a.sizes.split(",")]
    for n in sizes:
        tenants = n // 2
        for i, b in enumerate(bins):
            path = os.path.join(work, f"saas-{n}-{i}", "saas.yaml")
            os.makedirs(os.path.dirname(path))
            with open(path, "w") as f:
                f.write(saas(tenants, 7))
            wall, check_peak = check(b, path)
            srv = Server(b, path)
            assert srv.limit_of(f"t{tenants - 1}") == 7
            peak = srv.peak()
            steady = srv.settled_rss()
            rl = reload_time(srv, path, tenants, 9)
            reload_peak = srv.peak()
            base = base_rss[b]
            print(f"{n:>11} {i:>6} {wall:>8.2f} {check_peak / 1e6:>9.1f} {srv.start:>8.2f} "
                  f"{peak / 1e6:>8.1f} {(peak - base) / n:>9.0f} {steady / 1e6:>10.1f} "
                  f"{(steady - base) / n:>11.0f} {rl:>9.2f} {(reload_peak - base) / n:>16.0f}",
                  flush=True)
            if a.xds:
                xds_row(b, a.xds, n, xds_base[b], i)
            if a.latency and n == sizes[-1] and shutil.which("h2load"):
                body = os.path.join(work, "t0.bin")
                with open(body, "wb") as f:
                    f.write(grpc_frame(encode_request("saas", [[("tenant", "t0"),
                                                                 ("path", "/x")]])))
                quiet = h2load_latency(srv, body, 8)

                def reloads():
                    for k in range(4):
                        time.sleep(1)
                        reload_time(srv, path, tenants, 20 + k)
                busy = h2load_latency(srv, body, 8, reloads)
                print(f"  calls at {n} descriptors, binary {i}: (calls, p50 ms, p99 ms, max ms)")
                print(f"    no reload:     {quiet}")
                print(f"    four reloads:  {busy}", flush=True)
            srv.stop()
            shutil.rmtree(os.path.dirname(path))
    if a.wildcards and shutil.which("h2load"):
        print(f"wildcards: {a.wildcards} patterns on one key, h2load -c 10 -m 10, "
              f"{a.rounds} x {a.seconds} s each, median calls/s")
        print(f"{'binary':>6} {'first':>10} {'last':>10} {'last/first':>11}")
        for i, b in enumerate(bins):
            first, last = wildcard_rates(b, work, a.wildcards, a.rounds, a.seconds)
            print(f"{i:>6} {first:>10.0f} {last:>10.0f} {last / first:>11.2f}", flush=True)
    shutil.rmtree(work)


if __name__ == "__main__":
    main()
