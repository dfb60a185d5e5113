#!/usr/bin/env python3
"""Durable counters: how long a start takes on a state dir of N live keys, and what they cost.

For each N: writes a state dir of N keys (examples/make_state), starts the release binary on
it and times the start until the readiness line (the state is read before any port serves),
reads the first sync after it (every key written as a new snapshot), its RSS then and at its
peak since the start (VmHWM: the read and the snapshot included), and the state's bytes on
disk; then SIGTERM and the time to exit.

  cargo build --release --examples
  benches/load/restart.py [--keys 100000 1000000] [--bin target/release/turnstile]
"""

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

CONFIG = "benches/load/bench.conf.yaml"


def metric(port, name):
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
    m = re.search(rf"^{name} (\S+)$", text, re.M)
    return float(m.group(1)) if m else None


def rss_mb(pid, field="VmRSS"):
    """Resident memory now (VmRSS), or its peak since the start (VmHWM), in MB."""
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(rf"{field}:\s+(\d+)", f.read()).group(1)) / 1024


def one(bin_, make_state, n, work):
    state = os.path.join(work, f"state-{n}")
    subprocess.run([make_state, state, str(n)], check=True)
    snap = os.path.getsize(os.path.join(state, "counters.1.snap"))
    # turnstile's own series (turnstile_state_*) are on the HTTP port's /metrics; the
    # Prometheus port serves the reference's.
    mport = 19092
    env = dict(os.environ, TURNSTILE_STATE_DIR=state, PROMETHEUS_ADDR="127.0.0.1:19090",
               DEBUG_PORT="0", TURNSTILE_MAX_KEYS=str(max(4_000_000, 2 * n)))
    t0 = time.monotonic()
    p = subprocess.Popen([bin_, "serve", "--config", CONFIG, "--grpc-addr", "127.0.0.1:0",
                          "--http-addr", f"127.0.0.1:{mport}"], stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, env=env, text=True)
    line = p.stdout.readline()
    ready = time.monotonic() - t0
    if "listening" not in line:
        sys.exit(f"restart.py: no readiness line: {line!r}")
    # The first sync writes every key as a new snapshot.
    deadline = time.time() + 60
    while (metric(mport, "turnstile_state_snapshots_total") or 0) < 1 and time.time() < deadline:
        time.sleep(0.05)
    restored = metric(mport, "turnstile_state_restored_keys")
    first_sync = metric(mport, "turnstile_state_last_sync_seconds")
    disk = metric(mport, "turnstile_state_disk_bytes")
    rss, peak = rss_mb(p.pid), rss_mb(p.pid, "VmHWM")
    t1 = time.monotonic()
    p.send_signal(signal.SIGTERM)
    p.wait()
    stop = time.monotonic() - t1
    shutil.rmtree(state, ignore_errors=True)
    return dict(n=n, restored=int(restored), ready=ready, first_sync=first_sync, rss=rss, peak=peak,
                snap_mb=snap / 1e6, disk_mb=disk / 1e6, stop=stop)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--keys", nargs="+", type=int, default=[100_000, 1_000_000])
    ap.add_argument("--bin", default="target/release/turnstile")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
    make_state = os.path.join(os.path.dirname(a.bin), "examples", "make_state")
    work = tempfile.mkdtemp(prefix="turnstile-restart.")
    try:
        print("| keys | read back | start to ready (median of %d) | first snapshot written | "
              "RSS after | peak RSS | state on disk | SIGTERM to exit |" % a.rounds)
        print("|---:|---:|---:|---:|---:|---:|---:|---:|")
        for n in a.keys:
            runs = sorted((one(a.bin, make_state, n, work) for _ in range(a.rounds)),
                          key=lambda r: r["ready"])
            r = runs[len(runs) // 2]
            print(f"| {n} | {r['restored']} | {r['ready']:.2f} s | {r['first_sync']:.2f} s | "
                  f"{r['rss']:.0f} MB | {r['peak']:.0f} MB | {r['disk_mb']:.1f} MB | {r['stop']:.2f} s |")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
