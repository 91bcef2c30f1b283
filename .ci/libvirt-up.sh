#!/bin/bash
# Bring up libvirt + QEMU on a Debian 12 machine without systemd, for the VM
# integration tests. Idempotent: installs only missing packages, starts only
# daemons that are not running, and records the ones it started so that
# .ci/libvirt-down.sh stops those and nothing else.
#
# Why each step (measured facts in shared/docs/KVM.md):
#   - /dev/kvm must be root:kvm 0660 before libvirtd starts, or libvirt
#     re-probes QEMU on every domain start (~4 s each).
#   - libvirt's "default" NAT network must never come up here (its addresses
#     are off-limits and its dnsmasq would listen beyond loopback), so its
#     autostart link is removed before libvirtd starts.
#
# Usage: bash .ci/libvirt-up.sh      (as root)
# Env:   LEGATO_CI_STATE  where the record of started daemons lives
#                         (default /run/legato-ci)
set -euo pipefail

STATE=${LEGATO_CI_STATE:-/run/legato-ci}
URI=qemu:///system
# Host packages: the daemons and tools, plus what the guest image builds
# (desktop/osworld/testdata/image/build.sh, apps-image/build.sh: sfdisk
# from fdisk) run on the host.
PKGS=(qemu-system-x86 qemu-utils libvirt-daemon-system libvirt-clients
      debootstrap e2fsprogs fdisk iproute2 ca-certificates)

[ "$(id -u)" = 0 ] || { echo "libvirt-up: must run as root" >&2; exit 1; }
mkdir -p "$STATE"
# Several jobs may call this at once; one at a time keeps "start only if not
# running" true.
exec 9>"$STATE/up.lock"
flock 9

need=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "libvirt-up: installing ${need[*]}"
  t0=$(date +%s)
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  echo "libvirt-up: apt took $(( $(date +%s) - t0 ))s"
fi

if [ -e /dev/kvm ]; then
  chgrp kvm /dev/kvm && chmod 0660 /dev/kvm
fi
rm -f /etc/libvirt/qemu/networks/autostart/default.xml

# cgroup v1 without systemd: libvirt puts each QEMU under the cpuset cgroup /machine. When
# two domains start at once on a fresh host, one of them can create its cgroup before
# /machine has its cpus and mems copied in, and QEMU fails with "No space left on device".
# Prepare /machine now, and have new cpusets inherit their parent's cpus and mems.
CPUSET=/sys/fs/cgroup/cpuset
if [ -f "$CPUSET/cpuset.cpus" ]; then
  echo 1 >"$CPUSET/cgroup.clone_children"
  mkdir -p "$CPUSET/machine"
  [ -n "$(cat "$CPUSET/machine/cpuset.cpus")" ] || cat "$CPUSET/cpuset.cpus" >"$CPUSET/machine/cpuset.cpus"
  [ -n "$(cat "$CPUSET/machine/cpuset.mems")" ] || cat "$CPUSET/cpuset.mems" >"$CPUSET/machine/cpuset.mems"
  echo 1 >"$CPUSET/machine/cgroup.clone_children"
fi

# running NAME PIDFILE: the pid file names a live process called NAME (a
# stale file whose pid was reused by something else does not count).
running() {
  local pid
  [ -s "$2" ] || return 1
  pid=$(cat "$2")
  [ -r "/proc/$pid/comm" ] && [ "$(cat "/proc/$pid/comm")" = "$1" ]
}

start() { # NAME: start the daemon detached and record its pid as ours
  local name=$1 pidfile=/run/$1.pid
  if running "$name" "$pidfile"; then
    echo "libvirt-up: $name already running (pid $(cat "$pidfile")), leaving it alone"
    return
  fi
  # 9>&-: the daemon must not inherit (and hold forever) our lock.
  "$name" -d 9>&-
  for _ in $(seq 100); do
    running "$name" "$pidfile" && break
    sleep 0.1
  done
  running "$name" "$pidfile" || { echo "libvirt-up: $name did not start" >&2; exit 1; }
  # One line per daemon we started: NAME PID. libvirt-down.sh reads it.
  grep -v "^$name " "$STATE/started" 2>/dev/null >"$STATE/started.new" || true
  echo "$name $(cat "$pidfile")" >>"$STATE/started.new"
  mv "$STATE/started.new" "$STATE/started"
  echo "libvirt-up: started $name (pid $(cat "$pidfile"))"
}

start virtlogd
start libvirtd

for _ in $(seq 150); do
  virsh -c "$URI" version >/dev/null 2>&1 && break
  sleep 0.2
done
virsh -c "$URI" version

if [ "$(virsh -c "$URI" net-list --name 2>/dev/null | grep -cx default)" != 0 ]; then
  echo "libvirt-up: libvirt's default network is active; legato never uses it, stop it first" >&2
  exit 1
fi
