#!/usr/bin/env python3
"""The model behind examples/envoy/envoy-budgets.yaml, for docs/algorithms-and-queues.md's
walk-through: every call takes 1.5 s and answers with what it "used", in every header the
filter's reports read (x-input-tokens, x-output-tokens, x-total-tokens), so each hold a check
made is released by its report and nothing is left to expire.

    python3 examples/envoy/budgets-upstream.py            # on 127.0.0.1:5678
    python3 examples/envoy/budgets-upstream.py --port 5679 --input 300 --output 400 --delay 1.5

Standard library only. One thread per call, so ten concurrent calls all wait 1.5 s together.
"""

import argparse
import http.server
import time


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=5678)
    p.add_argument("--input", type=int, default=300, help="x-input-tokens of every answer")
    p.add_argument("--output", type=int, default=400, help="x-output-tokens of every answer")
    p.add_argument("--delay", type=float, default=1.5, help="seconds each call takes")
    args = p.parse_args()

    class Model(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def answer(self):
            time.sleep(args.delay)
            body = b"ok\n"
            self.send_response(200)
            self.send_header("x-input-tokens", str(args.input))
            self.send_header("x-output-tokens", str(args.output))
            self.send_header("x-total-tokens", str(args.input + args.output))
            self.send_header("content-type", "text/plain")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = answer

        def log_message(self, *_):
            pass

    server = http.server.ThreadingHTTPServer((args.host, args.port), Model)
    print(f"budgets upstream on {args.host}:{server.server_port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
