#!/bin/bash
# Stage 2 of build.sh: OSWorld's Ubuntu defaults that a task's untouched
# start state depends on, where stage 1's packages alone would leave a task
# solved before the agent acts (a trainer would reward doing nothing).
# build.sh runs it on a fresh copy of stage 1's tree, and only when this
# file or stage 1 changes: adding here costs minutes, not stage 1's rebuild.
#
#   defaults.sh ROOT CACHE LOG
#
# What it sets:
#   - Totem ("Videos") as the default video player, as on OSWorld's Ubuntu:
#     with VLC the only player installed, OSWorld's "make VLC the default
#     video player" task (getter default_video_player: xdg-mime's answer for
#     each video type) scored 1 untouched. Totem is installed, and
#     /etc/xdg/mimeapps.list makes it the default for the video types its
#     desktop file declares; xdg-mime answers from it (and only for a
#     desktop file that exists, hence the package), and what the agent sets
#     goes to ~/.config/mimeapps.list, which comes first and resets put back.
#   - jq, which two of OSWorld's Chrome task setups install with apt before
#     they edit Preferences with it (3299584d, 9656a811): the guest has no
#     network, so without it their setups left Chrome's settings as they
#     were, and 3299584d (its start page) scored 1 untouched.
set -euo pipefail
ROOT=$1 CACHE=$2 LOG=$3

# The mounts apt needs in the chroot, as rootfs.sh makes them (the same
# lines; they move into a shared file when rootfs.sh next changes, which
# rebuilds stage 1 anyway).
mounted=()
cleanup() {
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do umount -l "${mounted[$i]}" 2>/dev/null || true; done
  rm -f "$ROOT/usr/sbin/policy-rc.d"
}
trap cleanup EXIT
bind() { mkdir -p "$ROOT$2"; mount "${@:3}" "$1" "$ROOT$2"; mounted+=("$ROOT$2"); }

: >"$LOG"
printf '#!/bin/sh\nexit 101\n' >"$ROOT/usr/sbin/policy-rc.d"
chmod 0755 "$ROOT/usr/sbin/policy-rc.d"
mkdir -p "$CACHE/archives/partial"
bind proc /proc -t proc
bind sysfs /sys -t sysfs
bind /dev /dev --bind
bind /dev/pts /dev/pts --bind
bind "$CACHE/archives" /var/cache/apt/archives --bind
# The host's DNS for apt: the tree's own resolv.conf is empty once build.sh
# has made a guest of it (no DNS inside the guest).
touch "$ROOT/etc/resolv.conf"
mount --bind /etc/resolv.conf "$ROOT/etc/resolv.conf"
mounted+=("$ROOT/etc/resolv.conf")
apt_get() { chroot "$ROOT" env DEBIAN_FRONTEND=noninteractive apt-get -o Dpkg::Use-Pty=0 "$@"; }

echo "== default video player: Totem $(date +%T)"
apt_get update >>"$LOG" 2>&1 || { tail -30 "$LOG" >&2; exit 1; }
apt_get install -y --no-install-recommends totem >>"$LOG" 2>&1 || { tail -30 "$LOG" >&2; exit 1; }
totem=$ROOT/usr/share/applications/org.gnome.Totem.desktop
[ -f "$totem" ] || { echo "defaults.sh: totem installed no $totem" >&2; exit 1; }
types=$(sed -n 's/^MimeType=//p' "$totem" | tr ';' '\n' | grep '^video/' || true)
[ -n "$types" ] || { echo "defaults.sh: $totem declares no video type" >&2; exit 1; }
{
  echo '# legato (defaults.sh): Totem plays video, as on OSWorld'"'"'s Ubuntu.'
  echo '[Default Applications]'
  for t in $types; do echo "$t=org.gnome.Totem.desktop"; done
} >"$ROOT/etc/xdg/mimeapps.list"
echo "defaults.sh: Totem is the default for $(echo "$types" | wc -l) video types" >>"$LOG"

echo "== what task setups install from the network: jq $(date +%T)"
apt_get install -y --no-install-recommends jq >>"$LOG" 2>&1 || { tail -30 "$LOG" >&2; exit 1; }

rm -rf "$ROOT"/var/lib/apt/lists/* "$ROOT"/usr/share/doc/* "$ROOT"/usr/share/man/* \
       "$ROOT"/usr/share/info/* "$ROOT"/var/log/*.log
