#!/bin/bash
# Stage 1 of build.sh, the slow part: debootstrap the guest's root filesystem
# and make the boot files from its kernel. build.sh reruns it only when this
# file, initramfs-init or the package list change.
#
#   rootfs.sh ROOT OUT CACHE PKGS
#
# Leaves ROOT (trimmed, with user `user`), OUT/vmlinux, OUT/initrd.img and
# OUT/kernel-version.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$1 OUT=$2 CACHE=$3 PKGS=$4
SUITE=bookworm
MIRROR=${MIRROR:-}
# Kernel modules kept in the rootfs; everything else under /lib/modules is deleted.
KEEP_MODS='virtio|virtio_ring|virtio_pci|virtio_pci_legacy_dev|virtio_pci_modern_dev|virtio_blk|virtio_net|net_failover|failover|virtio_console|virtio-rng|virtio_balloon|ext4|jbd2|mbcache|crc16|crc32c_generic|crc32c-intel|libcrc32c'

rm -rf "$ROOT"
echo "== debootstrap $SUITE minbase $(date +%T)"
# INITRD=No: the kernel's postinst hook then skips initramfs-tools' initrd (minutes of
# compressing every module under load), which the guest never uses: ours is below.
INITRD=No debootstrap --variant=minbase --cache-dir="$CACHE" --include="$PKGS" \
  "$SUITE" "$ROOT" ${MIRROR:+"$MIRROR"} >"$OUT/debootstrap.log" 2>&1 ||
  { tail -30 "$OUT/debootstrap.log" >&2; exit 1; }

KVER=$(ls "$ROOT/lib/modules" | sort -V | tail -1)
echo "== kernel $KVER: initramfs, vmlinux $(date +%T)"
# Debian's kernel has virtio_blk and ext4 as modules, so some initramfs is needed: static
# busybox, 11 modules and a short /init, packed by the guest's own cpio.
M=/lib/modules/$KVER/kernel
IRD=$ROOT/tmp/initramfs
rm -rf "$IRD"
mkdir -p "$IRD/bin" "$IRD/dev" "$IRD/proc" "$IRD/newroot" "$IRD/mod"
cp "$ROOT/bin/busybox" "$IRD/bin/busybox"
for ko in drivers/virtio/virtio.ko drivers/virtio/virtio_ring.ko \
          drivers/virtio/virtio_pci_legacy_dev.ko drivers/virtio/virtio_pci_modern_dev.ko \
          drivers/virtio/virtio_pci.ko drivers/block/virtio_blk.ko \
          lib/crc16.ko crypto/crc32c_generic.ko fs/mbcache.ko fs/jbd2/jbd2.ko fs/ext4/ext4.ko; do
  cp "$ROOT$M/$ko" "$IRD/mod/"
done
install -m 0755 "$HERE/initramfs-init" "$IRD/init"
chroot "$ROOT" sh -c 'cd /tmp/initramfs && find . | cpio -o -H newc --quiet' >"$OUT/initrd.img.new"
rm -rf "$IRD"
# The bzImage holds an XZ-compressed ELF; the guest's python3 unpacks it, so the host needs
# no python.
cp "$ROOT/boot/vmlinuz-$KVER" "$ROOT/tmp/vmlinuz"
chroot "$ROOT" python3 - <<'PY'
import lzma
d = open("/tmp/vmlinuz", "rb").read()
out = lzma.LZMADecompressor(format=lzma.FORMAT_XZ).decompress(d[d.find(b"\xfd7zXZ\x00"):])
assert out[:4] == b"\x7fELF", "no ELF inside the bzImage"
open("/tmp/vmlinux", "wb").write(out)
PY
mv "$ROOT/tmp/vmlinux" "$OUT/vmlinux.new"
rm -f "$ROOT/tmp/vmlinuz"

echo "== trim, user $(date +%T)"
# No GLX needed: Xvfb runs without the swrast DRI driver (~170 MB with LLVM).
chroot "$ROOT" dpkg --purge --force-depends libgl1-mesa-dri libllvm15 libz3-4 >>"$OUT/debootstrap.log" 2>&1 || true
# The kernel and its initrd live outside the image; docs and caches are dead weight.
rm -rf "$ROOT"/boot/* "$ROOT"/var/cache/apt/* "$ROOT"/var/lib/apt/lists/* \
       "$ROOT"/usr/share/doc/* "$ROOT"/usr/share/man/* "$ROOT"/usr/share/info/* \
       "$ROOT"/usr/share/locale/* "$ROOT"/var/log/*.log "$ROOT"/usr/share/lintian \
       "$ROOT/usr/lib/firmware"
find "$ROOT/lib/modules/$KVER/kernel" -name '*.ko*' -print0 | while IFS= read -r -d '' f; do
  b=${f##*/}; b=${b%%.ko*}   # no basename: a fork per module is minutes on a busy host
  [[ "$b" =~ ^($KEEP_MODS)$ ]] || rm -f "$f"
done
find "$ROOT/lib/modules/$KVER/kernel" -depth -type d -empty -delete
chroot "$ROOT" depmod -a "$KVER"
# As in OSWorld's images: user `user`, password "password", and sudo (here without a
# password, so tools can set the clock after a snapshot restore).
chroot "$ROOT" useradd --create-home --uid 1000 --user-group --shell /bin/bash user
echo user:password | chroot "$ROOT" chpasswd
echo 'user ALL=(ALL:ALL) NOPASSWD: ALL' >"$ROOT/etc/sudoers.d/user"
chmod 0440 "$ROOT/etc/sudoers.d/user"
echo legato-guest >"$ROOT/etc/hostname"
echo "127.0.0.1 localhost legato-guest" >"$ROOT/etc/hosts"
: >"$ROOT/etc/resolv.conf"   # no DNS inside the guest, on purpose
printf '/dev/vda / ext4 rw,noatime 0 1\n' >"$ROOT/etc/fstab"
mv "$OUT/initrd.img.new" "$OUT/initrd.img"
mv "$OUT/vmlinux.new" "$OUT/vmlinux"
echo "$KVER" >"$OUT/kernel-version"
