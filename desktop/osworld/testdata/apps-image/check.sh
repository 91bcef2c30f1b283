#!/bin/bash
# Boot the real-apps guest once, on a throwaway overlay, the way legato
# boots an image without a kernel (BIOS, GRUB, the disk's own systemd), and
# check what legato and OSWorld's tasks need of it: the guest server answers
# on port 5000 with a screenshot, sudo works without a prompt, and every
# program is there.
#
#   check.sh [OUT_DIR]     (OUT_DIR as given to build.sh; default /var/tmp/legato-apps-guest)
#
# Prints the boot time to a first screenshot and each program's version;
# exits 1 naming what is missing. QEMU is started directly (no libvirt),
# with user networking forwarded from 127.0.0.1 only.
set -euo pipefail
OUT=${1:-/var/tmp/legato-apps-guest}
BASE=$OUT/base.qcow2
[ -s "$BASE" ] || { echo "check.sh: no $BASE: run build.sh first" >&2; exit 1; }
for c in qemu-system-x86_64 qemu-img curl python3; do
  command -v "$c" >/dev/null || { echo "check.sh: $c not found" >&2; exit 1; }
done
work=$(mktemp -d /var/tmp/legato-apps-check.XXXXXX)
qpid=""
cleanup() {
  [ -n "$qpid" ] && kill "$qpid" 2>/dev/null && wait "$qpid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
qemu-img create -q -f qcow2 -F qcow2 -b "$BASE" "$work/overlay.qcow2"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
# KVM only where it truly works: not a nested "PVM" /dev/kvm, which hangs
# Debian's kernel (shared/docs/KVM.md); as legato's VMs choose (vm/accel.go).
accel=tcg
if [ -w /dev/kvm ] && [ ! -e /sys/module/kvm_pvm ] && grep -qE 'vmx|svm' /proc/cpuinfo; then accel=kvm; fi
t0=$(date +%s.%N)
qemu-system-x86_64 -machine "accel=$accel" -m 4096 -smp 2 -display none -serial "file:$work/console.log" \
  -drive file="$work/overlay.qcow2",if=virtio \
  -netdev "user,id=n,restrict=on,hostfwd=tcp:127.0.0.1:$port-:5000" -device virtio-net-pci,netdev=n \
  </dev/null >"$work/qemu.log" 2>&1 &
qpid=$!
url=http://127.0.0.1:$port
for _ in $(seq 900); do
  if curl -sf -m 10 -o "$work/shot.png" "$url/screenshot"; then break; fi
  kill -0 "$qpid" 2>/dev/null || { cat "$work/qemu.log" >&2; echo "check.sh: QEMU exited" >&2; exit 1; }
  sleep 1
done
[ -s "$work/shot.png" ] || { tail -40 "$work/console.log" >&2; echo "check.sh: the guest server did not answer on port 5000 within 15 minutes" >&2; exit 1; }
t1=$(date +%s.%N)
printf 'boot_to_screenshot_s=%.1f\n' "$(echo "$t1 - $t0" | bc 2>/dev/null || python3 -c "print($t1 - $t0)")"
cp "$work/shot.png" "$OUT/check-first-screen.png"

# run CMD: runs a shell command in the guest as `user` through the guest
# server (POST /execute), prints its output, fails on a non-zero exit.
run() {
  local body
  body=$(python3 -c 'import json, sys; print(json.dumps({"command": sys.argv[1], "shell": True}))' "$1")
  curl -sf -m 120 -H 'Content-Type: application/json' -d "$body" "$url/execute" |
    python3 -c 'import json, sys; r = json.load(sys.stdin); print((r.get("output") or "").strip() or (r.get("error") or "").strip()); sys.exit(r.get("returncode", 1))'
}
failed=0
for c in 'sudo -n true && echo sudo: ok' 'echo DISPLAY=$DISPLAY' 'google-chrome --version' \
         'libreoffice --version' 'gimp --version' 'vlc --version 2>/dev/null | head -1' \
         'thunderbird --version' 'socat -V | head -2 | tail -1' 'gsettings --version' \
         'dconf help >/dev/null && echo dconf: ok' \
         'gsettings get org.gnome.shell favorite-apps' \
         'test "$(gsettings get org.gnome.desktop.screensaver lock-enabled)" = false && echo lock-enabled: false' \
         'gsettings set org.gnome.desktop.interface text-scaling-factor 1.25 && test "$(gsettings get org.gnome.desktop.interface text-scaling-factor)" = 1.25 && gsettings reset org.gnome.desktop.interface text-scaling-factor && echo gsettings writes: ok' \
         'ls /usr/lib/x86_64-linux-gnu/vlc/lua/intf/http.luac >/dev/null && echo vlc http interface: ok'; do
  if ! run "$c"; then
    echo "check.sh: failed in the guest: $c" >&2
    failed=1
  fi
done
exit $failed
