#!/usr/bin/env bash
# Instructions per call, counted by callgrind: turnstile against the do-nothing server, one
# server at a time, the same h2load bodies as run.sh. A count, not a time: it does not move
# when the machine is busy, so it can compare two builds while other work runs; run.sh's
# req/s and CPU per call remain the measure of speed, on a quiet machine.
#
#   BIN_DIR=DIR       take turnstile and noop_rls from DIR (default target/release)
#   SERVERS="..."     noop turnstile-w1 (default both)
#   MIXES="..."       one multi over report report_over (default one multi)
#   CALLS=N           calls counted per server and mix (default 20000), after 2000 not counted
#   PROFILE=DIR       also keep each run's callgrind file in DIR, for callgrind_annotate
#
# Prints one line per server and mix: instructions per call (whole process, every thread),
# and the ratio to noop's for the same mix when noop ran first.
set -euo pipefail
cd "$(dirname "$0")/../.."

BIN_DIR=${BIN_DIR:-target/release}

NOOP_BIN=$BIN_DIR/noop_rls
[[ -x $NOOP_BIN ]] || NOOP_BIN=$BIN_DIR/examples/noop_rls
SERVERS=${SERVERS:-"noop turnstile-w1"}
MIXES=${MIXES:-"one multi"}
CALLS=${CALLS:-20000}
WARM=2000
METHOD=/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit

for tool in valgrind callgrind_control h2load; do
    command -v "$tool" >/dev/null || { echo "instructions.sh: $tool not found (apt-get install valgrind nghttp2-client)" >&2; exit 1; }
done

mkdir -p target; work=$(mktemp -d "$PWD/target/instructions.XXXXXX")
pid=""
cleanup() { [[ -n $pid ]] && kill "$pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
python3 benches/load/make_body.py "$work/bodies"

calls() {  # ADDR MIX N
    h2load -n "$3" -c 10 -m 10 -d "$work/bodies/$2.bin" \
        -H 'content-type: application/grpc' -H 'te: trailers' "http://$1$METHOD" >"$work/h2load.out"
    grep -q " $3 succeeded" "$work/h2load.out" || { cat "$work/h2load.out" >&2; exit 1; }
}

declare -A floor
for server in $SERVERS; do
    for mix in $MIXES; do
        out="$work/$server.$mix"
        case $server in
            noop) cmd=("$NOOP_BIN" 127.0.0.1:0) ;;
            turnstile-w*) cmd=("$BIN_DIR/turnstile" serve --config benches/load/bench.conf.yaml
                --grpc-addr 127.0.0.1:0 --http-addr 127.0.0.1:0 --workers "${server#turnstile-w}") ;;
            *) echo "unknown server $server" >&2; exit 1 ;;
        esac
        valgrind --tool=callgrind --callgrind-out-file="$out.cg" --dump-instr=no \
            "${cmd[@]}" >"$out.stdout" 2>"$out.stderr" &
        pid=$!
        addr=""
        for _ in $(seq 600); do
            addr=$(sed -n 's/.*listening grpc=\([^ ]*\).*/\1/p' "$out.stdout" | head -n1)
            [[ -n $addr ]] && break
            sleep 0.1
        done
        [[ -n $addr ]] || { echo "$server did not listen; stderr:" >&2; cat "$out.stderr" >&2; exit 1; }
        calls "$addr" "$mix" "$WARM"
        callgrind_control -z "$pid" >/dev/null 2>&1
        calls "$addr" "$mix" "$CALLS"
        callgrind_control -d "$server.$mix" "$pid" >/dev/null 2>&1
        kill "$pid"; wait "$pid" 2>/dev/null || true; pid=""
        # The dump after zeroing holds exactly the counted calls (plus idle timers).
        dump=$(ls -t "$out".cg* | grep -v '\.cg$' | head -n1)
        ir=$(sed -n 's/^summary: *\([0-9]*\).*/\1/p' "$dump")
        per=$((ir / CALLS))
        if [[ $server == noop ]]; then floor[$mix]=$per; fi
        ratio=-
        if [[ -n ${floor[$mix]:-} ]]; then ratio=$(awk -v a="$per" -v b="${floor[$mix]}" 'BEGIN { printf "%.3f", a / b }'); fi
        printf '%-14s %-6s %8d instructions/call  vs noop %s\n' "$server" "$mix" "$per" "$ratio"
        if [[ -n ${PROFILE:-} ]]; then mkdir -p "$PROFILE"; cp "$dump" "$PROFILE/$server.$mix.callgrind"; fi
    done
done
