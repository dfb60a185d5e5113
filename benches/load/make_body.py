#!/usr/bin/env python3
"""Write gRPC request bodies (one RateLimitRequest each) for h2load -d.

A gRPC message on the wire is a 5-byte frame header -- one flag byte (0x00:
not compressed) and the big-endian u32 message length -- followed by the
protobuf bytes. The RateLimitRequest is encoded by hand here so the harness
needs nothing but python3; only the fields we use are written:

  RateLimitRequest     1: domain (string)
                       2: descriptors (repeated RateLimitDescriptor)
                       3: hits_addend (uint32, omitted when 0)
  RateLimitDescriptor  1: entries (repeated Entry)
                       3: hits_addend (google.protobuf.UInt64Value)
  Entry                1: key (string)   2: value (string)
  UInt64Value          1: value (uint64)

Usage:
  make_body.py OUT_DIR             write one.bin, multi.bin, over.bin, report.bin,
                                   report_over.bin
  make_body.py OUT_DIR MIX [...]   write only the named mixes
  make_body.py --dump MIX          print the body as hex (for eyeballing)

The "distinct" mix (a fresh key on every request) cannot be a body file:
h2load sends the same -d file for every request. run.sh drives that mix with
examples/loadgen.rs instead; see BENCHMARKS.md.
"""

import os
import struct
import sys

DOMAIN = "bench"

# Each mix is a list of descriptors; each descriptor a list of (key, value), or a
# dict with those "entries" and the descriptor's own "hits_addend" (usage Envoy
# reports after the response, counted in full).
MIXES = {
    # One descriptor, one entry: the cheapest real request.
    "one": [[("api_key", "k1")]],
    # Four descriptors, one of them nested (api_key -> path): what a typical
    # Envoy route with several rate_limits actions sends.
    "multi": [
        [("api_key", "k1")],
        [("api_key", "k1"), ("path", "/a")],
        [("remote_address", "10.0.0.1")],
        [("tenant", "t1")],
    ],
    # Matches `blocked: yes` in bench.conf.yaml, limit 0: always OVER_LIMIT.
    "over": [[("blocked", "yes")]],
    # Usage reported after the response: "one" and "over" with the
    # descriptor's own hits_addend.
    "report": [{"entries": [("api_key", "k1")], "hits_addend": 1}],
    "report_over": [{"entries": [("blocked", "yes")], "hits_addend": 1}],
}


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def field_bytes(field: int, payload: bytes) -> bytes:
    """Length-delimited field (wire type 2): strings and sub-messages."""
    return varint(field << 3 | 2) + varint(len(payload)) + payload


def field_varint(field: int, value: int) -> bytes:
    """Varint field (wire type 0)."""
    return varint(field << 3 | 0) + varint(value)


def encode_request(domain, descriptors, hits_addend=0) -> bytes:
    msg = field_bytes(1, domain.encode())
    for d in descriptors:
        entries, own_hits = (d["entries"], d["hits_addend"]) if isinstance(d, dict) else (d, None)
        desc = b"".join(
            field_bytes(1, field_bytes(1, k.encode()) + field_bytes(2, v.encode()))
            for k, v in entries
        )
        if own_hits is not None:
            desc += field_bytes(3, field_varint(1, own_hits))
        msg += field_bytes(2, desc)
    if hits_addend:  # proto3: a zero scalar is not written
        msg += field_varint(3, hits_addend)
    return msg


def grpc_frame(message: bytes) -> bytes:
    return b"\x00" + struct.pack(">I", len(message)) + message


def body(mix: str) -> bytes:
    if mix not in MIXES:
        sys.exit(f"unknown mix {mix!r}; known: {', '.join(MIXES)}")
    return grpc_frame(encode_request(DOMAIN, MIXES[mix]))


def main(argv):
    if len(argv) == 3 and argv[1] == "--dump":
        print(body(argv[2]).hex())
        return
    if len(argv) < 2 or argv[1].startswith("-"):
        sys.exit(__doc__)
    out_dir = argv[1]
    os.makedirs(out_dir, exist_ok=True)
    for mix in argv[2:] or list(MIXES):
        path = os.path.join(out_dir, f"{mix}.bin")
        with open(path, "wb") as f:
            f.write(body(mix))


if __name__ == "__main__":
    main(sys.argv)
