#!/usr/bin/env bash
# One word a concept (docs/architecture.md, "Words"): a word retired for another, listed with what
# replaced it in scripts/retired-words.txt, must not come back, in the code nor in what speaks
# of it: src/, the docs, the tests, examples/, benches/, fuzz/, config/, these scripts, the
# README, SECURITY.md and the build files.
#
# Left out, each for a reason:
# - BENCHMARKS.md is a history: each run is written as it was measured then, in that day's words
#   and with that day's names (`--example backend_bench`); renaming in it would rewrite a record.
# - proto/ and vendor/ are upstream's text, as upstream wrote it.
# - scripts/retired-words.txt lists the retired words themselves.
# - Cargo.lock and package-lock.json: other crates' and packages' names, written by the tools.
# - what is built or fetched, never written here: any target/ (fuzz/target too), node_modules/,
#   benches/load/last-run.md (untracked, rewritten by every load run); and binary files (the
#   fuzz corpus's archives, the docs' images).
set -euo pipefail
cd "$(dirname "$0")/.."
list=scripts/retired-words.txt
places=(src docs tests examples benches fuzz config scripts .ci
  README.md SECURITY.md Cargo.toml build.rs Containerfile)
skip=(--exclude-dir=target --exclude-dir=node_modules --exclude=retired-words.txt
  --exclude=Cargo.lock --exclude=package-lock.json --exclude=last-run.md)
# A place that is gone has nothing to check (and grep would fail on it).
for p in "${!places[@]}"; do [ -e "${places[$p]}" ] || unset 'places[p]'; done
keep="$(awk -F'\t' '$1 == "keep" { print $2 }' "$list" | paste -sd'|')"
found=0
while IFS=$'\t' read -r word instead; do
  # grep: 0 found, 1 none, more is an error (a bad regex, an unreadable file), never a pass.
  status=0
  all="$(grep -rnIE "${skip[@]}" -- "$word" "${places[@]}")" || status=$?
  if [ "$status" -gt 1 ]; then
    echo "check-words: grep failed (status $status) on the retired word $word" >&2
    exit 2
  fi
  if [ -n "$all" ] && hits="$(printf '%s\n' "$all" | grep -vE -- "${keep:-^$}")"; then
    printf '%s\n' "$hits" >&2
    # Where: each top-level folder (with its /) or file that has a hit, in the order found.
    where="$(printf '%s\n' "$hits" | awk -F: '{ p = $1; sub(/\/.*/, "/", p) } !seen[p]++ { print p }' |
      paste -sd' ')"
    echo "check-words: a retired word is back in $where ($word): use $instead" >&2
    found=1
  fi
done < <(awk -F'\t' '!/^#/ && NF >= 2 && $1 != "keep"' "$list")
exit "$found"
