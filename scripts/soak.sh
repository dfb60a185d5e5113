#!/usr/bin/env bash
# Soak: sustained mixed load against the release binary for MINUTES (default 2), then checks.
#
#   bash scripts/soak.sh [MINUTES]
#   SOAK_SECONDS=45 SOAK_PROFILE=debug bash scripts/soak.sh   # what CI runs (scripts/test.sh)
#
# Builds release once, starts turnstile on port 0 (in memory, config below), drives it with
# examples/soak_client.rs (normal traffic on a few keys, a key flood with a new value on every
# call, bad requests, and sampled keys on a fixed schedule), samples the server's RSS from /proc
# every SAMPLE_EVERY seconds, then checks:
#   - RSS is bounded: after warm-up it stops growing (the mean of the last third of the samples
#     is at most the mean of the middle third plus RSS_TOLERANCE_PCT percent and RSS_SLACK_KB).
#     The slack allows one step, such as a shard's key table doubling or a new allocator arena;
#     a leak of the key flood (thousands of new keys a second) grows by megabytes every few
#     seconds, far past it;
#   - no call failed except bad requests as expected (INVALID_ARGUMENT, the oversized message
#     included) and RESOURCE_EXHAUSTED sheds (the client's `soak-check` lines);
#   - exact counts on the sampled keys (the client's `soak-check` lines);
#   - SIGTERM stops the server with exit 0.
# Exit code 0 when every check passes. Figures are printed as `soak-…` lines.
set -euo pipefail
cd "$(dirname "$0")/.."

MINUTES="${1:-2}"
# SOAK_SECONDS overrides MINUTES; SOAK_PROFILE=debug uses the debug build `cargo test` made.
SOAK_SECONDS="${SOAK_SECONDS:-$((MINUTES * 60))}"
SOAK_PROFILE="${SOAK_PROFILE:-release}"
SAMPLE_EVERY="${SAMPLE_EVERY:-5}"
RSS_TOLERANCE_PCT="${RSS_TOLERANCE_PCT:-10}"
RSS_SLACK_KB="${RSS_SLACK_KB:-4096}"
LANES="${SOAK_LANES:-8}"

WORK="$(mktemp -d)"
SERVER_PID=""
cleanup() {
    if [[ -n "$SERVER_PID" ]] && kill -0 "$SERVER_PID" 2>/dev/null; then
        kill -KILL "$SERVER_PID" 2>/dev/null || true
    fi
    rm -rf "$WORK"
}
trap cleanup EXIT

# Copied at once: another checkout building into the same CARGO_TARGET_DIR may overwrite the
# shared target/release/ names later.
PROFILE_FLAG=(--release)
[[ "$SOAK_PROFILE" == debug ]] && PROFILE_FLAG=()
BUILT="$(cargo build "${PROFILE_FLAG[@]}" --quiet --bin turnstile --example soak_client --message-format=json |
    sed -n 's/.*"executable":"\([^"]*\)".*/\1/p')"
for exe in $BUILT; do cp "$exe" "$WORK/"; done
BIN="$WORK/turnstile"
CLIENT="$WORK/soak_client"
[[ -x "$BIN" && -x "$CLIENT" ]] || { echo "soak: the build gave no executables" >&2; exit 1; }

cat >"$WORK/soak.yaml" <<'EOF'
domain: soak
descriptors:
  - key: normal
    rate_limit: {unit: second, requests_per_unit: 1000}
  - key: flood
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: minute
    rate_limit: {unit: minute, requests_per_unit: 600}
  - key: second
    rate_limit: {unit: second, requests_per_unit: 20}
EOF

LOG_LEVEL=warn "$BIN" serve --config "$WORK/soak.yaml" \
    --grpc-addr 127.0.0.1:0 --http-addr 127.0.0.1:0 >"$WORK/server.out" 2>"$WORK/server.err" &
SERVER_PID=$!
for _ in $(seq 100); do
    grep -q '^turnstile: listening' "$WORK/server.out" && break
    kill -0 "$SERVER_PID" 2>/dev/null || { cat "$WORK/server.err"; exit 1; }
    sleep 0.1
done
GRPC="$(sed -n 's/^turnstile: listening grpc=\([^ ]*\) .*/\1/p' "$WORK/server.out")"
[[ -n "$GRPC" ]] || { echo "soak: server did not start" >&2; cat "$WORK/server.err"; exit 1; }
echo "soak: server pid=$SERVER_PID grpc=$GRPC seconds=$SOAK_SECONDS profile=$SOAK_PROFILE"

rss_kb() { awk '/^VmRSS:/ {print $2}' "/proc/$SERVER_PID/status"; }
rss_kb >"$WORK/rss"
SECONDS_TOTAL=$SOAK_SECONDS
"$CLIENT" --addr "$GRPC" --seconds "$SECONDS_TOTAL" --lanes "$LANES" >"$WORK/client.out" &
CLIENT_PID=$!
while kill -0 "$CLIENT_PID" 2>/dev/null; do
    sleep "$SAMPLE_EVERY"
    kill -0 "$SERVER_PID" 2>/dev/null || { echo "soak: server died" >&2; cat "$WORK/server.err"; exit 1; }
    rss_kb >>"$WORK/rss"
done
CLIENT_OK=0
wait "$CLIENT_PID" || CLIENT_OK=$?
cat "$WORK/client.out"

# RSS: samples in KiB, one per line; warm-up is the first third.
RSS_OK=0
awk -v tol="$RSS_TOLERANCE_PCT" -v slack="$RSS_SLACK_KB" '
    { s[NR] = $1 }
    END {
        n = NR; a = int(n / 3); b = int(2 * n / 3)
        for (i = a + 1; i <= b; i++) { mid += s[i] } mid /= (b - a)
        for (i = b + 1; i <= n; i++) { last += s[i] } last /= (n - b)
        max = 0; for (i = 1; i <= n; i++) if (s[i] > max) max = s[i]
        line = ""; for (i = 1; i <= n; i++) line = line " " int(s[i] / 1024)
        printf "soak-rss: samples=%d start=%dKiB max=%dKiB middle_third_mean=%dKiB last_third_mean=%dKiB MiB:%s\n", n, s[1], max, mid, last, line
        ok = last <= mid * (1 + tol / 100) + slack
        printf "soak-check: %s RSS bounded: last third %+.1f%% against the middle third (tolerance %d%% + %dKiB)\n", ok ? "PASS" : "FAIL", (last - mid) * 100 / mid, tol, slack
        exit ok ? 0 : 1
    }' "$WORK/rss" || RSS_OK=1

STOP_OK=0
kill -TERM "$SERVER_PID"
if wait "$SERVER_PID"; then
    echo "soak-check: PASS SIGTERM: exit 0"
else
    STOP_OK=1
    echo "soak-check: FAIL SIGTERM: exit $?"
fi
SERVER_PID=""
grep -i 'panic\|error' "$WORK/server.err" | head -5 || true

if [[ $CLIENT_OK -ne 0 || $RSS_OK -ne 0 || $STOP_OK -ne 0 ]]; then
    echo "soak: FAILED"
    exit 1
fi
echo "soak: PASSED"
