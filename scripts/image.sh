#!/usr/bin/env bash
# Builds turnstile's container image from this repository alone, on a Linux machine with glibc
# (Debian 12 here), cargo and podman; no base image is pulled from any registry.
#
#   scripts/image.sh                 build the image turnstile:<version> (and turnstile:latest)
#   IMAGE=registry.example.com/turnstile:1.2 scripts/image.sh     another name
#
# Steps:
#   1. `cargo auditable build --release --locked`: the release binary with its dependency list
#      (crate names and versions) embedded, which trivy, grype/syft and osv-scanner read from
#      the binary itself. cargo-auditable is installed from crates.io when missing (~20 s).
#   2. target/image/context/rootfs/: the binary (debug info stripped, symbols kept) as
#      /bin/turnstile, /bin/ratelimit and /bin/limitador-server; the shared libraries `ldd` lists; glibc's name service
#      pieces (nsswitch.conf, /etc/hosts, libnss_files/libnss_dns/libresolv where the build
#      machine's glibc still has them as separate libraries, i.e. before 2.34); the CA bundle;
#      /etc/passwd and /etc/group naming the non-root user 65532; the Debian package records of
#      the libraries (/var/lib/dpkg/status.d/, as distroless images have them) and os-release,
#      so scanners also see glibc's version; the libraries' copyright files.
#   3. `podman build -f Containerfile` on that context (FROM scratch: no shell, no package
#      manager), with the OCI labels, then `podman save` to target/image/turnstile.tar.
#
# Environment:
#   IMAGE           image name (default turnstile:<Cargo.toml version>; turnstile:latest too)
#   IMAGE_SOURCE    org.opencontainers.image.source (default: the git remote `origin`, else
#                   the repository's directory)
#   PODMAN          the container tool's command line (default: podman with the flags this
#                   kind of machine needs: vfs storage, runc, cgroupfs); `PODMAN=docker` builds
#                   the same image with Docker.
#   SKIP_CARGO=1    use the existing target/release/turnstile (it must have been built with
#                   `cargo auditable build --release`)
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"

log() { echo "image: $*"; }
die() { echo "image: error: $*" >&2; exit 1; }

# --- tools ---------------------------------------------------------------------------------
podman_default=(podman --storage-driver vfs --runtime runc --cgroup-manager cgroupfs)
if [ -n "${PODMAN:-}" ]; then
  read -r -a podman_cmd <<<"$PODMAN"
else
  podman_cmd=("${podman_default[@]}")
fi
if ! command -v "${podman_cmd[0]}" >/dev/null 2>&1; then
  if [ "${podman_cmd[0]}" = podman ] && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" -eq 0 ]; then
    log "installing podman and runc (apt)"
    DEBIAN_FRONTEND=noninteractive apt-get update -q </dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends podman runc </dev/null
  else
    die "${podman_cmd[0]} is not installed (Debian: apt-get install podman runc)"
  fi
fi
for tool in ldd objcopy objdump git; do
  command -v "$tool" >/dev/null 2>&1 || die "$tool is missing (Debian: apt-get install libc-bin binutils git)"
done

version="$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n1)"
[ -n "$version" ] || die "no version in Cargo.toml"
image="${IMAGE:-turnstile:$version}"
revision="$(git rev-parse HEAD 2>/dev/null || echo unknown)"
if [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]; then
  revision="$revision-dirty"
fi
source_url="${IMAGE_SOURCE:-$(git remote get-url origin 2>/dev/null || echo "file://$root")}"
license="$(sed -n 's/^license = "\(.*\)"$/\1/p' Cargo.toml | head -n1)"
created="$(date -u -d "@$(git log -1 --format=%ct 2>/dev/null || date +%s)" +%Y-%m-%dT%H:%M:%SZ)"

# --- 1. the binary -------------------------------------------------------------------------
bin="target/release/turnstile"
if [ "${SKIP_CARGO:-}" != 1 ]; then
  if ! cargo auditable --version >/dev/null 2>&1; then
    log "installing cargo-auditable (crates.io)"
    cargo install --locked cargo-auditable
  fi
  log "cargo auditable build --release"
  cargo auditable build --release --locked --bin turnstile
fi
[ -x "$bin" ] || die "$bin is missing (run without SKIP_CARGO=1)"
case "$(objdump -h "$bin")" in
  *.dep-v0*) ;;
  *) die "$bin has no embedded dependency list (.dep-v0): build it with cargo auditable" ;;
esac

# --- 2. the root file system ---------------------------------------------------------------
ctx="target/image/context"
rootfs="$ctx/rootfs"
rm -rf "$ctx"
mkdir -p "$rootfs"/{bin,etc/ssl/certs,tmp,var/lib/dpkg/status.d,usr/share/doc}
cp Containerfile "$ctx/Containerfile"

# Debug info out (a third of the size); symbol names stay, for backtraces.
objcopy --strip-debug "$bin" "$rootfs/bin/turnstile"
ln -s turnstile "$rootfs/bin/ratelimit"
ln -s turnstile "$rootfs/bin/limitador-server"

# A file, copied under its own path with symlinks resolved.
copy_file() {
  local src="$1"
  mkdir -p "$rootfs$(dirname "$src")"
  cp -L "$src" "$rootfs$src"
}

libs=()
while read -r lib; do
  if [ -n "$lib" ]; then libs+=("$lib"); fi
done < <(ldd "$bin" | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }')
[ "${#libs[@]}" -gt 0 ] || die "ldd lists no libraries for $bin (a static binary needs no such step)"
libdir="$(dirname "$(ldd "$bin" | awk '$1 ~ /^libc\.so/ { print $3 }')")"
# Name resolution: glibc loads these for `hosts: files dns` (built into libc.so.6 itself since
# glibc 2.34, where the files left are empty stubs: copied anyway, they are 14 KB each).
for nss in libnss_files.so.2 libnss_dns.so.2 libresolv.so.2; do
  if [ -e "$libdir/$nss" ]; then libs+=("$libdir/$nss"); fi
done
for lib in "${libs[@]}"; do
  copy_file "$lib"
done

cat >"$rootfs/etc/nsswitch.conf" <<'EOF'
passwd: files
group: files
hosts: files dns
EOF
# Container runtimes mount their own /etc/hosts and /etc/resolv.conf; these serve a bare run.
cat >"$rootfs/etc/hosts" <<'EOF'
127.0.0.1 localhost
::1 localhost ip6-localhost ip6-loopback
EOF
cat >"$rootfs/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/sbin/nologin
nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin
EOF
cat >"$rootfs/etc/group" <<'EOF'
root:x:0:
nonroot:x:65532:
EOF
chmod 1777 "$rootfs/tmp"

ca=/etc/ssl/certs/ca-certificates.crt
[ -s "$ca" ] || die "$ca is missing (Debian: apt-get install ca-certificates)"
cp -L "$ca" "$rootfs/etc/ssl/certs/ca-certificates.crt"

# What scanners read for the OS-level parts: which Debian package each library comes from, at
# which version (distroless's layout: one status file per package), and the release.
if command -v dpkg-query >/dev/null 2>&1; then
  pkgs=()
  for f in "${libs[@]}" "$ca"; do
    # dpkg knows a file by the path its package installed (/lib/... on a merged-/usr system).
    p="$(dpkg-query -S "$f" 2>/dev/null || dpkg-query -S "$(readlink -f "$f")" 2>/dev/null || true)"
    p="$(echo "$p" | head -n1 | cut -d: -f1)"
    if [ -n "$p" ]; then pkgs+=("$p"); fi
  done
  pkgs+=(ca-certificates)
  for p in $(printf '%s\n' "${pkgs[@]}" | sort -u); do
    dpkg-query -s "$p" >"$rootfs/var/lib/dpkg/status.d/$p"
    if [ -f "/usr/share/doc/$p/copyright" ]; then
      mkdir -p "$rootfs/usr/share/doc/$p"
      cp -L "/usr/share/doc/$p/copyright" "$rootfs/usr/share/doc/$p/copyright"
    fi
  done
  cp -L /etc/os-release "$rootfs/etc/os-release"
  if [ -f /etc/debian_version ]; then cp -L /etc/debian_version "$rootfs/etc/debian_version"; fi
fi

# --- 3. the image --------------------------------------------------------------------------
# podman keeps an intermediate image per Containerfile step unless told not to; docker has no
# such flag.
no_cache_layers=()
if [ "$(basename "${podman_cmd[0]}")" = podman ]; then no_cache_layers=(--layers=false); fi
# The images these names pointed to before, removed below once nothing else names them (each
# rebuild would otherwise leave a 20 MB untagged copy behind).
previous=()
for name in "$image" turnstile:latest; do
  id="$("${podman_cmd[@]}" image inspect --format '{{.Id}}' "$name" 2>/dev/null || true)"
  if [ -n "$id" ]; then previous+=("$id"); fi
done
log "building $image ($("${podman_cmd[@]}" --version))"
"${podman_cmd[@]}" build \
  --file "$ctx/Containerfile" \
  --build-arg "VERSION=$version" \
  --build-arg "REVISION=$revision" \
  --build-arg "SOURCE=$source_url" \
  --build-arg "LICENSES=$license" \
  --build-arg "CREATED=$created" \
  --tag "$image" \
  --tag "turnstile:latest" \
  "${no_cache_layers[@]}" \
  "$ctx"
current="$("${podman_cmd[@]}" image inspect --format '{{.Id}}' "$image")"
for id in "${previous[@]}"; do
  # Fails, and is left alone, while another name still points to it.
  if [ "$id" != "$current" ]; then "${podman_cmd[@]}" rmi "$id" >/dev/null 2>&1 || true; fi
done

mkdir -p target/image
rm -f target/image/turnstile.tar
"${podman_cmd[@]}" save --output target/image/turnstile.tar "$image"

size="$("${podman_cmd[@]}" image inspect --format '{{.Size}}' "$image")"
log "built $image: $((size / 1000 / 1000)) MB ($size bytes), archive target/image/turnstile.tar"
