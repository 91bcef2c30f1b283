#!/bin/bash
# Build legato's Debian test guest for direct kernel boot under libvirt/QEMU.
#
#   build.sh [--cache-dir DIR] [OUT_DIR]      (as root; OUT_DIR default /var/tmp/legato-guest)
#
# Writes to OUT_DIR, all readable by libvirt-qemu:
#   base.qcow2   ext4 root filesystem on /dev/vda (no partition table); VMs never write it,
#                they run on per-VM overlays
#   vmlinux      the kernel as an uncompressed ELF: QEMU boots it through the PVH entry point,
#                skipping in-guest decompression (~4 s under software emulation)
#   initrd.img   a tiny busybox initramfs (virtio + ext4 modules only; ~4 s faster than
#                initramfs-tools' under software emulation)
#   cmdline      the kernel command line to boot them with
#   build-info.txt, stamp
#
# The guest (bookworm minbase, no systemd): /sbin/legato-init (guest-init here) is PID 1; it
# starts Xvfb :0 at 1920x1080, openbox, and legato's OSWorld-compatible guest server
# (../guest/server.py, copied with its pyautogui stand-in to /opt/legato-guest) on port 5000,
# as user `user` (home /home/user, password "password", passwordless sudo).
#
# Caches make re-runs cheap:
#   - nothing is done when the outputs exist and OUT_DIR/stamp holds the hash of every input
#     (these scripts, the guest init, the guest server directory);
#   - the debootstrapped root filesystem (the slow part, rootfs.sh) is kept in OUT_DIR/rootfs
#     and redone only when rootfs.sh, initramfs-init or the package list change, so editing
#     the guest server or its init costs only the image step (~30 s);
#   - downloaded .debs stay in the --cache-dir (default OUT_DIR/debcache; CI can keep one
#     between runs).
# Env: MIRROR (debootstrap mirror; empty = its default), REBUILD=1 (ignore the caches).
set -euo pipefail
umask 022

HERE=$(cd "$(dirname "$0")" && pwd)
GUEST_SRC=$(cd "$HERE/../guest" && pwd)
CACHE=""
OUT=""
while [ $# -gt 0 ]; do
  case $1 in
    --cache-dir) CACHE=$2; shift 2 ;;
    --cache-dir=*) CACHE=${1#*=}; shift ;;
    -h|--help) sed -n '2,31p' "$0"; exit 0 ;;
    -*) echo "build.sh: unknown flag $1 (see --help)" >&2; exit 2 ;;
    *) OUT=$1; shift ;;
  esac
done
OUT=${OUT:-/var/tmp/legato-guest}
CACHE=${CACHE:-$OUT/debcache}
ROOT=$OUT/rootfs
# Guest packages. openbox: a small EWMH window manager, so wmctrl and `xdotool windowactivate`
# work; x11-apps brings xedit (a real X editor) and xwd; python-is-python3 because OSWorld's
# actions run `python -c ...`; rsync for tests that restore a home the way legato did before.
PKGS=linux-image-amd64,busybox-static,tini,python3,python-is-python3,xvfb,xfonts-base,xdotool
PKGS=$PKGS,xterm,x11-utils,x11-apps,wmctrl,xdg-utils,openbox,procps,iproute2,rsync,sudo
CMDLINE="root=/dev/vda rw console=ttyS0 init=/sbin/legato-init quiet loglevel=3 mitigations=off cryptomgr.notests"

[ "$(id -u)" = 0 ] || { echo "build.sh: must run as root (debootstrap, chroot)" >&2; exit 1; }
[ -f "$GUEST_SRC/server.py" ] || { echo "build.sh: no guest server at $GUEST_SRC/server.py" >&2; exit 1; }
for c in debootstrap qemu-img mkfs.ext4 sha256sum flock; do
  command -v "$c" >/dev/null || { echo "build.sh: $c not found: run .ci/libvirt-up.sh first" >&2; exit 1; }
done
case $CACHE in /*) ;; *) CACHE=$(pwd)/$CACHE ;; esac   # debootstrap wants an absolute path
mkdir -p "$OUT" "$CACHE"
chmod 0755 "$OUT"
exec 9>"$OUT/.build.lock"   # one build at a time per OUT_DIR (parallel test runs)
flock 9

# hash_inputs PATH...: one hash over the names and contents of the files under PATHs.
hash_inputs() {
  find "$@" -type f ! -name '*.pyc' ! -path '*/__pycache__/*' -print0 | LC_ALL=C sort -z |
    xargs -0 sha256sum | sed "s|$HERE/||; s|$GUEST_SRC/|guest/|" | sha256sum | cut -d' ' -f1
}
STAMP_ROOT=$(printf '%s\n' "$PKGS" "${MIRROR:-}" "$(hash_inputs "$HERE/rootfs.sh" "$HERE/initramfs-init")" | sha256sum | cut -d' ' -f1)
STAMP_ALL=$(printf '%s\n' "$STAMP_ROOT" "$CMDLINE" "$(hash_inputs "$HERE" "$GUEST_SRC")" | sha256sum | cut -d' ' -f1)

outputs_ok() {
  for f in base.qcow2 vmlinux initrd.img cmdline; do [ -s "$OUT/$f" ] || return 1; done
}
if [ "${REBUILD:-0}" != 1 ] && outputs_ok && [ "$(cat "$OUT/stamp" 2>/dev/null)" = "$STAMP_ALL" ]; then
  echo "build.sh: $OUT is up to date"
  exit 0
fi

t0=$(date +%s)
if [ "${REBUILD:-0}" = 1 ] || [ "$(cat "$ROOT.stamp" 2>/dev/null)" != "$STAMP_ROOT" ] || \
   ! [ -s "$OUT/vmlinux" ] || ! [ -s "$OUT/initrd.img" ]; then
  rm -f "$ROOT.stamp" "$OUT/stamp"
  bash "$HERE/rootfs.sh" "$ROOT" "$OUT" "$CACHE" "$PKGS"
  echo "$STAMP_ROOT" >"$ROOT.stamp"
else
  echo "== root filesystem up to date"
fi
t1=$(date +%s)

echo "== guest init + server $(date +%T)"
install -m 0755 "$HERE/guest-init" "$ROOT/sbin/legato-init"
rm -rf "$ROOT/opt/legato-guest"
mkdir -p "$ROOT/opt/legato-guest"
cp -r "$GUEST_SRC/." "$ROOT/opt/legato-guest/"
find "$ROOT/opt/legato-guest" -name '__pycache__' -prune -exec rm -rf {} +
chmod -R a+rX "$ROOT/opt/legato-guest"
# Byte-compile now, so the first boot (under emulation) does not pay for it.
chroot "$ROOT" python3 -m compileall -q /opt/legato-guest >/dev/null

echo "== ext4 image -> qcow2 $(date +%T)"
used_mb=$(du -sm "$ROOT" | cut -f1)
img_mb=$(( used_mb * 13 / 10 + 512 ))   # room for what tests write
rm -f "$OUT/base.raw" "$OUT/base.qcow2.new"
mkfs.ext4 -q -F -L legato-root -E root_owner=0:0 -d "$ROOT" "$OUT/base.raw" "${img_mb}M"
qemu-img convert -O qcow2 "$OUT/base.raw" "$OUT/base.qcow2.new"
rm -f "$OUT/base.raw"
echo "$CMDLINE" >"$OUT/cmdline"
chmod 0644 "$OUT/base.qcow2.new" "$OUT/vmlinux" "$OUT/initrd.img" "$OUT/cmdline"
# Rename last: a half-built image never looks finished.
mv "$OUT/base.qcow2.new" "$OUT/base.qcow2"
t2=$(date +%s)

{
  echo "kernel=$(cat "$OUT/kernel-version")"
  echo "rootfs_du_mb=$used_mb"
  echo "ext4_size_mb=$img_mb"
  echo "qcow2_bytes=$(stat -c %s "$OUT/base.qcow2")"
  echo "vmlinux_bytes=$(stat -c %s "$OUT/vmlinux")"
  echo "initrd_bytes=$(stat -c %s "$OUT/initrd.img")"
  echo "rootfs_s=$((t1 - t0))"
  echo "image_s=$((t2 - t1))"
  echo "total_build_s=$((t2 - t0))"
} | tee "$OUT/build-info.txt"
echo "$STAMP_ALL" >"$OUT/stamp"
