#!/bin/bash
# Stop the libvirt daemons that .ci/libvirt-up.sh started, and only those:
# a daemon that was already running before it is left alone. Domains are not
# touched here: tests remove their own (vm.Sweep / `legato rl gc`).
set -euo pipefail

STATE=${LEGATO_CI_STATE:-/run/legato-ci}
[ -s "$STATE/started" ] || { echo "libvirt-down: nothing started by libvirt-up"; exit 0; }
exec 9>"$STATE/up.lock"
flock 9

# libvirtd first: it talks to virtlogd while it shuts down.
for name in libvirtd virtlogd; do
  pid=$(awk -v n="$name" '$1 == n {print $2}' "$STATE/started")
  [ -n "$pid" ] || continue
  if [ -r "/proc/$pid/comm" ] && [ "$(cat "/proc/$pid/comm")" = "$name" ]; then
    kill -TERM "$pid"
    for _ in $(seq 100); do [ -e "/proc/$pid" ] || break; sleep 0.1; done
    if [ -e "/proc/$pid" ]; then
      echo "libvirt-down: $name (pid $pid) ignored SIGTERM for 10s, killing it" >&2
      kill -KILL "$pid" 2>/dev/null || true
    fi
    echo "libvirt-down: stopped $name (pid $pid)"
  else
    echo "libvirt-down: $name (pid $pid) is already gone"
  fi
  grep -v "^$name " "$STATE/started" >"$STATE/started.new" || true
  mv "$STATE/started.new" "$STATE/started"
done
