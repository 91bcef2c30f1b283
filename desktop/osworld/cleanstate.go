package osworld

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// The in-guest programs. Each is sent with every call, ahead of it the X
// client they share (guestpy/x11.py), so a guest needs only python3: an
// OSWorld image has it, since its guest server is Python.
var (
	//go:embed guestpy/x11.py
	x11Client string
	//go:embed guestpy/cleanstate.py
	cleanStateSrc string
	//go:embed guestpy/quiet.py
	quietSrc string

	// cleanStateTool records the clean state and brings a guest back to
	// it.
	cleanStateTool = x11Client + "\n" + cleanStateSrc
	// quietTool is the ready signal's probe: the guest's load and how
	// much of its screen was redrawn.
	quietTool = x11Client + "\n" + quietSrc
)

// runPython runs a Python program: $1 is its text, the rest its arguments.
// -I -S: the programs need the standard library only, and skipping the
// site packages saves much of Python's start under software emulation.
const runPython = `src=$1
shift
command -v python3 >/dev/null 2>&1 || { echo "python3 is not installed in the guest" >&2; exit 127; }
exec python3 -I -S -c "$src" "$@"`

// errNoPython means the guest has no python3.
var errNoPython = errors.New("the guest has no python3")

// quietProbe is what the quiet probe saw over its interval.
type quietProbe struct {
	// Load is the busy share of the guest's CPUs.
	Load float64 `json:"load"`
	// Damage is the screen area redrawn, in pixels; nil when the guest
	// cannot watch its screen (Why says why).
	Damage *int64 `json:"damage"`
	Why    string `json:"why"`
}

// quiet watches the guest's load and screen for interval.
func (s *guestShell) quiet(ctx context.Context, interval time.Duration) (quietProbe, error) {
	var p quietProbe
	res, err := s.run(ctx, runPython, quietTool, strconv.FormatFloat(interval.Seconds(), 'f', 3, 64))
	if err != nil {
		return p, err
	}
	if res.ReturnCode == 127 {
		return p, fmt.Errorf("%w: %s", errNoPython, clip(res.Error))
	}
	if res.ReturnCode != 0 {
		return p, fmt.Errorf("quiet probe: exit %d: %s", res.ReturnCode, clip(lastLines(res.Error+res.Output, 6)))
	}
	if err := json.Unmarshal([]byte(res.Output), &p); err != nil {
		return p, fmt.Errorf("quiet probe: answer %q: %v", clip(res.Output), err)
	}
	return p, nil
}

// cleanConfig is what the tool is told; see guestpy/cleanstate.py.
type cleanConfig struct {
	// Nonce marks this call's own processes (shells, sudo) in their
	// arguments, so that the tool leaves them alone.
	Nonce        string   `json:"nonce"`
	Home         string   `json:"home"`
	HomeBaseline string   `json:"home_baseline"`
	StateDir     string   `json:"state_dir"`
	Restore      []string `json:"restore"`
	Check        []string `json:"check"`
	Skip         []string `json:"skip"`
	// ScopeDisplay ends only processes whose environment names the guest
	// server's X display (a guest that shares its machine).
	ScopeDisplay bool `json:"scope_display"`
	// CheckOutside records and checks what the user may change outside
	// the restored directories, and the Check directories.
	CheckOutside bool `json:"check_outside"`
	// KeepSameBoot keeps a record made earlier in the same boot (a guest
	// given by URL that an earlier run attached to).
	KeepSameBoot bool `json:"keep_same_boot"`
}

// recordResult is what recording the clean state found.
type recordResult struct {
	// HomeBaseline is "created" or "kept".
	HomeBaseline string `json:"home_baseline"`
	// Kept: an earlier record of this boot was kept.
	Kept       bool    `json:"kept"`
	Processes  int     `json:"processes"`
	Windows    *int    `json:"windows"`
	WindowsWhy string  `json:"windows_why"`
	Writable   int     `json:"writable"`
	Seconds    float64 `json:"seconds"`
}

// cleanResult is what a fast reset did and what it could not undo.
type cleanResult struct {
	// Problems says what is left of the attempt, one sentence each; empty
	// means the guest is back in its clean state.
	Problems []string `json:"problems"`
	// Broken says what keeps a fast reset from working on this guest at
	// all: no clean-state record, no home baseline, a tool that fails.
	Broken []string `json:"broken"`
	// Ended names the processes it ended, "comm(pid)".
	Ended   []string `json:"ended"`
	Windows struct {
		Checked bool     `json:"checked"`
		Why     string   `json:"why"`
		Closed  []string `json:"closed"`
	} `json:"windows"`
	// Restored counts the entries rewritten per restored directory.
	Restored map[string]int `json:"restored"`
	// Changed lists paths changed outside what it restores.
	Changed     []string           `json:"changed"`
	GuestTimeNs int64              `json:"guest_time_ns"`
	Seconds     map[string]float64 `json:"seconds"`
}

// cleanConfig returns the tool's configuration for one call.
func (c Config) cleanConfig() (cleanConfig, error) {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return cleanConfig{}, err
	}
	fr := c.FastReset
	return cleanConfig{
		Nonce:        "legato-" + hex.EncodeToString(b[:]),
		Home:         c.Home,
		HomeBaseline: c.BaselineDir,
		StateDir:     fr.StateDir,
		Restore:      fr.Restore,
		Check:        fr.Check,
		Skip:         fr.Skip,
		ScopeDisplay: fr.Shared,
		CheckOutside: !fr.Shared,
	}, nil
}

// runTool runs the tool's command cmd as root and decodes its answer into
// out. A tool that fails in the guest is an error wrapping ErrFastReset.
func (s *guestShell) runTool(ctx context.Context, cmd string, cfg cleanConfig, out any) error {
	raw, err := json.Marshal(cfg)
	if err != nil {
		return err
	}
	res, err := s.runRoot(ctx, runPython, cleanStateTool, cmd, string(raw))
	if err != nil {
		return err
	}
	if res.ReturnCode != 0 {
		return fmt.Errorf("%w: clean-state tool %s: exit %d: %s", ErrFastReset, cmd, res.ReturnCode, clip(lastLines(res.Error+res.Output, 6)))
	}
	if err := json.Unmarshal([]byte(res.Output), out); err != nil {
		return fmt.Errorf("%w: clean-state tool %s: answer %q: %v", ErrFastReset, cmd, clip(res.Output), err)
	}
	return nil
}

// recordClean records the guest's clean state, and makes the home
// baseline if there is none.
func (s *guestShell) recordClean(ctx context.Context, cfg cleanConfig) (recordResult, error) {
	var r recordResult
	if err := s.runTool(ctx, "record", cfg, &r); err != nil {
		return r, fmt.Errorf("record the clean state: %w", err)
	}
	return r, nil
}

// resetClean brings the guest back to its recorded clean state. An error
// wrapping ErrFastReset says what it could not undo; the result is filled
// in as far as the tool got.
func (s *guestShell) resetClean(ctx context.Context, cfg cleanConfig) (cleanResult, error) {
	var r cleanResult
	if err := s.runTool(ctx, "reset", cfg, &r); err != nil {
		return r, fmt.Errorf("fast reset: %w", err)
	}
	if len(r.Broken) > 0 {
		return r, fmt.Errorf("%w: %s", ErrFastReset, strings.Join(r.Broken, "; "))
	}
	if len(r.Problems) > 0 {
		return r, fmt.Errorf("%w: %w: %s", ErrFastReset, errLeft, strings.Join(r.Problems, "; "))
	}
	return r, nil
}

// errLeft is wrapped by a fast reset's error when it worked but something
// of the earlier attempt is left.
var errLeft = errors.New("left of the earlier attempt")

// lastLines returns the last n lines of s: the end of a traceback says
// what failed.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
