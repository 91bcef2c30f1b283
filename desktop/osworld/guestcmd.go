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

// clockScript sets the guest clock: $1 is a Unix time.
const clockScript = `date -u -s "@$1" >/dev/null`

// shiftClockScript moves the guest clock back by $1 nanoseconds (its
// offset from the host's), with the shell and date alone: starting Python
// takes a second under software emulation. It reads the clock twice to
// learn how long starting date takes, and counts that time in for the
// date that sets it.
const shiftClockScript = `off=$1
t1=$(date +%s%N)
t2=$(date +%s%N)
t=$((t2 + (t2 - t1) - off))
date -u -s "@$((t / 1000000000)).$(printf %09d $((t % 1000000000)))" >/dev/null`

// thawScript readies a guest restored from a snapshot when no helper
// runs: it shifts the clock as shiftClockScript does (unless $1, the
// offset in nanoseconds, is within 20 ms) and writes $2, the host's seed,
// into the kernel's random pool.
const thawScript = `off=$1
if [ "$off" -gt 20000000 ] || [ "$off" -lt -20000000 ]; then
t1=$(date +%s%N)
t2=$(date +%s%N)
t=$((t2 + (t2 - t1) - off))
date -u -s "@$((t / 1000000000)).$(printf %09d $((t % 1000000000)))" >/dev/null || exit
fi
printf '%s' "$2" >/dev/urandom`

// loadScript prints the aggregate cpu line of /proc/stat before and after
// sleeping $1 seconds: the guest's load during the wait, measured by the
// guest's own clock.
const loadScript = `head -n 1 /proc/stat; sleep "$1"; head -n 1 /proc/stat`

// sudoWrapper runs $0 (a script) as root with sudo, feeding it the
// password on stdin when sudo asks: $1 is the password, the rest the
// script's arguments. The password is an argument, so it is in no command
// text that could be logged. sudo clears the environment; the X display
// and its cookie are passed on, so that root's programs reach the user's
// screen.
const sudoWrapper = `pw=$1
shift
printf '%s\n' "$pw" | sudo -S -p '' -- env "DISPLAY=${DISPLAY-}" "XAUTHORITY=${XAUTHORITY:-$HOME/.Xauthority}" sh -c "$0" legato "$@"`

// guestShell runs shell scripts in the guest, as root when asked.
type guestShell struct {
	client   *guest.Client
	asRoot   bool // the guest server already runs as root
	password string
	// toolCache is the guest directory of the compiled guest tool
	// (toolCacheDir), helper that of its helper ("" for none), and
	// noHelper says the helper did not answer.
	toolCache string
	helper    string
	noHelper  bool
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

// ErrFastReset is wrapped by the error of a fast reset that ran in the
// guest and could not bring it back to its clean state: a process that
// survived SIGKILL, a change outside what it restores, a baseline that is
// missing. A VM desktop then reverts its snapshot instead.
var ErrFastReset = errors.New("fast reset failed in the guest")

// setClock sets the guest clock to the host's. It measures the offset
// first and then shifts the guest clock by it, reading the guest's own time
// at the moment it sets it: sending the host's time instead would leave the
// guest behind by the request's latency (0.3 s under software emulation).
func (s *guestShell) setClock(ctx context.Context) error {
	off, err := s.clockOffset(ctx)
	if err != nil {
		return fmt.Errorf("set the guest clock: %w", err)
	}
	return s.shiftClock(ctx, off)
}

// shiftClock moves the guest clock back by off, its measured offset from
// the host's; an offset within clockTolerance is left alone.
func (s *guestShell) shiftClock(ctx context.Context, off time.Duration) error {
	if off.Abs() < clockTolerance {
		return nil
	}
	ns := strconv.FormatInt(off.Nanoseconds(), 10)
	if s.helper != "" && !s.noHelper {
		res, err := s.tool(ctx, true, "shift", ns, "")
		if err != nil {
			return fmt.Errorf("set the guest clock: %w", err)
		}
		if res.ReturnCode != 0 {
			return fmt.Errorf("set the guest clock (%v off): exit %d: %s", off, res.ReturnCode, clip(lastLines(res.Error, 4)))
		}
		return nil
	}
	res, err := s.runRoot(ctx, shiftClockScript, ns)
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
	off, _, err := clockOffset(ctx, s.client)
	return off, err
}

// clockOffset asks the guest c for its time and returns its offset from
// the host's, taken at the middle of the call, and the call's round trip:
// the offset is right to within half of it. It is also the readiness probe
// after a revert: the guest answering it runs commands again.
func clockOffset(ctx context.Context, c *guest.Client) (off, rtt time.Duration, err error) {
	before := time.Now()
	res, err := c.Execute(ctx, guest.Argv("date", "+%s.%N"))
	after := time.Now()
	if err != nil {
		return 0, 0, err
	}
	if res.ReturnCode != 0 {
		return 0, 0, fmt.Errorf("guest date: exit %d: %s", res.ReturnCode, clip(res.Error))
	}
	secs, err := strconv.ParseFloat(strings.TrimSpace(res.Output), 64)
	if err != nil {
		return 0, 0, fmt.Errorf("guest date %q: %w", res.Output, err)
	}
	mid := before.Add(after.Sub(before) / 2)
	return time.Duration(secs*1e9) - time.Duration(mid.UnixNano()), after.Sub(before), nil
}

// maxClockRTT is the round trip of a clock reading good enough to set the
// clock by (to within half of it); the readiness probe's reading, taken
// while a restored guest catches up, often is not.
const maxClockRTT = 300 * time.Millisecond

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
