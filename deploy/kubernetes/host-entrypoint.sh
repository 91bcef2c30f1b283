#!/bin/bash
# host-entrypoint.sh makes a pod of the legato-host DaemonSet a libvirt host
# that legato drives as qemu+ssh://root@POD/system: virtlogd, libvirtd (QEMU
# driver) and sshd, nothing else (README: "Running hosts on Kubernetes").
#
# Usage: host-entrypoint.sh           start the host (the image's command,
#                                     under tini, which reaps the QEMUs
#                                     libvirtd leaves to PID 1)
#        host-entrypoint.sh --check   print the KVM verdict and the host cap;
#                                     start, write and change nothing
# Env:   LEGATO_DESKTOP_CPUS     one desktop's vCPUs (legato's --vcpus, default 4)
#        LEGATO_DESKTOP_MEM_MIB  one desktop's memory (legato's --memory, default 4096)
#        LEGATO_STORAGE_POOL     legato's --storage-pool (default legato)
#        LEGATO_HOST_DIR         the node's hostPath dir (default /var/lib/legato)
#        LEGATO_FLEET_KEYS       the Secret's authorized_keys (default
#                                /etc/legato/ssh/authorized_keys)
#        LEGATO_HOST_ROOT, LEGATO_NPROC, LEGATO_SHM_MIB  for tests: a
#                                directory read as / for dev/kvm, dev/shm,
#                                sys and proc, the CPU count and the size of
#                                /dev/shm
#
# On SIGTERM it destroys every VM of its libvirtd (legato sweeps their
# overlays from the pool when the host is back), then stops sshd, libvirtd
# and virtlogd. A QEMU left anyway dies with the pod's PID namespace.
set -euo pipefail

# The defaults are legato's VM defaults (vm.DefaultVCPUs, DefaultMemoryMiB,
# DefaultStoragePool): the tests hold them equal.
desktop_cpus=${LEGATO_DESKTOP_CPUS:-4}
desktop_mem=${LEGATO_DESKTOP_MEM_MIB:-4096}
pool=${LEGATO_STORAGE_POOL:-legato}
host_dir=${LEGATO_HOST_DIR:-/var/lib/legato}
fleet_keys=${LEGATO_FLEET_KEYS:-/etc/legato/ssh/authorized_keys}
root=${LEGATO_HOST_ROOT:-}
host_key=$host_dir/ssh/ssh_host_ed25519_key
uri=qemu:///system

say() { echo "legato-host: $*"; }
usage_error() { echo "legato-host: $*" >&2; exit 2; }
die() { echo "legato-host: $*" >&2; exit 1; }

# whole NAME VALUE MIN MAX: VALUE is a whole number in [MIN, MAX], or exit 2
# naming the variable and what it takes.
whole() {
  case $2 in
    '' | *[!0-9]*) usage_error "$1=$2: want a whole number from $3 to $4" ;;
  esac
  # 10#: a leading zero is not octal.
  if (( ${#2} > 9 || 10#$2 < $3 || 10#$2 > $4 )); then
    usage_error "$1=$2: want a whole number from $3 to $4"
  fi
}

# kvm_verdict prints "kvm" or "tcg REASON". legato's vm package
# (DetectAccel) uses KVM only when /dev/kvm exists, kvm_pvm is not loaded
# (a PVM /dev/kvm cannot boot ordinary guest kernels) and the CPU has vmx or
# svm; here /dev/kvm must also be a character device this pod can open
# read-write, so a node without KVM, or a device the runtime does not let
# through, counts as absent. -c first: <> would create a missing file.
kvm_verdict() {
  if ! [ -c "$root/dev/kvm" ] || ! { : <>"$root/dev/kvm"; } 2>/dev/null; then
    echo "tcg /dev/kvm is absent or cannot be opened read-write"
  elif [ -e "$root/sys/module/kvm_pvm" ]; then
    echo "tcg /dev/kvm is PVM (kvm_pvm loaded), which cannot boot ordinary guest kernels"
  elif ! grep -qE '^flags[[:space:]]*:(.*[[:space:]])?(vmx|svm)([[:space:]]|$)' "$root/proc/cpuinfo" 2>/dev/null; then
    echo "tcg the CPU has no vmx or svm flag"
  else
    echo kvm
  fi
}

# cpus_available prints the CPUs this pod may use: the CPUs it may run on,
# fewer when its cgroup (v2) has a CPU limit.
cpus_available() {
  local n quota period
  n=${LEGATO_NPROC:-$(nproc)}
  whole LEGATO_NPROC "$n" 1 100000
  n=$(( 10#$n ))
  if read -r quota period 2>/dev/null <"$root/sys/fs/cgroup/cpu.max" && [ "$quota" != max ]; then
    (( quota / period < n )) && n=$(( quota / period ))
  fi
  echo "$n"
}

# mem_available_mib prints the MiB the node has available (MemAvailable),
# fewer when this pod's cgroup (v2) memory limit is lower: the VMs' QEMUs
# run in the pod's cgroup.
mem_available_mib() {
  local kib limit mib
  kib=$(awk '$1 == "MemAvailable:" { print $2 }' "$root/proc/meminfo" 2>/dev/null || true)
  [ -n "$kib" ] || die "no MemAvailable in $root/proc/meminfo"
  mib=$(( kib / 1024 ))
  if read -r limit 2>/dev/null <"$root/sys/fs/cgroup/memory.max" && [ "$limit" != max ]; then
    (( limit / 1048576 < mib )) && mib=$(( limit / 1048576 ))
  fi
  echo "$mib"
}

# host_cap CPUS MIB: the desktops that fit, by CPUs and by memory (no
# overcommit: a suggestion for --host's desktops=N, not a measurement).
host_cap() {
  local by_cpu=$(( $1 / desktop_cpus )) by_mem=$(( $2 / desktop_mem ))
  echo $(( by_cpu < by_mem ? by_cpu : by_mem ))
}

# shm_mib prints the size of /dev/shm in MiB, where legato's --golden-fork
# keeps each fork template's guest RAM (vm.DefaultForkDir), or nothing when
# it cannot tell.
shm_mib() {
  if [ -n "${LEGATO_SHM_MIB:-}" ]; then
    whole LEGATO_SHM_MIB "$LEGATO_SHM_MIB" 0 1073741824
    echo $(( 10#$LEGATO_SHM_MIB ))
    return
  fi
  df -Pk "$root/dev/shm" 2>/dev/null | awk 'NR == 2 { print int($2 / 1024) }' || true
}

# report prints the KVM verdict and the host cap, and sets accel, cap, cpus
# and mib for the caller.
report() {
  local verdict
  verdict=$(kvm_verdict)
  accel=${verdict%% *}
  if [ "$accel" = kvm ]; then
    say "KVM: /dev/kvm usable"
  else
    say "no usable /dev/kvm: guests run under TCG software emulation, about 10x slower (${verdict#tcg }); run legato with --accel tcg"
  fi
  cpus=$(cpus_available)
  mib=$(mem_available_mib)
  cap=$(host_cap "$cpus" "$mib")
  say "host cap: $cap desktops ($cpus cpus, $mib MiB; $desktop_cpus cpus, $desktop_mem MiB each)"
  if [ "$cap" = 0 ]; then
    say "warning: not one desktop fits; give the pod more CPUs or memory, or set LEGATO_DESKTOP_CPUS and LEGATO_DESKTOP_MEM_MIB to legato's --vcpus and --memory"
  fi
  # A container's own /dev/shm is 64 MiB: a fork template would fail there
  # ("no space left on device") and every attempt load its golden state in
  # place, slower, with nothing but a warning in legato's log.
  local shm
  shm=$(shm_mib)
  if [ -n "$shm" ] && (( shm < desktop_mem )); then
    say "warning: /dev/shm holds $shm MiB, less than one desktop's $desktop_mem MiB: legato's --golden-fork templates do not fit there, and attempts load golden states in place; mount a memory-backed emptyDir at /dev/shm (daemonset.yaml's fork-shm)"
  fi
}

# write_cap leaves the cap where a host agent can serve it, whole or not at
# all (renamed into place).
write_cap() {
  printf 'desktops=%s\ncpus=%s\nmemory_mib=%s\ndesktop_cpus=%s\ndesktop_memory_mib=%s\naccel=%s\n' \
    "$cap" "$cpus" "$mib" "$desktop_cpus" "$desktop_mem" "$accel" >"$host_dir/host-cap.tmp"
  mv "$host_dir/host-cap.tmp" "$host_dir/host-cap"
}

# kvm_group lets QEMU, which libvirt runs as libvirt-qemu, open the node's
# /dev/kvm: its group is the node's kvm gid, which this image's kvm group
# need not share. The node's device is left as it is.
kvm_group() {
  local gid name g
  gid=$(stat -c %g /dev/kvm)
  for g in $(id -G libvirt-qemu); do
    [ "$g" = "$gid" ] && return
  done
  name=$(getent group "$gid" | cut -d: -f1) || true
  if [ -z "$name" ]; then
    name=kvm-node
    groupadd -g "$gid" "$name"
  fi
  usermod -aG "$name" libvirt-qemu
}

# install_keys lets the fleet's key log in as root (the Secret's copy is
# read at start: a new key needs a rollout restart), and makes the host's
# ssh key once on the node's dir, so that it stays the same across pod
# restarts and known_hosts can pin it.
install_keys() {
  [ -s "$fleet_keys" ] || die "no fleet key at $fleet_keys: create the Secret legato-fleet-ssh with key authorized_keys (README: Running hosts on Kubernetes)"
  # A placeholder left in the Secret fails here, not as refused logins later.
  ssh-keygen -l -f "$fleet_keys" >/dev/null 2>&1 || die "$fleet_keys holds no SSH public key: make the Secret legato-fleet-ssh from the fleet key's .pub file (README: Running hosts on Kubernetes)"
  install -d -m 0700 /root/.ssh
  install -m 0600 "$fleet_keys" /root/.ssh/authorized_keys
  install -d -m 0700 "$host_dir/ssh"
  if ! [ -s "$host_key" ]; then
    rm -f "$host_key.new" "$host_key.new.pub"
    ssh-keygen -q -t ed25519 -N '' -C "legato-host@${NODE_NAME:-$(hostname)}" -f "$host_key.new"
    mv "$host_key.new.pub" "$host_key.pub"
    mv "$host_key.new" "$host_key"
  fi
  say "host key: $(cat "$host_key.pub")"
}

pool_running() {
  virsh -q -c "$uri" pool-info "$pool" 2>/dev/null | grep -q '^State: *running'
}

# ensure_pool defines legato's storage pool on the node's dir. libvirt's
# own definitions live in the container and go with it; legato would
# otherwise create the pool at its default dir, inside the container.
ensure_pool() {
  if ! virsh -q -c "$uri" pool-info "$pool" >/dev/null 2>&1; then
    virsh -q -c "$uri" pool-define-as "$pool" dir --target "$host_dir/pool" >/dev/null
    virsh -q -c "$uri" pool-build "$pool" >/dev/null
    virsh -q -c "$uri" pool-autostart "$pool" >/dev/null
  fi
  # A container started again (its libvirt definitions kept) has libvirtd
  # start the autostart pool itself, maybe only after it answers: then
  # pool-start fails with "already active", and the pool runs, though
  # pool-info may not say so yet (CI saw it: the check after the failed
  # start found no "running" state, and the host died).
  local err
  if ! pool_running && ! err=$(virsh -q -c "$uri" pool-start "$pool" 2>&1 >/dev/null) && ! pool_running; then
    case $err in
      *"is already active"*) ;;
      *) die "start the storage pool $pool: $err" ;;
    esac
  fi
  say "storage pool $pool at $host_dir/pool"
}

destroy() {
  if timeout 30 virsh -q -c "$uri" destroy "$1" >/dev/null 2>&1; then
    say "destroyed $1"
  else
    say "could not destroy $1"
  fi
}

# The daemons started, and their names, in start order.
pids=() names=()

# stop ends what this script started: every VM of its own libvirtd, then
# its daemons, by the pids it holds. They are its children and unreaped
# until it waits for them, so no pid can belong to another process.
stop() {
  trap '' TERM INT
  say "stopping ($1)"
  if [ ${#pids[@]} -ge 2 ]; then
    # All at once, each bounded: the pod's grace period is for all of them.
    local vm destroying=() p
    for vm in $(timeout 30 virsh -q -c "$uri" list --name 2>/dev/null || true); do
      destroy "$vm" & destroying+=($!)
    done
    for p in "${destroying[@]}"; do
      wait "$p" || true
    done
  fi
  local i
  for (( i = ${#pids[@]} - 1; i >= 0; i-- )); do
    kill -TERM "${pids[i]}" 2>/dev/null || true
    wait "${pids[i]}" 2>/dev/null || true
  done
}

main() {
  case $* in
    '' | --check) ;;
    *) usage_error "usage: host-entrypoint.sh [--check]" ;;
  esac
  whole LEGATO_DESKTOP_CPUS "$desktop_cpus" 1 256
  whole LEGATO_DESKTOP_MEM_MIB "$desktop_mem" 256 1048576
  desktop_cpus=$(( 10#$desktop_cpus )) desktop_mem=$(( 10#$desktop_mem ))
  report
  [ "${1:-}" = --check ] && return
  [ "$(id -u)" = 0 ] || die "must run as root (libvirtd, sshd)"

  install -d -m 0755 "$host_dir"
  write_cap
  install_keys
  [ "$accel" = kvm ] && kvm_group
  install -d -m 0755 /run/sshd
  /usr/sbin/sshd -t -h "$host_key"

  trap 'stop signal; exit 0' TERM INT
  virtlogd & pids+=($!) names+=(virtlogd)
  # Warnings and errors to stderr: the pod log.
  LIBVIRT_LOG_OUTPUTS=3:stderr libvirtd & pids+=($!) names+=(libvirtd)
  local i
  for (( i = 0; i < 300; i++ )); do
    virsh -q -c "$uri" version >/dev/null 2>&1 && break
    sleep 0.2
  done
  virsh -q -c "$uri" version >/dev/null || { stop "libvirtd did not answer in 60 s"; exit 1; }
  ensure_pool
  # Last: port 22 answering is the pod's readiness, and legato may then
  # start VMs at once.
  /usr/sbin/sshd -D -e -h "$host_key" & pids+=($!) names+=(sshd)
  say "ready: qemu+ssh://root@$(hostname -i 2>/dev/null | cut -d' ' -f1)/system"
  local exited=0 status=0 what="a daemon"
  wait -n -p exited "${pids[@]}" || status=$?
  for i in "${!pids[@]}"; do
    if [ "${pids[i]}" = "$exited" ]; then
      what=${names[i]}
    fi
  done
  stop "$what exited with status $status"
  exit 1
}

# Sourced (the tests), it defines its functions only.
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  main "$@"
fi
