#!/usr/bin/env bash
# Runs the shutdown tests (SIGTERM under load, and a slow reader at SIGTERM) ROUNDS times
# (default 30) and counts the rounds that lost an answer: a 1-in-20 failure shows up here.
#
#   bash scripts/shutdown-rounds.sh [ROUNDS]
#
# CI runs a few rounds (scripts/test.sh); run 30 by hand after touching shutdown.
set -uo pipefail
cd "$(dirname "$0")/.."
ROUNDS="${1:-30}"
cargo test --all-features --test it --no-run --quiet 2>/dev/null || {
    echo "shutdown-rounds: build failed" >&2; exit 1; }
failed=0
for i in $(seq "$ROUNDS"); do
    if out=$(cargo test --all-features --quiet --test it -- server::shutdown::under_load:: 2>&1); then
        echo "round $i: ok"
    else
        failed=$((failed + 1))
        echo "round $i: FAILED"
        echo "$out" | grep -E "lost|panicked|FAILED" | head -5
    fi
done
echo "shutdown-rounds: $failed of $ROUNDS rounds lost an answer"
[[ "$failed" == 0 ]]
