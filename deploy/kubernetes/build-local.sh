#!/bin/bash
# Build the legato host image (Containerfile) on this machine with podman,
# without a container registry: its base, Debian 12 minbase, is made here
# with debootstrap from the same Debian mirror apt uses and imported, and
# the image is built against it (podman build --from) with a legato binary
# built from this tree. The namespace-host tests run it
# (desktop/osworld/vm/hosttest, Options.Image).
#
#   build-local.sh [--cache-dir DIR]      (as root; DIR default /var/tmp/legato-hostimage)
#
# Prints the image's name (localhost/legato-host:HASH) as its last line.
#
# Caches make re-runs cheap:
#   - nothing is built when podman holds the image tagged with the hash of
#     every input (this script, the Containerfile, the files it copies, the
#     legato binary, the base's tag); only the legato binary is checked
#     (go build: about 2 s when the tree is unchanged, its binary kept in
#     DIR);
#   - the base is made again only when its step below, the suite or the
#     mirror change; downloaded .debs stay in DIR/debcache;
#   - podman's layer cache keeps the apt layer when only the binary or the
#     entrypoint change (the COPY steps come after it).
# Older images and bases this script tagged are removed; nothing else is.
# Env: MIRROR (default the mirror of /etc/apt), LEGATO_BIN (a legato binary
# to use instead of building one), REBUILD=1 (ignore the caches).
set -euo pipefail
umask 022

HERE=$(cd "$(dirname "$0")" && pwd)
SELF=$HERE/$(basename "$0")
TREE=$(cd "$HERE/../.." && pwd)
CACHE=""
while [ $# -gt 0 ]; do
  case $1 in
    --cache-dir) CACHE=${2:?--cache-dir needs a directory}; shift 2 ;;
    --cache-dir=*) CACHE=${1#*=}; shift ;;
    -h|--help) sed -n '2,25p' "$SELF"; exit 0 ;;
    *) echo "build-local.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
CACHE=${CACHE:-/var/tmp/legato-hostimage}
SUITE=bookworm
BASE_REPO=localhost/legato-debian
IMAGE_REPO=localhost/legato-host

[ "$(id -u)" = 0 ] || { echo "build-local.sh: must run as root (debootstrap, podman's system store)" >&2; exit 1; }
for c in debootstrap podman runc sha256sum flock tar; do
  command -v "$c" >/dev/null || { echo "build-local.sh: $c not found (apt-get install debootstrap podman runc)" >&2; exit 1; }
done
case $CACHE in /*) ;; *) CACHE=$(pwd)/$CACHE ;; esac   # debootstrap wants an absolute path
mkdir -p "$CACHE/debcache"
exec 9>"$CACHE/.build.lock"   # one build at a time (parallel test runs)
flock 9

# MIRROR: the first Debian mirror apt uses here (deb822 or one-line
# sources), so the base and the image's apt reach what this machine does.
if [ -z "${MIRROR:-}" ]; then
  MIRROR=$(awk '$1 == "URIs:" && $2 ~ /\/debian\/?$/ { print $2; exit }' /etc/apt/sources.list.d/*.sources 2>/dev/null || true)
  [ -n "$MIRROR" ] || MIRROR=$(awk '$1 == "deb" && $3 == "'$SUITE'" { print $2; exit }' /etc/apt/sources.list 2>/dev/null || true)
  MIRROR=${MIRROR:-http://deb.debian.org/debian}
fi

# How the build's RUN steps run here (hosttest's podman run does the same,
# in podmanFlags): runc, as crun refuses cgroups that are v1 and v2 at once
# ("hybrid"), and resource limits no higher than podman's own, as a
# machine that withholds CAP_SYS_RESOURCE (a sandbox) cannot raise them
# (podman's defaults are higher; its process count is capped at pid_max).
nproc=$(ulimit -Hu)
pid_max=$(cat /proc/sys/kernel/pid_max)
case $nproc in unlimited) nproc=$pid_max ;; esac
(( nproc > pid_max )) && nproc=$pid_max
nofile=$(ulimit -Hn)
case $nofile in unlimited) nofile=1048576 ;; esac
RUN_FLAGS=(--runtime runc --ulimit "nofile=$nofile:$nofile" --ulimit "nproc=$nproc:$nproc")
# The RUN steps' apt reaches the mirror as this machine's does. Podman's
# default network reaches it too, but leaves its bridge (cni-podman0)
# behind after the build.
BUILD_FLAGS=(--network host)

hash() { sha256sum | cut -c1-16; }
BASE_STAMP=$( { printf '%s\n' "$SUITE" "$MIRROR"; sed -n '/^  # --- base/,/^  # --- end base/p' "$SELF"; } | hash)
BASE=$BASE_REPO:$SUITE-$BASE_STAMP

t0=$(date +%s)
if [ "${REBUILD:-0}" = 1 ] || ! podman image exists "$BASE"; then
  # --- base: Debian 12 minbase, as debian:12-slim is (no docs, no apt lists).
  echo "== base $BASE: debootstrap $SUITE minbase from $MIRROR $(date +%T)" >&2
  root=$CACHE/rootfs
  rm -rf "$root"
  debootstrap --variant=minbase --cache-dir="$CACHE/debcache" "$SUITE" "$root" "$MIRROR" >"$CACHE/debootstrap.log" 2>&1 ||
    { tail -30 "$CACHE/debootstrap.log" >&2; exit 1; }
  printf 'deb %s %s main\ndeb %s %s-updates main\n' "$MIRROR" "$SUITE" "$MIRROR" "$SUITE" >"$root/etc/apt/sources.list"
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/usr/share/doc/* "$root"/usr/share/man/*
  tar -C "$root" --numeric-owner -c . | podman import --change 'CMD ["bash"]' - "$BASE" >"$CACHE/import.log" 2>&1 ||
    { cat "$CACHE/import.log" >&2; exit 1; }
  rm -rf "$root"
  # --- end base
else
  echo "== base $BASE up to date" >&2
fi
t1=$(date +%s)

ctx=$CACHE/context
rm -rf "$ctx"
mkdir -p "$ctx"
cp "$HERE/Containerfile" "$HERE/host-entrypoint.sh" "$HERE/sshd_config" "$ctx/"
if [ -n "${LEGATO_BIN:-}" ]; then
  cp "$LEGATO_BIN" "$ctx/legato"
else
  # go's defaults, as the tests build: CI's build cache then holds most of
  # it. Kept in DIR: go build leaves an up-to-date binary as it is.
  echo "== legato binary $(date +%T)" >&2
  (cd "$TREE" && PATH=/usr/local/go/bin:$PATH go build -o "$CACHE/legato" ./cmd/legato)
  cp "$CACHE/legato" "$ctx/legato"
fi
STAMP=$( { echo "$BASE"; cd "$ctx" && sha256sum Containerfile host-entrypoint.sh sshd_config legato; sha256sum <"$SELF"; } | hash)
IMAGE=$IMAGE_REPO:$STAMP
t2=$(date +%s)

if [ "${REBUILD:-0}" = 1 ] || ! podman image exists "$IMAGE"; then
  echo "== image $IMAGE $(date +%T)" >&2
  podman build "${RUN_FLAGS[@]}" "${BUILD_FLAGS[@]}" --from "$BASE" -f "$ctx/Containerfile" -t "$IMAGE" "$ctx" >"$CACHE/build.log" 2>&1 ||
    { tail -30 "$CACHE/build.log" >&2; exit 1; }
else
  echo "== image $IMAGE up to date" >&2
fi
rm -rf "$ctx"
t3=$(date +%s)

# Older tags of this script's two names go; an image a container still
# uses stays (podman refuses, and the next build retries).
podman images --format '{{.Repository}}:{{.Tag}}' | while read -r ref; do
  case $ref in
    "$BASE" | "$IMAGE") ;;
    "$BASE_REPO":* | "$IMAGE_REPO":*) podman rmi "$ref" >/dev/null 2>&1 || true ;;
  esac
done
echo "build-local.sh: base_s=$((t1 - t0)) legato_s=$((t2 - t1)) image_s=$((t3 - t2)) total_s=$((t3 - t0))" >&2
echo "$IMAGE"
