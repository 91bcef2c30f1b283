package osworld

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"legato/rl/desktop/osworld/guest"
)

// The shell programs the desktop runs in the guest. They take their inputs
// as positional arguments, never spliced into the text, so no path or
// process name can change what they do; and each one is a single /execute
// round trip, which matters under software emulation.

// fastResetScript kills the task programs, checks that none survived,
// restores the home directory from its baseline and checks the result.
//
//	$1 home, $2 baseline, $3… process names
//
// Exit status: 0 done, 3 a program survived SIGKILL, 4 no baseline, 5 the
// copy failed, 6 the home still differs from the baseline.
const fastResetScript = `set -u
home=$1 base=$2
shift 2
# Processes whose name is one of "$@", zombies left out: a killed child its
# parent has not reaped yet holds nothing.
list() {
  ps -eo pid=,stat=,comm= | awk -v names=" $* " '$2 !~ /^Z/ && index(names, " " $3 " ") > 0 { print $1 " " $3 }'
}
if [ $# -gt 0 ]; then
  pids=$(list "$@" | cut -d' ' -f1)
  [ -z "$pids" ] || kill -KILL $pids 2>/dev/null
  i=0
  while left=$(list "$@"); [ -n "$left" ]; do
    i=$((i + 1))
    if [ $i -ge 50 ]; then
      echo "still running 5s after SIGKILL:" $left >&2
      exit 3
    fi
    sleep 0.1
  done
fi
[ -d "$base" ] || { echo "no baseline at $base" >&2; exit 4; }
restore() {
  if command -v rsync >/dev/null 2>&1; then
    rsync -a --delete "$base/" "$home/"
  else
    find "$home" -mindepth 1 -maxdepth 1 -exec rm -rf {} + && cp -a "$base/." "$home/"
  fi
}
differences() {
  if command -v rsync >/dev/null 2>&1; then
    rsync -a --delete --dry-run --itemize-changes "$base/" "$home/"
  else
    diff -rq --no-dereference "$base" "$home"
  fi
}
# Twice at most: a program outside the kill list may write to the home
# while it is being restored.
for try in 1 2; do
  if ! out=$(restore 2>&1 >/dev/null); then
    echo "$out" >&2
    exit 5
  fi
  changes=$(differences 2>&1)
  [ -n "$changes" ] || exit 0
done
echo "home differs from the baseline after the restore:" >&2
echo "$changes" | head -n 20 >&2
exit 6
`

// baselineScript copies the home directory to the baseline, unless there
// is one already. The copy is made under a temporary name and renamed, so a
// baseline that exists is complete.
//
//	$1 home, $2 baseline
const baselineScript = `set -eu
home=$1 base=$2
if [ -d "$base" ]; then echo kept; exit 0; fi
mkdir -p "$(dirname "$base")"
rm -rf "$base.tmp"
cp -a "$home" "$base.tmp"
mv "$base.tmp" "$base"
echo created
`

// clockScript sets the guest clock: $1 is a Unix time.
const clockScript = `date -u -s "@$1" >/dev/null`

// shiftClockScript moves the guest clock back by $1 seconds (its offset
// from the host's). Python reads and sets the clock within microseconds;
// the shell fallback loses the time it takes to start date (0.1-0.2 s under
// software emulation).
const shiftClockScript = `if command -v python3 >/dev/null 2>&1; then
  exec python3 -c 'import sys, time; time.clock_settime(time.CLOCK_REALTIME, time.clock_gettime(time.CLOCK_REALTIME) - float(sys.argv[1]))' "$1"
fi
now=$(date +%s.%N)
date -u -s "@$(awk -v n="$now" -v o="$1" 'BEGIN { printf "%.6f", n - o }')" >/dev/null`

// loadScript prints the aggregate cpu line of /proc/stat before and after
// sleeping $1 seconds: the guest's load during the wait, measured by the
// guest's own clock.
const loadScript = `head -n 1 /proc/stat; sleep "$1"; head -n 1 /proc/stat`

// sudoWrapper runs $0 (a script) as root with sudo, feeding it the
// password on stdin when sudo asks: $1 is the password, the rest the
// script's arguments. The password is an argument, so it is in no command
// text that could be logged.
const sudoWrapper = `pw=$1
shift
printf '%s\n' "$pw" | sudo -S -p '' -- sh -c "$0" legato "$@"`

// guestShell runs shell scripts in the guest, as root when asked.
type guestShell struct {
	client   *guest.Client
	asRoot   bool // the guest server already runs as root
	password string
}

// run runs script with args through /execute as the guest server's user.
func (s *guestShell) run(ctx context.Context, script string, args ...string) (guest.ExecResult, error) {
	return s.client.Execute(ctx, guest.Command{Args: append([]string{script, "legato"}, args...), Shell: true})
}

// runRoot runs script with args as root: directly when the guest server is
// root, else through sudo with the guest user's password.
func (s *guestShell) runRoot(ctx context.Context, script string, args ...string) (guest.ExecResult, error) {
	if s.asRoot {
		return s.run(ctx, script, args...)
	}
	argv := append([]string{sudoWrapper, script, s.password}, args...)
	res, err := s.client.Execute(ctx, guest.Command{Args: argv, Shell: true})
	return res, redact(err, s.password)
}

// redactedError is an error whose message hides a secret; the error it
// wraps keeps its identity for errors.Is and errors.As.
type redactedError struct {
	msg string
	err error
}

func (e *redactedError) Error() string { return e.msg }
func (e *redactedError) Unwrap() error { return e.err }

// redact hides secret in err's message. A guest server may quote the
// command it failed to run (Python's TimeoutExpired does), and the sudo
// password is one of its arguments.
func redact(err error, secret string) error {
	if err == nil || secret == "" || !strings.Contains(err.Error(), secret) {
		return err
	}
	return &redactedError{msg: strings.ReplaceAll(err.Error(), secret, "[password]"), err: err}
}

// detectRoot asks the guest which user its server runs commands as.
func (s *guestShell) detectRoot(ctx context.Context) error {
	res, err := s.run(ctx, `id -u`)
	if err != nil {
		return fmt.Errorf("ask the guest's user id: %w", err)
	}
	if res.ReturnCode != 0 {
		return fmt.Errorf("ask the guest's user id: id -u: exit %d: %s", res.ReturnCode, clip(res.Error))
	}
	s.asRoot = strings.TrimSpace(res.Output) == "0"
	return nil
}

// ensureBaseline makes the home baseline if the guest has none, and
// reports whether it made it.
func (s *guestShell) ensureBaseline(ctx context.Context, home, base string) (bool, error) {
	res, err := s.runRoot(ctx, baselineScript, home, base)
	if err != nil {
		return false, fmt.Errorf("make the home baseline: %w", err)
	}
	if res.ReturnCode != 0 {
		return false, fmt.Errorf("make the home baseline %s from %s: exit %d: %s", base, home, res.ReturnCode, clip(res.Error+res.Output))
	}
	return strings.TrimSpace(res.Output) == "created", nil
}

// ErrFastReset is wrapped by the error of a fast reset that ran in the
// guest and failed there: a program survived SIGKILL, the baseline is
// missing, or the home could not be restored. A VM desktop then reverts
// its snapshot instead.
var ErrFastReset = errors.New("fast reset failed in the guest")

// fastReset kills names, then restores home from base.
func (s *guestShell) fastReset(ctx context.Context, home, base string, names []string) error {
	args := append([]string{home, base}, names...)
	res, err := s.runRoot(ctx, fastResetScript, args...)
	if err != nil {
		return fmt.Errorf("fast reset: %w", err)
	}
	switch res.ReturnCode {
	case 0:
		return nil
	case 3:
		return fmt.Errorf("%w: kill the task programs: %s", ErrFastReset, clip(res.Error))
	case 4:
		return fmt.Errorf("%w: %s (the desktop makes it when it starts)", ErrFastReset, clip(res.Error))
	case 6:
		return fmt.Errorf("%w: %s", ErrFastReset, clip(res.Error))
	}
	return fmt.Errorf("%w: restore %s from %s: exit %d: %s", ErrFastReset, home, base, res.ReturnCode, clip(res.Error+res.Output))
}

// setClock sets the guest clock to the host's. It measures the offset
// first and then shifts the guest clock by it, reading the guest's own time
// at the moment it sets it: sending the host's time instead would leave the
// guest behind by the request's latency (0.3 s under software emulation).
func (s *guestShell) setClock(ctx context.Context) error {
	off, err := s.clockOffset(ctx)
	if err != nil {
		return fmt.Errorf("set the guest clock: %w", err)
	}
	if off.Abs() < clockTolerance {
		return nil
	}
	res, err := s.runRoot(ctx, shiftClockScript, strconv.FormatFloat(off.Seconds(), 'f', 6, 64))
	if err != nil {
		return fmt.Errorf("set the guest clock: %w", err)
	}
	if res.ReturnCode != 0 {
		return fmt.Errorf("set the guest clock (%v off): exit %d: %s", off, res.ReturnCode, clip(res.Error))
	}
	return nil
}

// clockTolerance is the clock offset left alone: below what setting the
// clock through the guest server can achieve.
const clockTolerance = 20 * time.Millisecond

// setClockTo sets the guest clock to t, give or take the request's latency.
func (s *guestShell) setClockTo(ctx context.Context, t time.Time) error {
	stamp := strconv.FormatFloat(float64(t.UnixNano())/1e9, 'f', 3, 64)
	res, err := s.runRoot(ctx, clockScript, stamp)
	if err != nil {
		return fmt.Errorf("set the guest clock: %w", err)
	}
	if res.ReturnCode != 0 {
		return fmt.Errorf("set the guest clock: exit %d: %s", res.ReturnCode, clip(res.Error))
	}
	return nil
}

// clockOffset returns the guest clock minus the host's, measured at the
// middle of the call.
func (s *guestShell) clockOffset(ctx context.Context) (time.Duration, error) {
	before := time.Now()
	res, err := s.run(ctx, `date +%s.%N`)
	after := time.Now()
	if err != nil {
		return 0, err
	}
	secs, err := strconv.ParseFloat(strings.TrimSpace(res.Output), 64)
	if err != nil {
		return 0, fmt.Errorf("guest date %q: %w", res.Output, err)
	}
	mid := before.Add(after.Sub(before) / 2)
	return time.Duration(secs*1e9) - time.Duration(mid.UnixNano()), nil
}

// errNoLoad means the guest has no /proc/stat to measure its load from.
var errNoLoad = errors.New("guest load unavailable")

// load measures the busy share of the guest's CPUs over d.
func (s *guestShell) load(ctx context.Context, d time.Duration) (float64, error) {
	res, err := s.run(ctx, loadScript, strconv.FormatFloat(d.Seconds(), 'f', 3, 64))
	if err != nil {
		return 0, err
	}
	if res.ReturnCode != 0 {
		return 0, fmt.Errorf("%w: exit %d: %s", errNoLoad, res.ReturnCode, clip(res.Error))
	}
	return parseLoad(res.Output)
}

// parseLoad computes the busy share between two aggregate "cpu" lines of
// /proc/stat: (user nice system idle iowait irq softirq steal ...), in
// clock ticks since boot. Idle and iowait count as idle.
func parseLoad(out string) (float64, error) {
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 {
		return 0, fmt.Errorf("%w: want two cpu lines, got %q", errNoLoad, clip(out))
	}
	var busy, total [2]float64
	for i, line := range lines {
		f := strings.Fields(line)
		if len(f) < 5 || f[0] != "cpu" {
			return 0, fmt.Errorf("%w: not a cpu line: %q", errNoLoad, clip(line))
		}
		for j, v := range f[1:] {
			if j >= 8 { // guest and guest_nice are already in user and nice
				break
			}
			n, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return 0, fmt.Errorf("%w: %q: %v", errNoLoad, clip(line), err)
			}
			total[i] += n
			if j != 3 && j != 4 {
				busy[i] += n
			}
		}
	}
	dt := total[1] - total[0]
	if dt <= 0 {
		return 0, nil // no tick passed: nothing ran long enough to count
	}
	return max(0, min(1, (busy[1]-busy[0])/dt)), nil
}

// clip shortens guest output for an error message.
func clip(s string) string {
	s = strings.TrimSpace(s)
	const n = 400
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}
