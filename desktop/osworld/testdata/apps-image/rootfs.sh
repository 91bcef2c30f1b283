#!/bin/bash
# Stage 1 of build.sh, the slow part: the root filesystem of the real-apps
# guest, from Debian packages. build.sh reruns it only when this file or the
# package lists change.
#
#   rootfs.sh ROOT CACHE LOG
#
# Leaves ROOT with systemd, a kernel and its initramfs in /boot, GRUB's
# files (installed onto the disk later, by grub-setup), and the programs.
set -euo pipefail
ROOT=$1 CACHE=$2 LOG=$3
HERE=$(cd "$(dirname "$0")" && pwd)
SUITE=bookworm
MIRROR=${MIRROR:-http://deb.debian.org/debian}
# What boots and what legato's guest side needs (as in the test guest).
BASE=systemd-sysv,udev,dbus,kmod,linux-image-amd64,initramfs-tools,grub-pc,sudo,python3
BASE=$BASE,python-is-python3,procps,iproute2,rsync,ca-certificates,less,zstd
# The desktop and the programs OSWorld's offline tasks drive. VS Code is no
# Debian package: its tasks stay out. file and desktop-file-utils: without a
# desktop environment xdg-open (OSWorld's open_file) finds a file's type with
# `file` and its program through the desktop files' MIME cache. librsvg2-common:
# GTK's SVG loader, without which GIMP's icons are missing. libreoffice-gtk3: LibreOffice
# draws with GTK, as on OSWorld's Ubuntu, and takes GTK's settings (no caret blink).
# curl: OSWorld's own task configs call it in the guest. The GNOME schemas
# (without GNOME itself): OSWorld's os tasks read and write org.gnome.desktop.*,
# org.gnome.shell (favorite-apps) and org.gnome.settings-daemon.* keys through
# gsettings, which without a schema prints an error a metric then chokes on.
APPS="xvfb xauth xfonts-base fonts-dejavu-core fonts-liberation openbox xdotool wmctrl x11-utils
  x11-apps x11-xserver-utils xdg-utils file desktop-file-utils dbus-x11 socat curl dconf-cli dconf-service libglib2.0-bin
  dconf-gsettings-backend gsettings-desktop-schemas gnome-shell-common gnome-settings-daemon-common
  librsvg2-common adwaita-icon-theme chromium libreoffice-calc libreoffice-writer libreoffice-impress libreoffice-gtk3 gimp vlc vlc-plugin-base
  thunderbird"

mounted=()
cleanup() {
  # Unmount in reverse order; a build interrupted half way must not leave
  # the host's /dev or /proc bound into a directory the next build deletes.
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do umount -l "${mounted[$i]}" 2>/dev/null || true; done
  rm -f "$ROOT/usr/sbin/policy-rc.d"
}
trap cleanup EXIT
bind() { mkdir -p "$ROOT$2"; mount "${@:3}" "$1" "$ROOT$2"; mounted+=("$ROOT$2"); }

rm -rf "$ROOT"
mkdir -p "$CACHE/archives/partial"
echo "== debootstrap $SUITE minbase $(date +%T)"
# INITRD=No: the initramfs is made once, below, with only the modules a
# virtio disk needs (the default packs most of them: minutes under load).
INITRD=No debootstrap --variant=minbase --cache-dir="$CACHE/archives" --include="$BASE" \
  "$SUITE" "$ROOT" "$MIRROR" >"$LOG" 2>&1 || { tail -30 "$LOG" >&2; exit 1; }

echo "== programs $(date +%T)"
printf 'deb %s %s main\n' "$MIRROR" "$SUITE" >"$ROOT/etc/apt/sources.list"
# No service starts inside the build's chroot.
printf '#!/bin/sh\nexit 101\n' >"$ROOT/usr/sbin/policy-rc.d"
chmod 0755 "$ROOT/usr/sbin/policy-rc.d"
bind proc /proc -t proc
bind sysfs /sys -t sysfs
bind /dev /dev --bind
bind /dev/pts /dev/pts --bind
bind "$CACHE/archives" /var/cache/apt/archives --bind
# The disk gets GRUB later, by booting it once (grub-setup): no device here.
echo 'grub-pc grub-pc/install_devices_empty boolean true' | chroot "$ROOT" debconf-set-selections
echo 'grub-pc grub-pc/install_devices multiselect' | chroot "$ROOT" debconf-set-selections
apt_get() { chroot "$ROOT" env DEBIAN_FRONTEND=noninteractive apt-get -o Dpkg::Use-Pty=0 "$@"; }
apt_get update >>"$LOG" 2>&1 || { tail -30 "$LOG" >&2; exit 1; }
# shellcheck disable=SC2086 # APPS is a word list
apt_get install -y --no-install-recommends $APPS >>"$LOG" 2>&1 || { tail -30 "$LOG" >&2; exit 1; }

echo "== gsettings defaults $(date +%T)"
# Defaults where the schemas' own would leave an OSWorld task solved before
# the agent acts: its "turn on auto-lock" task (a4d98375, exact_match on
# org.gnome.desktop.screensaver lock-enabled = true) must start with the lock
# off. A schema override changes the default only: what a task or the agent
# sets is the user's dconf database, which resets put back.
cat >"$ROOT/usr/share/glib-2.0/schemas/90_legato-osworld.gschema.override" <<'OVERRIDE'
[org.gnome.desktop.screensaver]
lock-enabled=false
OVERRIDE
chroot "$ROOT" glib-compile-schemas /usr/share/glib-2.0/schemas >>"$LOG" 2>&1 || { tail -30 "$LOG" >&2; exit 1; }
echo "== initramfs $(date +%T)"
printf 'MODULES=list\nCOMPRESS=zstd\n' >"$ROOT/etc/initramfs-tools/conf.d/legato"
printf '%s\n' virtio_pci virtio_blk virtio_net virtio_console ext4 >"$ROOT/etc/initramfs-tools/modules"
chroot "$ROOT" update-initramfs -c -k all >>"$LOG" 2>&1 || { tail -30 "$LOG" >&2; exit 1; }

echo "== trim $(date +%T)"
rm -rf "$ROOT"/var/lib/apt/lists/* "$ROOT"/usr/share/doc/* "$ROOT"/usr/share/man/* \
       "$ROOT"/usr/share/info/* "$ROOT"/var/log/*.log "$ROOT"/usr/share/lintian
