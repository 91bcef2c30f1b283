// Package setup runs OSWorld task setup steps (a task's "config", or its
// evaluator's "postconfig") against a guest through the guest API.
//
// Every OSWorld step type is handled: download, upload_file, launch, open,
// execute and command, execute_with_verification, activate_window,
// close_window, change_wallpaper, sleep, chrome_open_tabs,
// chrome_close_tabs and update_browse_history. The types that need
// credentials or outside services legato does not have (googledrive, login,
// proxy) are refused with an error wrapping desktop.ErrUnsupported. Each
// step's parameters are decoded into typed values first, with OSWorld's
// names, so a task with a bad step fails before any step runs.
//
// A task's "proxy": true is not refused: OSWorld itself ignores it unless its
// proxy pool is enabled (off by default), and legato's guests have no proxy.
//
// Where OSWorld's controller only logs a failed request (launch,
// activate_window, ...), Controller fails the step: a desktop that did not
// set up as asked would grade the attempt on the wrong state.
//
// A step that starts a program (launch, open, an execute that leaves one
// running in the background) ends once the program's window has mapped,
// when Controller.Windows watches the guest (see programs.go): at most
// Controller.WindowWait, then a warning and on, as OSWorld would.
package setup

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"legato/rl/desktop"
	"legato/rl/desktop/osworld/cdp"
	"legato/rl/desktop/osworld/guest"
	"legato/rl/internal/backoff"
)

// Defaults for Controller's zero fields.
const (
	DefaultScreenWidth    = 1920
	DefaultScreenHeight   = 1080
	DefaultClientPassword = "password" // OSWorld's default for its images
	DefaultUntilTimeout   = 2 * time.Minute
	DefaultUntilInterval  = 300 * time.Millisecond
	DefaultBrowserWait    = 60 * time.Second
	// DefaultHistoryTemplateURL is the empty Chrome history database
	// OSWorld's update_browse_history fills.
	DefaultHistoryTemplateURL = "https://huggingface.co/datasets/xlangai/ubuntu_osworld_file_cache/resolve/main/chrome/44ee5668-ecd5-4366-a6ce-c1c9b8d4e938/history_empty.sqlite?download=true"
	// DefaultHistoryPath is Chrome's history database in the guest.
	DefaultHistoryPath = "~/.config/google-chrome/Default/History"
)

// Controller runs setup steps on one guest. Fields are read, never changed,
// by Run, so one Controller may serve sequential runs; give each desktop its
// own (they share a Cache).
type Controller struct {
	// Guest is the guest to set up. Required.
	Guest *guest.Client
	// Downloads caches the files of download and update_browse_history
	// steps. Required by those steps.
	Downloads *Cache
	// OutputDir receives the stdout/stderr files an execute step asks
	// for, for the evaluator (OSWorld's cache/<task id>). Required by
	// such steps.
	OutputDir string
	// LocalDir is the directory relative local_path values of upload_file
	// steps start from (the OSWorld checkout). Empty means the working
	// directory.
	LocalDir string
	// Browser is the guest browser's debugging endpoint (the forward of
	// the guest's port 9222). Required by chrome_* steps.
	Browser *cdp.Client
	// BrowserWait bounds how long chrome_* steps wait for the browser to
	// answer (it is usually launched by the step before).
	BrowserWait time.Duration
	// ScreenWidth and ScreenHeight fill {SCREEN_WIDTH} and friends.
	ScreenWidth, ScreenHeight int
	// ClientPassword fills {CLIENT_PASSWORD}; it is masked in errors and
	// logs.
	ClientPassword string
	// UntilTimeout bounds the polling of execute steps with "until"
	// (OSWorld polls forever); UntilInterval is the pause between polls.
	UntilTimeout, UntilInterval time.Duration
	// HistoryTemplateURL is the empty Chrome history database
	// update_browse_history starts from; HistoryPath is where it goes in
	// the guest.
	HistoryTemplateURL, HistoryPath string
	// Now is the clock browse history times count from; nil means
	// time.Now.
	Now func() time.Time
	// Windows watches the guest's windows: a step that starts a program
	// (launch, open, an execute that leaves one running in the
	// background) ends once the program's window has mapped, at most
	// WindowWait (default DefaultWindowWait) after the guest server
	// answered. Nil: such steps end when the guest server answers.
	Windows    WindowWaiter
	WindowWait time.Duration
	// Logger receives a line per step; nil discards them.
	Logger *slog.Logger
}

// StepError is a setup step that failed.
type StepError struct {
	// Task is the task's id.
	Task string
	// Index is the step's position, from 1.
	Index int
	// Type is the step's type.
	Type string
	Err  error
}

func (e *StepError) Error() string {
	return fmt.Sprintf("step %d of task %s (%s): %v", e.Index, e.Task, e.Type, e.Err)
}

func (e *StepError) Unwrap() error { return e.Err }

// Why each refused type cannot run, for the error.
var refused = map[string]string{
	"googledrive": "it needs Google Drive credentials (settings_file) and network access",
	"login":       "it logs into a website with stored credentials",
	"proxy":       "it needs OSWorld's proxy pool and network access from the guest",
}

// runner runs one decoded step.
type runner func(ctx context.Context, c *Controller) error

// Check decodes every step of steps (from task) and reports the first one
// that cannot run: unknown type, bad parameters, or a type legato refuses.
// It does no I/O.
func Check(task desktop.Task, steps []desktop.SetupStep) error {
	_, err := plan(task, steps)
	return err
}

func plan(task desktop.Task, steps []desktop.SetupStep) ([]runner, error) {
	runners := make([]runner, len(steps))
	for i, s := range steps {
		r, err := decode(task, s)
		if err != nil {
			return nil, &StepError{Task: task.ID, Index: i + 1, Type: s.Type, Err: err}
		}
		runners[i] = r
	}
	return runners, nil
}

func decode(task desktop.Task, s desktop.SetupStep) (runner, error) {
	if why, ok := refused[s.Type]; ok {
		return nil, fmt.Errorf("task %s cannot run here: %s: %w", task.ID, why, desktop.ErrUnsupported)
	}
	switch s.Type {
	case "download":
		var p downloadParams
		return bind(s, &p, func(ctx context.Context, c *Controller) error { return c.download(ctx, p) })
	case "upload_file":
		var p uploadParams
		return bind(s, &p, func(ctx context.Context, c *Controller) error { return c.uploadFiles(ctx, p) })
	case "launch":
		var p launchParams
		return bind(s, &p, func(ctx context.Context, c *Controller) error { return c.launch(ctx, p) })
	case "open":
		var p pathParams
		return bind(s, &p, func(ctx context.Context, c *Controller) error { return c.Guest.OpenFile(ctx, p.Path) })
	case "execute", "command":
		var p executeParams
		return bind(s, &p, func(ctx context.Context, c *Controller) error { return c.execute(ctx, p) })
	case "execute_with_verification":
		var p verifyParams
		return bind(s, &p, func(ctx context.Context, c *Controller) error { return c.executeVerified(ctx, p) })
	case "activate_window":
		var p windowParams
		return bind(s, &p, func(ctx context.Context, c *Controller) error {
			return c.Guest.ActivateWindow(ctx, guest.Window{Name: p.WindowName, Strict: bool(p.Strict), ByClass: bool(p.ByClass)})
		})
	case "close_window":
		var p windowParams
		return bind(s, &p, func(ctx context.Context, c *Controller) error {
			return c.Guest.CloseWindow(ctx, guest.Window{Name: p.WindowName, Strict: bool(p.Strict), ByClass: bool(p.ByClass)})
		})
	case "change_wallpaper":
		var p pathParams
		return bind(s, &p, func(ctx context.Context, c *Controller) error { return c.Guest.ChangeWallpaper(ctx, p.Path) })
	case "sleep":
		var p sleepParams
		return bind(s, &p, func(ctx context.Context, c *Controller) error { return sleep(ctx, *p.Seconds) })
	case "chrome_open_tabs":
		var p openTabsParams
		return bind(s, &p, func(ctx context.Context, c *Controller) error { return c.openTabs(ctx, p) })
	case "chrome_close_tabs":
		var p closeTabsParams
		return bind(s, &p, func(ctx context.Context, c *Controller) error { return c.closeTabs(ctx, p) })
	case "update_browse_history":
		var p historyParams
		return bind(s, &p, func(ctx context.Context, c *Controller) error { return c.updateHistory(ctx, p) })
	}
	return nil, fmt.Errorf("unknown setup step type %q (known: %s)", s.Type, strings.Join(knownTypes(), ", "))
}

func knownTypes() []string {
	known := []string{"download", "upload_file", "launch", "open", "execute", "command",
		"execute_with_verification", "activate_window", "close_window", "change_wallpaper", "sleep",
		"chrome_open_tabs", "chrome_close_tabs", "update_browse_history"}
	sort.Strings(known)
	return known
}

func bind[P interface{ validate() error }](s desktop.SetupStep, p P, run runner) (runner, error) {
	if err := decodeStrict(s.Parameters, p); err != nil {
		return nil, err
	}
	return run, nil
}

// Run runs steps, the setup of task (its config, or its evaluator's
// postconfig), in order, and stops at the first that fails. Every step is
// checked before the first runs (see Check). Errors are *StepError; one
// wrapping desktop.ErrUnsupported means the task cannot run on legato at
// all.
func (c *Controller) Run(ctx context.Context, task desktop.Task, steps []desktop.SetupStep) error {
	if c.Guest == nil {
		return errors.New("setup: Controller.Guest is nil")
	}
	runners, err := plan(task, steps)
	if err != nil {
		return c.mask(err)
	}
	log := c.logger().With("task", task.ID)
	watch := c.Windows != nil
	for i, run := range runners {
		start := time.Now()
		prog, starts := startedProgram(steps[i])
		var mark WindowMark
		if watch && starts {
			var err error
			if mark, err = c.Windows.MarkWindows(ctx); err != nil {
				if ctx.Err() != nil {
					return c.mask(&StepError{Task: task.ID, Index: i + 1, Type: steps[i].Type, Err: err})
				}
				log.Warn("cannot watch the guest's windows: setup steps that start a program end when the guest server answers",
					"step", i+1, "type", steps[i].Type, "err", err)
				watch = false
			}
		}
		if err := run(ctx, c); err != nil {
			return c.mask(&StepError{Task: task.ID, Index: i + 1, Type: steps[i].Type, Err: err})
		}
		if watch && starts {
			if err := c.waitWindow(ctx, log.With("step", i+1, "type", steps[i].Type), prog, mark); err != nil {
				return c.mask(&StepError{Task: task.ID, Index: i + 1, Type: steps[i].Type, Err: err})
			}
		}
		log.Debug("setup step done", "step", i+1, "type", steps[i].Type, "seconds", time.Since(start).Seconds())
	}
	return nil
}

// waitWindow waits until the window of the program a step started has
// mapped, at most WindowWait. A program that maps none by then is warned
// about, not failed: OSWorld would go on too. Only the end of ctx is an
// error.
func (c *Controller) waitWindow(ctx context.Context, log *slog.Logger, prog program, mark WindowMark) error {
	max := orDefault(c.WindowWait, DefaultWindowWait)
	seen, err := c.Windows.WaitWindow(ctx, mark, prog.want, max)
	switch {
	case ctx.Err() != nil:
		if err != nil {
			return err
		}
		return ctx.Err()
	case err != nil:
		log.Warn("cannot watch for the window of the program the setup step started; going on without it",
			"program", prog.name, "command", c.maskText(prog.command), "err", err)
	case seen.Window == nil:
		others := make([]string, len(seen.Others))
		for i, w := range seen.Others {
			others[i] = w.String()
		}
		log.Warn("the program the setup step started mapped no window in time; going on (the setup's settle alone decides when its screen is ready)",
			"program", prog.name, "command", c.maskText(prog.command), "waited", max, "other_new_windows", others)
	default:
		log.Info("the program the setup step started mapped its window", "program", prog.name,
			"window", seen.Window.String(), "pid", seen.Window.PID, "seconds", seen.Waited.Seconds())
	}
	return nil
}

// maskText hides the client password in a text for a log.
func (c *Controller) maskText(s string) string {
	return strings.ReplaceAll(s, c.password(), "***")
}

func (c *Controller) logger() *slog.Logger {
	if c.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return c.Logger
}

// masked hides the client password in an error's message; errors.Is and
// errors.As still see the cause.
type masked struct {
	err    error
	secret string
}

func (m *masked) Error() string { return strings.ReplaceAll(m.err.Error(), m.secret, "***") }
func (m *masked) Unwrap() error { return m.err }

func (c *Controller) mask(err error) error {
	pw := c.password()
	if err == nil || pw == "" || !strings.Contains(err.Error(), pw) {
		return err
	}
	return &masked{err: err, secret: pw}
}

func (c *Controller) password() string {
	if c.ClientPassword == "" {
		return DefaultClientPassword
	}
	return c.ClientPassword
}

// placeholders fills OSWorld's {CLIENT_PASSWORD}, {SCREEN_WIDTH},
// {SCREEN_HEIGHT}, {SCREEN_WIDTH_HALF} and {SCREEN_HEIGHT_HALF}.
func (c *Controller) placeholders() *strings.Replacer {
	w, h := c.ScreenWidth, c.ScreenHeight
	if w <= 0 || h <= 0 {
		w, h = DefaultScreenWidth, DefaultScreenHeight
	}
	return strings.NewReplacer(
		"{CLIENT_PASSWORD}", c.password(),
		"{SCREEN_WIDTH_HALF}", strconv.Itoa(w/2),
		"{SCREEN_HEIGHT_HALF}", strconv.Itoa(h/2),
		"{SCREEN_WIDTH}", strconv.Itoa(w),
		"{SCREEN_HEIGHT}", strconv.Itoa(h),
	)
}

func toGuest(cmd command, shell pyBool) guest.Command {
	if cmd.isList {
		return guest.Command{Args: cmd.args, Shell: bool(shell)}
	}
	return guest.Command{Line: cmd.line, Shell: bool(shell)}
}

func (c *Controller) download(ctx context.Context, p downloadParams) error {
	if c.Downloads == nil {
		return errors.New("download step needs Controller.Downloads")
	}
	for _, f := range p.Files {
		local, err := c.Downloads.Fetch(ctx, f.URL)
		if err != nil {
			return err
		}
		if err := c.Guest.UploadFile(ctx, f.Path, local); err != nil {
			return fmt.Errorf("%s: %w", f.URL, err)
		}
	}
	return nil
}

func (c *Controller) uploadFiles(ctx context.Context, p uploadParams) error {
	for _, f := range p.Files {
		local := f.LocalPath
		if !filepath.IsAbs(local) && c.LocalDir != "" {
			local = filepath.Join(c.LocalDir, local)
		}
		if err := c.Guest.UploadFile(ctx, f.Path, local); err != nil {
			return err
		}
	}
	return nil
}

func (c *Controller) launch(ctx context.Context, p launchParams) error {
	cmd := p.Command
	// OSWorld splits a one-string command at spaces when there is no shell.
	if !cmd.isList && !bool(p.Shell) && len(strings.Fields(cmd.line)) > 1 {
		cmd = command{isList: true, args: strings.Fields(cmd.line)}
	}
	return c.Guest.Launch(ctx, toGuest(cmd, p.Shell))
}

func (c *Controller) execute(ctx context.Context, p executeParams) error {
	r := c.placeholders()
	cmd := toGuest(p.Command.mapStrings(r.Replace), p.Shell)
	if (p.Stdout != "" || p.Stderr != "") && c.OutputDir == "" {
		return errors.New("execute step saves its output but Controller.OutputDir is empty")
	}
	var deadline time.Time
	if p.Until.set() {
		deadline = time.Now().Add(orDefault(c.UntilTimeout, DefaultUntilTimeout))
	}
	for polls := 1; ; polls++ {
		res, err := c.Guest.SetupExecute(ctx, cmd)
		if err != nil {
			return err
		}
		if err := c.saveOutput(p, res); err != nil {
			return err
		}
		if !p.Until.set() || p.Until.holds(res) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("command %q did not reach its until condition in %v (%d polls; last exit %d)",
				cmd.String(), orDefault(c.UntilTimeout, DefaultUntilTimeout), polls, res.ReturnCode)
		}
		if err := backoff.Sleep(ctx, orDefault(c.UntilInterval, DefaultUntilInterval)); err != nil {
			return err
		}
	}
}

func (u *until) holds(res guest.ExecResult) bool {
	return (u.ReturnCode != nil && res.ReturnCode == *u.ReturnCode) ||
		(u.Stdout != nil && strings.Contains(res.Output, *u.Stdout)) ||
		(u.Stderr != nil && strings.Contains(res.Error, *u.Stderr))
}

func (c *Controller) saveOutput(p executeParams, res guest.ExecResult) error {
	for _, f := range []struct{ name, text string }{{p.Stdout, res.Output}, {p.Stderr, res.Error}} {
		if f.name == "" {
			continue
		}
		path := filepath.Join(c.OutputDir, filepath.FromSlash(f.name))
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(path, []byte(f.text), 0o644); err != nil {
			return err
		}
	}
	return nil
}

func (c *Controller) executeVerified(ctx context.Context, p verifyParams) error {
	v := guest.Verification{}
	if p.Verification != nil {
		v.WindowExists, v.CommandSuccess = p.Verification.WindowExists, p.Verification.CommandSuccess
	}
	if p.MaxWaitTime != nil {
		v.MaxWait = time.Duration(*p.MaxWaitTime * float64(time.Second))
	}
	if p.CheckInterval != nil {
		v.CheckInterval = time.Duration(*p.CheckInterval * float64(time.Second))
	}
	_, err := c.Guest.ExecuteWithVerification(ctx, toGuest(p.Command, p.Shell), v)
	return err
}

func orDefault(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}

func sleep(ctx context.Context, seconds float64) error {
	return backoff.Sleep(ctx, time.Duration(seconds*float64(time.Second)))
}
