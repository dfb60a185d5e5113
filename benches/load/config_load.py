#!/usr/bin/env python3
"""Config size against load time, memory, start, reload, and calls during a reload.

One domain of tenants, each `key: tenant, value: tN` with a limit and one child
(`key: path`) with a limit, as a SaaS with a limit per customer writes it: a
tenant is two descriptors. For each size (in descriptors) it measures, with the
binary given:

  check      `turnstile check` wall time and peak RSS (getrusage of the child)
  start      `turnstile serve`: spawn to the readiness line
  memory     serve's RSS after start, less that of the same binary on an empty
             domain, per descriptor
  reload     the file edited (the last tenant's limit changed) until /json
             answers with the new limit, polled every 10 ms (the file is polled
             every TURNSTILE_RELOAD_INTERVAL_MS, 1 s by default: up to 1 s of it)

and, at the largest size, the latency of ShouldRateLimit calls (h2load, one
connection, one stream at a time) while the config is reloaded four times,
against the same run with no reload: p50 / p99 / max.

Usage:
  python3 benches/load/config_load.py [--bin target/release/turnstile]
                                      [--sizes 1000,10000,100000]
Needs: python3, h2load (nghttp2-client) for the latency part.
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(__file__))
from make_body import encode_request, grpc_frame  # noqa: E402


def saas(tenants: int, last_rpu: int) -> str:
    out = ["domain: saas\ndescriptors:\n"]
    for i in range(tenants):
        rpu = last_rpu if i == tenants - 1 else 100
        out.append(
            f"  - key: tenant\n    value: t{i}\n"
            f"    rate_limit: {{unit: minute, requests_per_unit: {rpu}}}\n"
            "    descriptors:\n      - key: path\n"
            "        rate_limit: {unit: second, requests_per_unit: 10}\n"
        )
    return "".join(out)


def check(binary: str, path: str):
    """Wall time and peak RSS of `turnstile check`, in a child of its own (wait4's rusage)."""
    t = time.monotonic()
    p = subprocess.Popen([binary, "check", "--config", path], stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, env={})
    _, status, usage = os.wait4(p.pid, 0)
    wall = time.monotonic() - t
    if status != 0:
        sys.exit(f"check failed: {p.stderr.read().decode()[-500:]}")
    return wall, usage.ru_maxrss * 1024


class Server:
    def __init__(self, binary: str, config: str):
        env = {
            "DEBUG_HOST": "127.0.0.1", "DEBUG_PORT": "0", "PROMETHEUS_ADDR": "127.0.0.1:0",
            "LOG_LEVEL": "warn",
        }
        t = time.monotonic()
        self.p = subprocess.Popen(
            [binary, "serve", "--config", config,
             "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, text=True)
        for line in self.p.stdout:
            if line.startswith("turnstile: listening"):
                break
        self.start = time.monotonic() - t
        fields = dict(f.split("=", 1) for f in line.split()[2:] if "=" in f)
        self.grpc, self.http = fields["grpc"], fields["http"]
        threading.Thread(target=lambda: [None for _ in self.p.stdout], daemon=True).start()

    def rss(self) -> int:
        with open(f"/proc/{self.p.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        return 0

    def limit_of(self, tenant: str):
        body = ('{"domain":"saas","descriptors":[{"entries":[{"key":"tenant","value":"%s"}]}]}'
                % tenant).encode()
        try:
            with urllib.request.urlopen(f"http://{self.http}/json", body, timeout=5) as r:
                import json
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


def h2load_latency(srv: Server, body_path: str, seconds: float, during=None):
    log = body_path + ".log"
    cmd = ["h2load", "-c", "1", "-m", "1", "-D", str(seconds), "-d", body_path,
           "--log-file", log,
           "-H", "content-type: application/grpc", "-H", "te: trailers",
           f"http://{srv.grpc}/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"]
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if during:
        during()
    p.wait()
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/release/turnstile")
    ap.add_argument("--sizes", default="1000,10000,100000")
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="config-load-")
    empty = os.path.join(work, "empty.yaml")
    with open(empty, "w") as f:
        f.write(saas(1, 100))
    base = Server(a.bin, empty)
    time.sleep(0.5)
    base_rss = base.rss()
    base.stop()
    print(f"{'descriptors':>11} {'check s':>8} {'check MB':>9} {'start s':>8} "
          f"{'B/descr':>8} {'reload s':>9}")
    sizes = [int(x) for x in a.sizes.split(",")]
    for n in sizes:
        tenants = n // 2
        path = os.path.join(work, f"saas-{n}", "saas.yaml")
        os.makedirs(os.path.dirname(path))
        with open(path, "w") as f:
            f.write(saas(tenants, 7))
        wall, peak = check(a.bin, path)
        srv = Server(a.bin, path)
        assert srv.limit_of(f"t{tenants - 1}") == 7
        per = (srv.rss() - base_rss) / n
        rl = reload_time(srv, path, tenants, 9)
        print(f"{n:>11} {wall:>8.2f} {peak / 1e6:>9.1f} {srv.start:>8.2f} {per:>8.0f} {rl:>9.2f}")
        if n != sizes[-1]:
            srv.stop()
    if not shutil.which("h2load"):
        srv.stop()
    else:
        body = os.path.join(work, "t0.bin")
        with open(body, "wb") as f:
            f.write(grpc_frame(encode_request("saas", [[("tenant", "t0"), ("path", "/x")]])))
        quiet = h2load_latency(srv, body, 8)

        def reloads():
            for i in range(4):
                time.sleep(1)
                reload_time(srv, path, tenants, 20 + i)
        busy = h2load_latency(srv, body, 8, reloads)
        print(f"calls at {sizes[-1]} descriptors: (calls, p50 ms, p99 ms, max ms)")
        print(f"  no reload:          {quiet}")
        print(f"  four reloads:       {busy}")
        srv.stop()
    shutil.rmtree(work)


if __name__ == "__main__":
    main()
