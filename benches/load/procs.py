"""What the load scripts need of processes and ports: a free port, a process's CPU time, one
ShouldRateLimit call."""

import os
import socket
import subprocess

METHOD = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"

# Clock ticks per second, the unit of /proc/PID/stat's times.
HZ = os.sysconf("SC_CLK_TCK")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_ticks(pid):
    """utime + stime of the whole process, in clock ticks."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def should_rate_limit(port, body_file):
    """overall_code of one ShouldRateLimit call (1 OK, 2 OVER_LIMIT), None when not an answer."""
    out = subprocess.run(["curl", "-s", "--http2-prior-knowledge", "-H",
                          "content-type: application/grpc", "-H", "te: trailers",
                          "--data-binary", f"@{body_file}", f"http://127.0.0.1:{port}{METHOD}"],
                         capture_output=True, check=True).stdout
    # A gRPC frame (5 bytes), then field 1 (overall_code) as a varint: 0x08, code.
    return out[6] if len(out) > 6 and out[5] == 0x08 else None
