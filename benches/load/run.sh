#!/usr/bin/env bash
# Load harness: turnstile vs. a do-nothing RateLimitService (examples/noop_rls).
#
#   benches/load/run.sh
#
# Builds release binaries, then for each server (noop, turnstile --workers 1,
# turnstile --workers 2) and each request mix (one, multi, over, distinct):
#   1. a short gRPC-level check with loadgen (what did the server answer?),
#   2. a warm-up run (not measured),
#   3. the measured run, with server CPU read from /proc/PID/stat around it.
# Prints a markdown table, writes it to benches/load/last-run.md, and replaces
# the "Latest results" section of BENCHMARKS.md (between the markers).
#
# Environment:
#   REQUESTS=200000   requests per measured run
#   DURATION=         seconds per measured run instead of REQUESTS (optional)
#   WARMUP=           warm-up requests (default REQUESTS/10, at least 5000)
#   CONNS=10 STREAMS=10   connections, and concurrent streams per connection
#   SERVERS="noop turnstile-w1 turnstile-w2"
#                     also: turnstile-redis-wN (counters in a local redis-server
#                     the harness starts on a free port, the exact path) and
#                     turnstile-lf-wN (the same Redis, TURNSTILE_LOCAL_FIRST=true: each
#                     replica decides in memory and syncs every 100 ms)
#   MIXES="one multi over distinct"
#   SKIP_BUILD=1      use the binaries already in target/release
#   BIN_DIR=DIR       take turnstile, noop_rls and loadgen from DIR instead of
#                     target/release (implies SKIP_BUILD=1). With a target
#                     directory shared by several checkouts, copy the binaries
#                     right after building and point BIN_DIR at the copies:
#                     another checkout's build may replace target/release/*.
#   UPDATE_DOC=0      do not touch BENCHMARKS.md
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cd "$root"

REQUESTS=${REQUESTS:-200000}
DURATION=${DURATION:-}
WARMUP=${WARMUP:-$(( REQUESTS / 10 > 5000 ? REQUESTS / 10 : 5000 ))}
CONNS=${CONNS:-10}
STREAMS=${STREAMS:-10}
SERVERS=${SERVERS:-"noop turnstile-w1 turnstile-w2"}
MIXES=${MIXES:-"one multi over distinct"}
SKIP_BUILD=${SKIP_BUILD:-0}
BIN_DIR=${BIN_DIR:-}
if [[ -n "$BIN_DIR" ]]; then
    SKIP_BUILD=1
    TURNSTILE_BIN=$BIN_DIR/turnstile NOOP_BIN=$BIN_DIR/noop_rls LOADGEN=$BIN_DIR/loadgen
else
    TURNSTILE_BIN=target/release/turnstile NOOP_BIN=target/release/examples/noop_rls
    LOADGEN=target/release/examples/loadgen
fi
UPDATE_DOC=${UPDATE_DOC:-1}
# How big each measured run is, for the log and the report.
if [[ -n "$DURATION" ]]; then size="DURATION=${DURATION}s"; else size="REQUESTS=$REQUESTS"; fi

CONFIG=benches/load/bench.conf.yaml
METHOD=/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit
CLK_TCK=$(getconf CLK_TCK)

command -v h2load >/dev/null || { echo "run.sh: h2load not found (apt-get install nghttp2-client)" >&2; exit 1; }

work=$(mktemp -d -t turnstile-load.XXXXXX)
server_pid=""
client_pid=""

# Kill whatever server and load client are running when we exit, however we
# exit: a leftover server would skew the next benchmark on a small machine.
cleanup() {
    if [[ -n "$client_pid" ]]; then kill "$client_pid" 2>/dev/null || true; fi
    if [[ -n "$server_pid" ]] && kill -0 "$server_pid" 2>/dev/null; then
        kill "$server_pid" 2>/dev/null || true
        wait "$server_pid" 2>/dev/null || true
    fi
    if [[ -n "$redis_pid" ]]; then kill "$redis_pid" 2>/dev/null || true; fi
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

log() { echo "run.sh: $*" >&2; }

# ---------------------------------------------------------------- build
if [[ "$SKIP_BUILD" != 1 ]]; then
    # One cargo invocation, so the three targets share one dependency build.
    log "building release binaries"
    cargo build --release --bin turnstile --example noop_rls --example loadgen
fi

python3 benches/load/make_body.py "$work/bodies"

# ---------------------------------------------------------------- servers
# start_server NAME: start it in the background, wait for its "listening
# grpc=IP:PORT" line, set $server_pid and $server_addr.
start_server() {
    local name=$1 out="$work/$1.stdout" err="$work/$1.stderr"
    case "$name" in
        noop) "$NOOP_BIN" 127.0.0.1:0 >"$out" 2>"$err" & ;;
        turnstile-w*)
            "$TURNSTILE_BIN" serve --config "$CONFIG" \
                --grpc-addr 127.0.0.1:0 --http-addr 127.0.0.1:0 \
                --workers "${name#turnstile-w}" >"$out" 2>"$err" & ;;
        turnstile-redis-w*|turnstile-lf-w*)
            start_redis || return 1
            local lf=false
            if [[ "$name" == turnstile-lf-* ]]; then lf=true; fi
            BACKEND_TYPE=redis REDIS_URL="127.0.0.1:$redis_port" TURNSTILE_LOCAL_FIRST=$lf \
                "$TURNSTILE_BIN" serve --config "$CONFIG" \
                --grpc-addr 127.0.0.1:0 --http-addr 127.0.0.1:0 \
                --workers "${name##*-w}" >"$out" 2>"$err" & ;;
        *) log "unknown server $name"; return 1 ;;
    esac
    server_pid=$!
    server_addr=""
    # Readiness is the stdout line, not a sleep: the port is only known then.
    for _ in $(seq 100); do
        server_addr=$(sed -n 's/.*listening grpc=\([^ ]*\).*/\1/p' "$out" | head -n1)
        [[ -n "$server_addr" ]] && return 0
        if ! kill -0 "$server_pid" 2>/dev/null; then
            log "$name exited before listening; stderr:"; cat "$err" >&2
            server_pid=""; return 1
        fi
        sleep 0.1
    done
    log "$name printed no 'listening grpc=' line within 10s; stderr:"; cat "$err" >&2
    return 1
}

# The Redis servers' redis-server (start_redis, stop_redis); its CPU is read around each run
# too (REDIS_CPU_US per call in the table).
# shellcheck source=benches/load/redis.sh
source "$(dirname "$0")/redis.sh"

stop_server() {
    kill "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
    server_pid=""
    stop_redis
}

# utime + stime of the whole process (all threads), in clock ticks. Field 2
# (comm) may contain spaces, so cut everything up to the last ')' first; then
# utime and stime are the 12th and 13th remaining fields (14 and 15 overall).
cpu_ticks() {
    local stat
    stat=$(<"/proc/$1/stat")
    stat=${stat##*) }
    # shellcheck disable=SC2086
    set -- $stat
    echo $(( ${12} + ${13} ))
}

# ---------------------------------------------------------------- drivers
# A driver runs one load, writes the client's output to a file, and sets
# R_RPS R_P50 R_P99 (µs) R_DONE (completed requests) R_FAILED.

# Run a load client in the background and wait for it. bash runs a trap only
# once the foreground command ends, but `wait` returns as soon as a trapped
# signal arrives: so Ctrl-C or kill stops a long run at once, and cleanup()
# kills the client.
run_client() {  # OUTFILE COMMAND...
    local out=$1; shift
    snapshot 0
    "$@" >"$out" &
    client_pid=$!
    wait "$client_pid"
    client_pid=""
    snapshot 1
}

# CPU accounting around each client run, for the measured run's figures:
# SERVER_TICKS (server process), and OTHER_PCT: the share of the machine's
# CPU (all cores x wall time) used by anything other than the server and the
# load client, i.e. by other users of a shared machine. A high OTHER_PCT
# means that run's req/s and latencies are not trustworthy.
busy_ticks() {  # user+nice+system+irq+softirq+steal of all CPUs
    local _ user nice system idle iowait irq softirq steal
    read -r _ user nice system idle iowait irq softirq steal _ < /proc/stat
    echo $(( user + nice + system + irq + softirq + steal ))
}
child_ticks() {  # cutime + cstime of this shell: its waited-for children, the client included
    local stat
    stat=$(<"/proc/$$/stat")
    stat=${stat##*) }
    # shellcheck disable=SC2086
    set -- $stat
    echo $(( ${14} + ${15} ))
}
snapshot() {  # 0 before a client run, 1 after
    local srv=0
    local rds=0
    if [[ -n "$server_pid" ]]; then srv=$(cpu_ticks "$server_pid"); fi
    local rcmd=0 rbytes=0
    if [[ -n "$redis_pid" ]]; then
        rds=$(cpu_ticks "$redis_pid")
        read -r rcmd rbytes < <(redis-cli -p "$redis_port" info stats | tr -d '\r' | awk -F: '
            $1 == "total_commands_processed" { c = $2 }
            $1 == "total_net_input_bytes" || $1 == "total_net_output_bytes" { b += $2 }
            END { print c + 0, b + 0 }')
    fi
    eval "snap_rcmd$1=$rcmd snap_rbytes$1=$rbytes snap_rds$1=$rds snap_srv$1=$srv snap_busy$1=$(busy_ticks) snap_child$1=$(child_ticks) snap_ns$1=$(date +%s%N)"
    if [[ $1 == 1 ]]; then
        SERVER_TICKS=$(( snap_srv1 - snap_srv0 ))
        REDIS_TICKS=$(( snap_rds1 - snap_rds0 ))
        # Less the one INFO call of the first snapshot.
        REDIS_CMDS=$(( snap_rcmd1 - snap_rcmd0 - 1 ))
        REDIS_BYTES=$(( snap_rbytes1 - snap_rbytes0 ))
        OTHER_PCT=$(awk -v busy=$((snap_busy1 - snap_busy0)) -v srv="$((SERVER_TICKS + REDIS_TICKS))" \
            -v cli=$((snap_child1 - snap_child0)) -v ns=$((snap_ns1 - snap_ns0)) \
            -v hz="$CLK_TCK" -v cpus="$(nproc)" 'BEGIN {
                o = (busy - srv - cli) / hz / (ns / 1e9) / cpus * 100
                printf "%.0f", o < 0 ? 0 : o }')
    fi
}

# h2load sends the same body on every request; its --log-file has one line
# per request (start, status, µs to end of response), from which we take
# exact nearest-rank p50/p99 (its summary only has min/max/mean/sd).
h2load_run() {  # ADDR MIX REQUESTS|""
    local addr=$1 mix=$2 n=$3 count_args out="$work/h2load.out" logf="$work/h2load.log"
    if [[ -n "$DURATION" && -z "$n" ]]; then count_args=(-D "$DURATION"); else count_args=(-n "${n:-$REQUESTS}"); fi
    run_client "$out" h2load "${count_args[@]}" -c "$CONNS" -m "$STREAMS" \
        -d "$work/bodies/$mix.bin" \
        -H 'content-type: application/grpc' -H 'te: trailers' \
        --log-file="$logf" "http://$addr$METHOD"
    R_RPS=$(sed -n 's/^finished in .*, \([0-9]*\)\.[0-9]* req\/s.*/\1/p' "$out")
    R_DONE=$(sed -n 's/^requests: .* \([0-9]*\) succeeded.*/\1/p' "$out")
    R_FAILED=$(sed -n 's/^requests: .* \([0-9]*\) failed, \([0-9]*\) errored.*/\1 \2/p' "$out" |
        awk '{ print $1 + $2 }')
    # Status -1 marks a failed stream: leave those out of the latencies.
    read -r R_P50 R_P99 < <(awk -F'\t' '$2 != -1 { print $3 }' "$logf" | sort -n | awk '
        { v[NR] = $1 }
        END {
            if (NR == 0) { print 0, 0; exit }
            r50 = int(NR * 0.50); if (r50 < NR * 0.50) r50++; if (r50 < 1) r50 = 1
            r99 = int(NR * 0.99); if (r99 < NR * 0.99) r99++; if (r99 < 1) r99 = 1
            print v[r50], v[r99]
        }')
}

# loadgen prints one "loadgen: key=value ..." line; field NAME FILE picks one.
field() { sed -n "s/.* $1=\([^ ]*\).*/\1/p" "$2"; }

# loadgen drives "distinct" (a fresh api_key value per request, which h2load
# cannot do) with the same connection/stream layout.
loadgen_run() {  # ADDR MIX REQUESTS|""
    local addr=$1 mix=$2 n=$3 count_args out="$work/loadgen.out"
    if [[ -n "$DURATION" && -z "$n" ]]; then count_args=(--duration "$DURATION"); else count_args=(-n "${n:-$REQUESTS}"); fi
    run_client "$out" "$LOADGEN" --addr "$addr" --mix "$mix" -c "$CONNS" -m "$STREAMS" "${count_args[@]}"
    R_RPS=$(field rps "$out"); R_P50=$(field p50_us "$out"); R_P99=$(field p99_us "$out")
    R_DONE=$(( $(field ok "$out") + $(field over "$out") ))
    R_FAILED=$(( $(field errors "$out") + $(field other_code "$out") ))
}

# What the server answers for this mix, checked at the gRPC level (h2load
# only sees HTTP 200, which a gRPC error also is). Sets ANSWER.
check_answer() {  # ADDR MIX
    local n=2000 out="$work/answer.out" ok over other errors
    run_client "$out" "$LOADGEN" --addr "$1" --mix "$2" -n "$n" -c 1 -m 10 2>"$work/answer.err"
    ok=$(field ok "$out"); over=$(field over "$out")
    other=$(field other_code "$out"); errors=$(field errors "$out")
    if (( errors > 0 )); then log "gRPC errors for mix $2: $(cat "$work/answer.err")"; fi
    if (( ok == n )); then ANSWER=OK
    elif (( over == n )); then ANSWER=OVER_LIMIT
    else ANSWER="ok=$ok over=$over other=$other err=$errors"
    fi
}

# ---------------------------------------------------------------- main loop
declare -A base_rps mem_rps
rows=()
skipped=()
for server in $SERVERS; do
    if ! start_server "$server"; then
        log "skipping $server"
        skipped+=("$server")
        stop_server
        continue
    fi
    log "$server listening on $server_addr (pid $server_pid)"
    for mix in $MIXES; do
        if [[ "$mix" == distinct ]]; then driver=loadgen; else driver=h2load; fi
        check_answer "$server_addr" "$mix"
        log "$server/$mix: warm-up ($WARMUP requests)"
        "${driver}_run" "$server_addr" "$mix" "$WARMUP"
        log "$server/$mix: measuring ($size)"
        "${driver}_run" "$server_addr" "$mix" ""
        rps=$R_RPS p50=$R_P50 p99=$R_P99 other=$OTHER_PCT
        cpu_us=$(awk -v d="$SERVER_TICKS" -v hz="$CLK_TCK" -v n="$R_DONE" \
            'BEGIN { printf "%.1f", n ? d / hz * 1e6 / n : 0 }')
        redis_us=$(awk -v d="$REDIS_TICKS" -v hz="$CLK_TCK" -v n="$R_DONE" \
            'BEGIN { printf "%.1f", n ? d / hz * 1e6 / n : 0 }')
        redis_io=$(awk -v c="$REDIS_CMDS" -v b="$REDIS_BYTES" -v n="$R_DONE" -v r="${redis_pid:-}" \
            'BEGIN { if (r == "" || !n) print "-"; else printf "%.2f / %.0f", c / n, b / n }')
        if [[ "$server" == turnstile-w1 ]]; then mem_rps[$mix]=$rps; fi
        if [[ "$server" == turnstile-*-w* && -n "${mem_rps[$mix]:-}" ]]; then
            vs_mem=$(awk -v a="$rps" -v b="${mem_rps[$mix]}" 'BEGIN { printf "%.2f", a / b }')
        else
            vs_mem="-"
        fi
        ans=$ANSWER
        if (( R_FAILED > 0 )); then ans="$ans, $R_FAILED failed"; fi
        if [[ "$server" == noop ]]; then base_rps[$mix]=$rps; fi
        if [[ -n "${base_rps[$mix]:-}" ]]; then
            ratio=$(awk -v a="$rps" -v b="${base_rps[$mix]}" 'BEGIN { printf "%.2f", a / b }')
        else
            ratio="n/a"
        fi
        rows+=("| $server | $mix | $driver | $ans | $rps | $p50 | $p99 | $cpu_us | $redis_us | $redis_io | $ratio | $vs_mem | $other |")
        log "$server/$mix: $rps req/s, p50 ${p50}µs, p99 ${p99}µs, ${cpu_us} CPU µs/call, other CPU ${other}%"
    done
    stop_server
done

# ---------------------------------------------------------------- report
cpu_model=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n1)
if rev=$(git rev-parse --short HEAD 2>/dev/null); then
    git diff --quiet HEAD -- src Cargo.toml Cargo.lock || rev="$rev + uncommitted changes"
else
    rev="no commit yet"
fi
table=$(
    echo "Run $(date -u '+%Y-%m-%d %H:%M UTC') on $(nproc) CPU(s), ${cpu_model:-unknown CPU}, $rev;" \
         "$size, $CONNS connections x $STREAMS streams, warm-up $WARMUP requests${BIN_DIR:+; binaries from $BIN_DIR}."
    echo
    echo "| server | mix | driver | answer | req/s | p50 µs | p99 µs | server CPU µs/call | redis CPU µs/call | redis cmds / bytes per call | req/s vs noop | req/s vs turnstile-w1 | other CPU % |"
    echo "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    printf '%s\n' "${rows[@]}"
)
echo "$table" > benches/load/last-run.md
echo
echo "$table"

# A partial run (a server failed to start) must not replace the published
# numbers, and must fail the command.
if (( ${#skipped[@]} > 0 )); then
    log "not updating BENCHMARKS.md: could not start ${skipped[*]}"
    exit 1
fi

if [[ "$UPDATE_DOC" == 1 && -f BENCHMARKS.md ]] && grep -q '<!-- results:begin -->' BENCHMARKS.md; then
    # Replace only what lies between the markers; the rest is hand-written.
    python3 - BENCHMARKS.md benches/load/last-run.md <<'EOF'
import re, sys
doc, table = open(sys.argv[1]).read(), open(sys.argv[2]).read().rstrip("\n")
new = re.sub(r"(<!-- results:begin -->\n).*?(<!-- results:end -->)",
             lambda m: m.group(1) + table + "\n" + m.group(2), doc, flags=re.S)
open(sys.argv[1], "w").write(new)
EOF
    log "updated the Latest results section of BENCHMARKS.md"
fi
