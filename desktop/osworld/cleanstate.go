package osworld

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"legato/rl/desktop"
	"legato/rl/desktop/osworld/guest"
	"legato/rl/desktop/osworld/vm"
)

// guestTool is legato's in-guest program: it records the clean state,
// brings a guest back to it, and is the ready signal's probe. It is sent
// with every call, so a guest needs only python3 (an OSWorld image has it:
// its guest server is Python); once recorded, a guest keeps it compiled
// under guestToolCache and calls import it instead of compiling it again.
var (
	//go:embed guestpy/x11.py
	x11Src string
	//go:embed guestpy/cleanstate.py
	cleanStateSrc string
	//go:embed guestpy/quiet.py
	quietSrc string
	//go:embed guestpy/launched.py
	launchedSrc string
	//go:embed guestpy/helper.py
	helperSrc string
	//go:embed guestpy/main.py
	mainSrc string

	guestTool = strings.Join([]string{x11Src, cleanStateSrc, quietSrc, launchedSrc, helperSrc, mainSrc}, "\n")
	// guestToolModule names the compiled copy after its text, so that a
	// guest never runs another version's.
	guestToolModule = func() string {
		h := sha256.Sum256([]byte(guestTool))
		return "legato_guest_" + hex.EncodeToString(h[:6])
	}()
)

// runTool runs the tool: $1 is its text, $2 the directory of its compiled
// copy, $3 that copy's module name, $4 and $5 its command and argument. It imports the compiled copy
// when the guest has it. -I -S: the
// tool needs the standard library only, and skipping the site packages
// saves much of Python's start under software emulation.
const runTool = `command -v python3 >/dev/null 2>&1 || { echo "python3 is not installed in the guest" >&2; exit 127; }
exec python3 -I -S -c '
import sys
src, cache, module = sys.argv[1], sys.argv[2], sys.argv[3]
main = None
sys.path.insert(0, cache)
try:
    main = __import__(module).main
except Exception:
    pass
del sys.path[0]
if main is None:
    g = {"__name__": "legato_guest"}
    exec(compile(src, "legato_guest", "exec"), g)
    main = g["main"]
sys.exit(main(sys.argv[4:], src, cache, module))
' "$@"`

// errNoPython means the guest has no python3.
var errNoPython = errors.New("the guest has no python3")

// helperCall asks the guest tool's helper (guestpy/helper.py) to run a
// command: $1 is its directory, $2 the call's nonce, $3 the request. The
// answer comes back through a FIFO named after the nonce. Exit status 91:
// no helper serves there.
const helperCall = `d=$1 nonce=$2 req=$3
r="$d/r-$nonce"
[ -p "$d/req" ] && mkfifo -m 600 "$r" 2>/dev/null || exit 91
trap 'rm -f "$r"' EXIT
timeout 3 sh -c 'printf "%s\n" "$1" > "$2"' legato "$req" "$d/req" || exit 91
timeout 150 cat "$r"`

// helperDown is the exit status of helperCall when no helper answers.
const helperDown = 91

// tool runs a command of the guest tool: through its helper where one runs
// (it runs as root), else as root (through sudo if need be) or as the
// guest server's user. nonce marks the call's processes; "" makes one.
func (s *guestShell) tool(ctx context.Context, root bool, cmd, arg, nonce string) (guest.ExecResult, error) {
	// The record starts the helper: it never goes through one.
	if s.helper != "" && !s.noHelper && cmd != "record" {
		if nonce == "" {
			nonce = newNonce()
		}
		req, err := json.Marshal(map[string]string{"cmd": cmd, "arg": arg, "nonce": nonce})
		if err != nil {
			return guest.ExecResult{}, err
		}
		res, err := s.run(ctx, helperCall, s.helper, nonce, string(req))
		if err != nil || (res.ReturnCode != helperDown && res.ReturnCode != 124) {
			return helperAnswer(res), err
		}
		// No helper (a guest whose record did not start one, or lost
		// it): the tool runs from now on without it.
		s.noHelper = true
	}
	if root {
		return s.runRoot(ctx, runTool, guestTool, s.toolCache, guestToolModule, cmd, arg)
	}
	return s.run(ctx, runTool, guestTool, s.toolCache, guestToolModule, cmd, arg)
}

// helperAnswer turns a helper's answer that reports an error into the
// failed run of the tool it stands for.
func helperAnswer(res guest.ExecResult) guest.ExecResult {
	if res.ReturnCode != 0 {
		return res
	}
	var e struct {
		Error string `json:"error"`
		Trace string `json:"trace"`
	}
	if json.Unmarshal([]byte(res.Output), &e) == nil && e.Error != "" {
		return guest.ExecResult{Status: res.Status, ReturnCode: 1, Error: e.Trace + e.Error}
	}
	return res
}

// newNonce returns a mark for one call's processes in the guest.
func newNonce() string {
	var b [8]byte
	rand.Read(b[:])
	return "legato-" + hex.EncodeToString(b[:])
}

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
	res, err := s.tool(ctx, false, "quiet", strconv.FormatFloat(interval.Seconds(), 'f', 3, 64), "")
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
	// Dedicated says the guest runs nothing but the desktop (a VM this
	// process booted, or --guest-dedicated); otherwise a reset refuses on
	// a guest that looks shared with other work. It does not widen what a
	// reset ends: only the desktop session's processes, either way. VM
	// says the guest is a VM of this process's, with a snapshot to fall
	// back to: a process it must leave running (not the desktop user's,
	// or outside its session) is then something left of the attempt.
	Dedicated bool `json:"dedicated"`
	VM        bool `json:"vm"`
	// RootDesktop says a guest given by URL whose desktop user is root is
	// meant to be (--guest-root-desktop); the tool refuses one otherwise.
	RootDesktop bool `json:"root_desktop"`
	// ScopeDisplay makes the desktop's session the processes whose
	// environment names the guest server's X display, and what they
	// started, alone (a guest that shares its machine); otherwise the
	// guest server's, X server's and window manager's Unix and login
	// sessions are the desktop's too (see fate in guestpy/cleanstate.py).
	ScopeDisplay bool `json:"scope_display"`
	// CheckOutside records and checks what the user may change outside
	// the restored directories, and the Check directories.
	CheckOutside bool `json:"check_outside"`
	// Helper is the directory of the tool's helper, which record starts;
	// "" for none. Cache is where the compiled tool is.
	Helper string `json:"helper,omitempty"`
	Cache  string `json:"cache"`
	// KeepSameBoot keeps a record made earlier in the same boot (a guest
	// given by URL that an earlier run attached to).
	KeepSameBoot bool `json:"keep_same_boot"`
	// ForwardedPorts are the guest ports a VM forwards for tasks
	// (DevTools, VLC): connections the attempt's programs left on them are
	// dropped, so that a setup can listen there again.
	ForwardedPorts []int `json:"forwarded_ports,omitempty"`
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
	// Refused says why the guest may not be fast reset: it looks shared
	// with other work and was not said to be dedicated, or its desktop
	// user is root and was not said to be.
	Refused string `json:"refused"`
	// Session names the processes whose Unix and login sessions the record
	// took for the desktop's (the guest server, the X server, the window
	// manager, where found); none where the scope is the display alone.
	Session []sessionAnchor `json:"session"`
}

// sessionAnchor is a process whose sessions are the desktop's.
type sessionAnchor struct {
	What string `json:"what"`
	PID  int    `json:"pid"`
	Name string `json:"name"`
}

// sessionText says which processes' sessions are the desktop's, for a log.
func (r recordResult) sessionText() string {
	if len(r.Session) == 0 {
		return "its display's processes alone"
	}
	parts := make([]string, len(r.Session))
	for i, a := range r.Session {
		parts[i] = fmt.Sprintf("%s %s (pid %d)", a.What, a.Name, a.PID)
	}
	return strings.Join(parts, ", ")
}

// cleanResult is what a fast reset did and what it could not undo.
type cleanResult struct {
	// Problems says what is left of the attempt, one sentence each; empty
	// means the guest is back in its clean state.
	Problems []string `json:"problems"`
	// Broken says what keeps a fast reset from working on this guest at
	// all: no clean-state record, no home baseline, a tool that fails.
	Broken []string `json:"broken"`
	// Ended names the processes it ended, Spared those started since the
	// clean state that it left alone as not the desktop user's or not of
	// the desktop's session.
	Ended   []desktop.Process `json:"ended"`
	Spared  []desktop.Process `json:"spared"`
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
	fr := c.FastReset
	return cleanConfig{
		Nonce:          newNonce(),
		Home:           c.Home,
		HomeBaseline:   c.BaselineDir,
		StateDir:       fr.StateDir,
		Restore:        fr.Restore,
		Check:          fr.Check,
		Skip:           fr.Skip,
		Dedicated:      c.vmMode() || fr.Dedicated,
		VM:             c.vmMode(),
		RootDesktop:    fr.RootDesktop,
		ScopeDisplay:   fr.Shared,
		CheckOutside:   !fr.Shared,
		Helper:         c.helperDir(),
		Cache:          c.toolCacheDir(),
		ForwardedPorts: c.forwardedTaskPorts(),
	}, nil
}

// bootCacheKey is what a VM's clean state depends on besides the machine
// and the image (vm.Config.BootCacheKey): what the readiness probe puts in
// the guest before the snapshot, the clean-state record (by legato's
// guest tool, with this configuration) and its home baseline.
func (c Config) bootCacheKey() (string, error) {
	cc, err := c.cleanConfig()
	if err != nil {
		return "", err
	}
	cc.Nonce = "" // one call's
	b, err := json.Marshal(struct {
		Version int         `json:"v"`
		Clean   cleanConfig `json:"clean"`
		Tool    string      `json:"tool"`
	}{1, cc, guestToolModule})
	if err != nil {
		return "", fmt.Errorf("boot cache key: %w", err)
	}
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:16]), nil
}

// forwardedTaskPorts are the guest ports a VM forwards for tasks; none for
// a guest given by URL (its ports are not the desktop's alone).
func (c Config) forwardedTaskPorts() []int {
	if !c.vmMode() {
		return nil
	}
	devtools, vlc := c.VM.DevToolsPort, c.VM.VLCPort
	if devtools == 0 {
		devtools = vm.DefaultDevToolsPort
	}
	if vlc == 0 {
		vlc = vm.DefaultVLCPort
	}
	return []int{devtools, vlc}
}

// runTool runs the tool's command cmd as root and decodes its answer into
// out. A tool that fails in the guest is an error wrapping ErrFastReset.
func (s *guestShell) runTool(ctx context.Context, cmd string, cfg cleanConfig, out any) error {
	raw, err := json.Marshal(cfg)
	if err != nil {
		return err
	}
	res, err := s.tool(ctx, true, cmd, string(raw), cfg.Nonce)
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
	if r.Refused != "" {
		return r, fmt.Errorf("record the clean state: %w: %s", ErrSharedGuest, r.Refused)
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

// ErrSharedGuest is wrapped by the error of a guest given by URL that looks
// shared with other work (other users' processes, more than one X server,
// root's processes started outside the desktop's session) and was not said
// to be dedicated (FastResetConfig.Dedicated, --guest-dedicated), or whose
// desktop user is root and was not said to be (FastResetConfig.RootDesktop,
// --guest-root-desktop): a fast reset there could end and delete others'
// work.
var ErrSharedGuest = errors.New("the guest is not known to be dedicated to the desktop")

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

// thaw readies a guest just restored from a snapshot: it moves the clock
// back by off (its measured offset from the host's) and credits seed to
// the kernel's random pool, reseeding its generator, so that guests
// restored from one snapshot neither keep its time nor draw the same
// random numbers. One call, through the helper where one runs.
func (s *guestShell) thaw(ctx context.Context, off time.Duration, seed []byte) error {
	if s.helper == "" || s.noHelper {
		// Without the helper, Python's start would cost a second under
		// software emulation: the shell shifts the clock and mixes the
		// seed into the pool (uncredited: the kernel reseeds from it on
		// its own schedule).
		res, err := s.runRoot(ctx, thawScript, strconv.FormatInt(off.Nanoseconds(), 10), hex.EncodeToString(seed))
		if err != nil {
			return fmt.Errorf("thaw the restored guest: %w", err)
		}
		if res.ReturnCode != 0 {
			return fmt.Errorf("thaw the restored guest (clock %v off): exit %d: %s", off, res.ReturnCode, clip(res.Error))
		}
		return nil
	}
	arg := map[string]any{"seed": hex.EncodeToString(seed)}
	if off.Abs() >= clockTolerance {
		arg["shift_ns"] = off.Nanoseconds()
	}
	raw, err := json.Marshal(arg)
	if err != nil {
		return err
	}
	res, err := s.tool(ctx, true, "thaw", string(raw), "")
	if err != nil {
		return fmt.Errorf("thaw the restored guest: %w", err)
	}
	if res.ReturnCode != 0 {
		return fmt.Errorf("thaw the restored guest (clock %v off): exit %d: %s", off, res.ReturnCode, clip(lastLines(res.Error, 4)))
	}
	return nil
}

// dropCaches writes the guest's dirty pages out and drops its page cache,
// before a snapshot.
func (s *guestShell) dropCaches(ctx context.Context) error {
	res, err := s.tool(ctx, true, "dropcaches", "-", "")
	if err != nil {
		return fmt.Errorf("drop the guest's page cache: %w", err)
	}
	if res.ReturnCode != 0 {
		return fmt.Errorf("drop the guest's page cache: exit %d: %s", res.ReturnCode, clip(lastLines(res.Error, 4)))
	}
	return nil
}
