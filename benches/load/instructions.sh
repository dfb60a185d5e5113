#!/usr/bin/env bash
# Instructions per call, counted by callgrind: turnstile against the do-nothing server, one
# server at a time, the same h2load bodies as run.sh. turnstile-redis-wN counts the exact
# Redis path against a fresh redis-server (a free port, no persistence, as run.sh starts it);
# only turnstile's process is counted. A count, not a time: it does not move
# when the machine is busy, so it can compare two builds while other work runs; run.sh's
# req/s and CPU per call remain the measure of speed, on a quiet machine.
#
#   BIN_DIR=DIR       take turnstile and noop_rls from DIR (default target/release)
#   SERVERS="..."     noop turnstile-wN turnstile-redis-wN (default noop turnstile-w1)
#   MIXES="..."       one multi over report report_over (default one multi)
#   CALLS=N           calls counted per server and mix (default 20000), after 2000 not counted
#   PROFILE=DIR       also keep each run's callgrind file in DIR, for callgrind_annotate
#
# Prints one line per server and mix: instructions per call (whole process, every thread),
# the ratio to noop's for the same mix when noop ran first, and to turnstile-w1's when that
# ran first.
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
# A fresh redis-server per run (start_redis, stop_redis), as run.sh starts it.
# shellcheck source=benches/load/redis.sh
source "$(dirname "$0")/redis.sh"

cleanup() {
    [[ -n $pid ]] && kill "$pid" 2>/dev/null
    [[ -n $redis_pid ]] && kill "$redis_pid" 2>/dev/null
    wait 2>/dev/null; rm -rf "$work"
}
trap cleanup EXIT
python3 benches/load/make_body.py "$work/bodies"

calls() {  # ADDR MIX N
    h2load -n "$3" -c 10 -m 10 -d "$work/bodies/$2.bin" \
        -H 'content-type: application/grpc' -H 'te: trailers' "http://$1$METHOD" >"$work/h2load.out"
    grep -q " $3 succeeded" "$work/h2load.out" || { cat "$work/h2load.out" >&2; exit 1; }
}

declare -A floor mem
for server in $SERVERS; do
    for mix in $MIXES; do
        out="$work/$server.$mix"
        # Debug and Prometheus ports of its own: a taken one stops the start, and another run may
        # hold 6070 or 9090.
        env=(DEBUG_HOST=127.0.0.1 DEBUG_PORT=0 PROMETHEUS_ADDR=127.0.0.1:0)
        case $server in
            noop) cmd=("$NOOP_BIN" 127.0.0.1:0) ;;
            turnstile-w*) cmd=("$BIN_DIR/turnstile" serve --config benches/load/bench.conf.yaml
                --grpc-addr 127.0.0.1:0 --http-addr 127.0.0.1:0 --workers "${server#turnstile-w}") ;;
            turnstile-redis-w*)
                start_redis || exit 1
                # Under callgrind a round trip takes far longer than the 50 ms default deadline
                # allows; a breaker that opened would count fallback decisions instead.
                env+=(BACKEND_TYPE=redis "REDIS_URL=127.0.0.1:$redis_port" TURNSTILE_LOCAL_FIRST=false
                    TURNSTILE_REDIS_DEADLINE_MS=2000)
                cmd=("$BIN_DIR/turnstile" serve --config benches/load/bench.conf.yaml
                --grpc-addr 127.0.0.1:0 --http-addr 127.0.0.1:0 --workers "${server##*-w}") ;;
            *) echo "unknown server $server" >&2; exit 1 ;;
        esac
        env "${env[@]}" valgrind --tool=callgrind --callgrind-out-file="$out.cg" --dump-instr=no \
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
        stop_redis
        if grep -q "Redis round trip" "$out.stderr"; then
            echo "$server $mix: some Redis round trips failed or were slow; the count includes fallback decisions" >&2
        fi
        # The dump after zeroing holds exactly the counted calls (plus idle timers).
        dump=$(ls -t "$out".cg* | grep -v '\.cg$' | head -n1)
        ir=$(sed -n 's/^summary: *\([0-9]*\).*/\1/p' "$dump")
        per=$((ir / CALLS))
        if [[ $server == noop ]]; then floor[$mix]=$per; fi
        if [[ $server == turnstile-w1 ]]; then mem[$mix]=$per; fi
        ratio=- vs_mem=-
        if [[ -n ${floor[$mix]:-} ]]; then ratio=$(awk -v a="$per" -v b="${floor[$mix]}" 'BEGIN { printf "%.3f", a / b }'); fi
        if [[ $server != turnstile-w1 && -n ${mem[$mix]:-} ]]; then
            vs_mem=$(awk -v a="$per" -v b="${mem[$mix]}" 'BEGIN { printf "%.3f", a / b }')
        fi
        printf '%-20s %-6s %8d instructions/call  vs noop %s  vs turnstile-w1 %s\n' \
            "$server" "$mix" "$per" "$ratio" "$vs_mem"
        if [[ -n ${PROFILE:-} ]]; then mkdir -p "$PROFILE"; cp "$dump" "$PROFILE/$server.$mix.callgrind"; fi
    done
done
