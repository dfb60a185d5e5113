#!/usr/bin/env bash
# Runs the full comparison (1 000 000 keys); output lands in results/.
set -euo pipefail
cd "$(dirname "$0")"
cargo build --release
for spec in "own 3" "redb 2" "fjall 1"; do
  set -- $spec
  echo "== $1 start $(date -u +%T) load: $(cut -d' ' -f1-3 /proc/loadavg)" >> results/run.log
  FJALL_DEBUG=1 ./target/release/state-formats --keys 1000000 --reps "$2" --churn-syncs 60 --dir bench-data "$1" \
    > "results/$1.md" 2> "results/$1.log"
  echo "== $1 end $(date -u +%T) load: $(cut -d' ' -f1-3 /proc/loadavg)" >> results/run.log
done
