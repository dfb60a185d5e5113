#!/usr/bin/env bash
# One word a concept (src/lib.rs, "Words"): a word retired for another, listed with what
# replaced it in scripts/retired-words.txt, must not come back into src/.
set -euo pipefail
cd "$(dirname "$0")/.."
list=scripts/retired-words.txt
keep="$(awk -F'\t' '$1 == "keep" { print $2 }' "$list" | paste -sd'|')"
found=0
while IFS=$'\t' read -r word instead; do
  if hits="$(grep -rnE -- "$word" src | grep -vE -- "${keep:-^$}")"; then
    printf '%s\n' "$hits" >&2
    echo "check-words: a retired word is back in src/ ($word): use $instead" >&2
    found=1
  fi
done < <(awk -F'\t' '!/^#/ && NF >= 2 && $1 != "keep"' "$list")
exit "$found"
