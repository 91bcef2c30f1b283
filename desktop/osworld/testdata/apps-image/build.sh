#!/bin/bash
# Build legato's real-apps guest: a disk image shaped like OSWorld's Ubuntu
# image, from Debian bookworm packages.
#
#   build.sh [--cache-dir DIR] [OUT_DIR]      (as root; OUT_DIR default /var/tmp/legato-apps-guest)
#
# Writes OUT_DIR/base.qcow2 (+ build-info.txt, stamp): a partitioned disk
# (MBR, one ext4 partition) that boots through GRUB (BIOS) with systemd, so
# legato boots it as it boots OSWorld's Ubuntu.qcow2: `--image
# OUT_DIR/base.qcow2`, no --kernel. What the guest provides:
#   - user `user`, password `password`, passwordless sudo; hostname legato-apps;
#   - an X session on DISPLAY :0 at 1920x1080 (Xvfb, software rendering),
#     openbox as window manager, a session D-Bus (gsettings/dconf);
#   - legato's OSWorld-compatible guest server (../guest) on port 5000, as
#     `user`, started by systemd (legato-session.service) after X;
#   - Chromium, also as `google-chrome` (OSWorld's launch commands and their
#     --remote-debugging-port; its profile in Chrome's ~/.config/google-chrome,
#     where OSWorld's history setup and getters look), LibreOffice Calc/Writer/Impress, GIMP, VLC
#     (with its HTTP interface, `vlc --extraintf http`), Thunderbird, socat,
#     dconf-cli and gsettings;
#   - the NIC at 10.0.2.15 (QEMU user networking) with no route and no DNS.
#
# Caches make re-runs cheap: nothing is done when the outputs exist and
# OUT_DIR/stamp holds the hash of every input; the root filesystem (the slow
# part, rootfs.sh: ~1 GB of packages) is kept in OUT_DIR/rootfs and redone
# only when rootfs.sh changes; OSWorld's defaults (defaults.sh) go onto a
# copy of it, OUT_DIR/rootfs-osworld, redone when either changes; .debs
# stay in the cache dir.
# Env: MIRROR (Debian mirror), REBUILD=1 (ignore the caches).
set -euo pipefail
umask 022

HERE=$(cd "$(dirname "$0")" && pwd)
GUEST_SRC=$(cd "$HERE/../guest" && pwd)
CACHE="" OUT=""
while [ $# -gt 0 ]; do
  case $1 in
    --cache-dir) CACHE=$2; shift 2 ;;
    --cache-dir=*) CACHE=${1#*=}; shift ;;
    -h|--help) sed -n '2,29p' "$0"; exit 0 ;;
    -*) echo "build.sh: unknown flag $1 (see --help)" >&2; exit 2 ;;
    *) OUT=$1; shift ;;
  esac
done
OUT=${OUT:-/var/tmp/legato-apps-guest}
CACHE=${CACHE:-$OUT/debcache}
# Stage 1's tree (rootfs.sh) stays as it built it; stage 2 (defaults.sh)
# works on a copy, which the rest of the build then finishes.
BASE_ROOT=$OUT/rootfs
ROOT=$OUT/rootfs-osworld

[ "$(id -u)" = 0 ] || { echo "build.sh: must run as root (debootstrap, chroot)" >&2; exit 1; }
for c in debootstrap qemu-img qemu-system-x86_64 mkfs.ext4 sfdisk sha256sum flock; do
  command -v "$c" >/dev/null || { echo "build.sh: $c not found: run .ci/libvirt-up.sh first" >&2; exit 1; }
done
case $CACHE in /*) ;; *) CACHE=$(pwd)/$CACHE ;; esac
mkdir -p "$OUT" "$CACHE"
chmod 0755 "$OUT"
exec 9>"$OUT/.build.lock"   # one build at a time per OUT_DIR
flock 9

hash_inputs() {
  find "$@" -type f ! -name '*.pyc' ! -path '*/__pycache__/*' -print0 | LC_ALL=C sort -z |
    xargs -0 sha256sum | sed "s|$HERE/||; s|$GUEST_SRC/|guest/|" | sha256sum | cut -d' ' -f1
}
STAMP_ROOT=$(printf '%s\n' "${MIRROR:-}" "$(hash_inputs "$HERE/rootfs.sh")" | sha256sum | cut -d' ' -f1)
STAMP_DEFAULTS=$(printf '%s\n' "$STAMP_ROOT" "$(hash_inputs "$HERE/defaults.sh")" | sha256sum | cut -d' ' -f1)
STAMP_ALL=$(printf '%s\n' "$STAMP_DEFAULTS" "$(hash_inputs "$HERE" "$GUEST_SRC")" | sha256sum | cut -d' ' -f1)
if [ "${REBUILD:-0}" != 1 ] && [ -s "$OUT/base.qcow2" ] && [ "$(cat "$OUT/stamp" 2>/dev/null)" = "$STAMP_ALL" ]; then
  echo "build.sh: $OUT is up to date"
  exit 0
fi

t0=$(date +%s)
if [ "${REBUILD:-0}" = 1 ] || [ "$(cat "$BASE_ROOT.stamp" 2>/dev/null)" != "$STAMP_ROOT" ]; then
  rm -f "$BASE_ROOT.stamp" "$ROOT.stamp" "$OUT/stamp"
  bash "$HERE/rootfs.sh" "$BASE_ROOT" "$CACHE" "$OUT/rootfs.log"
  echo "$STAMP_ROOT" >"$BASE_ROOT.stamp"
else
  echo "== root filesystem up to date"
fi
t_root=$(date +%s)
if [ "$(cat "$ROOT.stamp" 2>/dev/null)" != "$STAMP_DEFAULTS" ]; then
  rm -f "$ROOT.stamp" "$OUT/stamp"
  echo "== OSWorld's defaults on a copy of the root filesystem $(date +%T)"
  rm -rf "$ROOT"
  cp -a --reflink=auto "$BASE_ROOT" "$ROOT"
  bash "$HERE/defaults.sh" "$ROOT" "$CACHE" "$OUT/defaults.log"
  echo "$STAMP_DEFAULTS" >"$ROOT.stamp"
else
  echo "== OSWorld's defaults up to date"
fi
t1=$(date +%s)

echo "== user, session, guest server $(date +%T)"
F=$HERE/files
if ! chroot "$ROOT" id user >/dev/null 2>&1; then
  chroot "$ROOT" useradd --create-home --uid 1000 --user-group --shell /bin/bash user
fi
echo user:password | chroot "$ROOT" chpasswd
echo 'user ALL=(ALL:ALL) NOPASSWD: ALL' >"$ROOT/etc/sudoers.d/user"
chmod 0440 "$ROOT/etc/sudoers.d/user"
echo legato-apps >"$ROOT/etc/hostname"
printf '127.0.0.1 localhost legato-apps\n::1 localhost\n' >"$ROOT/etc/hosts"
: >"$ROOT/etc/resolv.conf"   # no DNS inside the guest, on purpose
printf 'LABEL=legato-apps / ext4 rw,noatime,errors=remount-ro 0 1\n' >"$ROOT/etc/fstab"
install -m 0755 "$F/legato-session" "$F/google-chrome" "$F/pkill" "$ROOT/usr/local/bin/"
install -m 0644 "$F/legato-session.service" "$ROOT/etc/systemd/system/"
install -m 0644 "$F/legato.tmpfiles" "$ROOT/etc/tmpfiles.d/legato.conf"
install -m 0644 "$F/10-qemu.network" "$ROOT/etc/systemd/network/"
install -m 0644 "$F/grub.default" "$ROOT/etc/default/grub"
install -D -m 0644 "$F/gtk-settings.ini" "$ROOT/etc/gtk-3.0/settings.ini"
# LibreOffice's tip of the day and "what's new" bar would greet the first
# attempt of every task (a golden state would keep them).
lo=$ROOT/home/user/.config/libreoffice/4/user
mkdir -p "$lo"
install -m 0644 "$F/registrymodifications.xcu" "$lo/"
install -D -m 0644 "$F/vlcrc" "$ROOT/home/user/.config/vlc/vlcrc"
install -m 0644 "$F/asound.conf" "$ROOT/etc/asound.conf"
# Thunderbird would open its account setup on every start without an
# account; this profile has one that never connects (the guest has no network).
tb=$ROOT/home/user/.thunderbird
mkdir -p "$tb/legato.default"
install -m 0644 "$F/thunderbird/profiles.ini" "$F/thunderbird/installs.ini" "$tb/"
install -m 0644 "$F/thunderbird/user.js" "$tb/legato.default/"
# A Chrome profile, as OSWorld's image has one: task setups edit its
# Preferences before Chrome starts (3299584d: `cd ~/.config/google-chrome/
# Default && jq ...`, which fails where the directory is missing). The
# empty one OSWorld's own setups write where none is (93eabf48, 9656a811).
mkdir -p "$ROOT/home/user/.config/google-chrome/Default"
[ -s "$ROOT/home/user/.config/google-chrome/Default/Preferences" ] ||
  echo '{}' >"$ROOT/home/user/.config/google-chrome/Default/Preferences"
chroot "$ROOT" chown -R user:user /home/user/.config /home/user/.thunderbird
# Chromium's first-run page and keyring prompt would greet every attempt.
printf 'export CHROMIUM_FLAGS="$CHROMIUM_FLAGS --no-first-run --password-store=basic"\n' \
  >"$ROOT/etc/chromium.d/legato"
chroot "$ROOT" systemctl enable legato-session.service systemd-networkd.service >/dev/null 2>&1
# Nothing a guest runs in the background may change it between attempts.
chroot "$ROOT" systemctl mask apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer \
  fstrim.timer man-db.timer systemd-networkd-wait-online.service >/dev/null 2>&1 || true
rm -rf "$ROOT/opt/legato-guest"
mkdir -p "$ROOT/opt/legato-guest"
cp -r "$GUEST_SRC/." "$ROOT/opt/legato-guest/"
find "$ROOT/opt/legato-guest" -name '__pycache__' -prune -exec rm -rf {} +
chmod -R a+rX "$ROOT/opt/legato-guest"
chroot "$ROOT" python3 -m compileall -q /opt/legato-guest >/dev/null
install -m 0755 "$F/grub-setup" "$ROOT/usr/local/sbin/grub-setup"

echo "== disk: MBR + ext4 $(date +%T)"
used_mb=$(du -sm "$ROOT" | cut -f1)
fs_mb=$(( used_mb * 12 / 10 + 2048 ))   # room for what tasks write
rm -f "$OUT/fs.raw" "$OUT/disk.raw" "$OUT/base.qcow2.new"
mkfs.ext4 -q -F -L legato-apps -E root_owner=0:0 -d "$ROOT" "$OUT/fs.raw" "${fs_mb}M"
truncate -s $(( (fs_mb + 1) * 1024 * 1024 )) "$OUT/disk.raw"
printf 'label: dos\nstart=2048, type=83, bootable\n' | sfdisk -q "$OUT/disk.raw"
dd if="$OUT/fs.raw" of="$OUT/disk.raw" bs=1M seek=1 conv=notrunc,sparse status=none
rm -f "$OUT/fs.raw"
rm -f "$ROOT/usr/local/sbin/grub-setup"
t2=$(date +%s)

echo "== GRUB: one boot of the disk $(date +%T)"
KVER=$(ls "$ROOT/lib/modules" | sort -V | tail -1)
# KVM only where it truly works: not a nested "PVM" /dev/kvm, which hangs
# Debian's kernel (shared/docs/KVM.md); as legato's VMs choose (vm/accel.go).
accel=tcg
if [ -w /dev/kvm ] && [ ! -e /sys/module/kvm_pvm ] && grep -qE 'vmx|svm' /proc/cpuinfo; then accel=kvm; fi
if ! timeout 900 qemu-system-x86_64 -machine "accel=$accel" -m 2048 -smp 2 -nographic -no-reboot \
    -drive file="$OUT/disk.raw",format=raw,if=virtio -net none \
    -kernel "$ROOT/boot/vmlinuz-$KVER" -initrd "$ROOT/boot/initrd.img-$KVER" \
    -append "root=/dev/vda1 rw console=ttyS0 init=/usr/local/sbin/grub-setup" \
    </dev/null >"$OUT/grub-setup.log" 2>&1 || ! grep -q "grub-setup: ok" "$OUT/grub-setup.log"; then
  tail -30 "$OUT/grub-setup.log" >&2
  echo "build.sh: installing GRUB on the disk failed (log: $OUT/grub-setup.log)" >&2
  exit 1
fi
t3=$(date +%s)

echo "== qcow2 $(date +%T)"
qemu-img convert -O qcow2 "$OUT/disk.raw" "$OUT/base.qcow2.new"
rm -f "$OUT/disk.raw"
chmod 0644 "$OUT/base.qcow2.new"
# Rename last: a half-built image never looks finished.
mv "$OUT/base.qcow2.new" "$OUT/base.qcow2"
t4=$(date +%s)

{
  echo "kernel=$KVER"
  echo "rootfs_du_mb=$used_mb"
  echo "ext4_size_mb=$fs_mb"
  echo "qcow2_bytes=$(stat -c %s "$OUT/base.qcow2")"
  echo "rootfs_s=$((t_root - t0))"
  echo "defaults_s=$((t1 - t_root))"
  echo "disk_s=$((t2 - t1))"
  echo "grub_s=$((t3 - t2))"
  echo "qcow2_s=$((t4 - t3))"
  echo "total_build_s=$((t4 - t0))"
} | tee "$OUT/build-info.txt"
echo "$STAMP_ALL" >"$OUT/stamp"
