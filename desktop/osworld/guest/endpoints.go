package guest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"image/png"
	"io"
	"math"
	"mime/multipart"
	"net/http"
	"net/url"
	"os"
	"path"
	"strings"
	"time"
)

// PyautoguiPrefix starts every action program, exactly as OSWorld's
// controller writes it: the guest runs `python -c PyautoguiPrefix+code`.
const PyautoguiPrefix = "import pyautogui; import time; pyautogui.FAILSAFE = False; "

// Size limits on answers read into memory.
const (
	maxScreenshot = 64 << 20
	maxJSON       = 64 << 20
)

// Command is a program for the guest to run, in OSWorld's form: a list of
// arguments or one command line, with or without a shell.
type Command struct {
	// Args is the program and its arguments. It wins over Line when set.
	// With Shell, the guest hands the list to /bin/sh the way Python's
	// subprocess does: Args[0] is the shell script, the rest its $0, $1, …
	Args []string
	// Line is one command line: split into arguments like a POSIX shell
	// would by the guest when Shell is false, run by /bin/sh when true.
	Line string
	// Shell runs the command through /bin/sh.
	Shell bool
}

// Argv returns the command that runs a program with arguments, no shell.
func Argv(args ...string) Command { return Command{Args: args} }

// ShellLine returns the command that runs line with /bin/sh.
func ShellLine(line string) Command { return Command{Line: line, Shell: true} }

// String returns the command as a line, for messages.
func (c Command) String() string {
	if c.Args != nil {
		return strings.Join(c.Args, " ")
	}
	return c.Line
}

func (c Command) validate() error {
	if len(c.Args) == 0 && strings.TrimSpace(c.Line) == "" {
		return errors.New("empty command")
	}
	return nil
}

// MarshalJSON writes the command's fields of an OSWorld request:
// {"command": [...] or "...", "shell": bool}.
func (c Command) MarshalJSON() ([]byte, error) {
	type wire struct {
		Command any  `json:"command"`
		Shell   bool `json:"shell"`
	}
	w := wire{Command: c.Line, Shell: c.Shell}
	if c.Args != nil {
		w.Command = c.Args
	}
	return json.Marshal(w)
}

// ExecResult is what a command run by the guest produced.
type ExecResult struct {
	// Status is "success" when the command ran (whatever its exit code).
	Status string `json:"status"`
	// Output and Error are the command's standard output and error.
	Output string `json:"output"`
	Error  string `json:"error"`
	// ReturnCode is the command's exit status.
	ReturnCode int `json:"returncode"`
}

// Execute runs cmd in the guest (POST /execute) and waits for it; the guest
// stops it after 120 s. A command that runs and exits non-zero is not an
// error: see ExecResult.ReturnCode.
func (c *Client) Execute(ctx context.Context, cmd Command) (ExecResult, error) {
	return c.execute(ctx, "execute", "/execute", cmd)
}

// SetupExecute is Execute through /setup/execute, the endpoint OSWorld's
// setup steps use; both run the command the same way.
func (c *Client) SetupExecute(ctx context.Context, cmd Command) (ExecResult, error) {
	return c.execute(ctx, "setup/execute", "/setup/execute", cmd)
}

func (c *Client) execute(ctx context.Context, op, p string, cmd Command) (ExecResult, error) {
	var res ExecResult
	if err := cmd.validate(); err != nil {
		return res, &Error{Op: op, URL: c.base.JoinPath(p).String(), Err: err}
	}
	err := c.postJSONInto(ctx, op, p, c.timeouts.Execute, cmd, &res)
	return res, err
}

// RunPyautogui runs a pyautogui program in the guest the way OSWorld runs an
// action: `python -c "import pyautogui; import time; pyautogui.FAILSAFE =
// False; <code>"` through /execute. A program that raises is not an error:
// its exit code and traceback are in the result.
func (c *Client) RunPyautogui(ctx context.Context, code string) (ExecResult, error) {
	return c.Execute(ctx, Argv("python", "-c", PyautoguiPrefix+code))
}

// Verification is what execute_with_verification waits for after running
// the command.
type Verification struct {
	// WindowExists waits for a window whose title contains this text
	// (case-insensitive).
	WindowExists string `json:"window_exists,omitempty"`
	// CommandSuccess waits for this shell command to exit 0.
	CommandSuccess string `json:"command_success,omitempty"`
	// MaxWait bounds the wait (OSWorld's default: 10 s).
	MaxWait time.Duration `json:"-"`
	// CheckInterval is the time between checks (OSWorld's default: 1 s).
	CheckInterval time.Duration `json:"-"`
}

// VerifiedResult is the answer of execute_with_verification.
type VerifiedResult struct {
	ExecResult
	// Verification is "passed", or empty when nothing was to be verified.
	Verification string `json:"verification"`
	// WaitTime is how long the verification took, in seconds.
	WaitTime float64 `json:"wait_time"`
}

// ExecuteWithVerification runs cmd, then waits until v holds
// (POST /setup/execute_with_verification). When v does not hold in time the
// error matches ErrVerificationFailed and the result still carries the
// command's output.
func (c *Client) ExecuteWithVerification(ctx context.Context, cmd Command, v Verification) (VerifiedResult, error) {
	const op, p = "setup/execute_with_verification", "/setup/execute_with_verification"
	var res VerifiedResult
	if err := cmd.validate(); err != nil {
		return res, &Error{Op: op, URL: c.base.JoinPath(p).String(), Err: err}
	}
	if v.MaxWait <= 0 {
		v.MaxWait = 10 * time.Second
	}
	if v.CheckInterval <= 0 {
		v.CheckInterval = time.Second
	}
	raw, err := flattenJSON(cmd, map[string]any{
		"verification":   v,
		"max_wait_time":  v.MaxWait.Seconds(),
		"check_interval": v.CheckInterval.Seconds(),
	})
	if err != nil {
		return res, &Error{Op: op, URL: c.base.JoinPath(p).String(), Err: err}
	}
	err = c.postRawInto(ctx, op, p, c.timeouts.VerifySlack+v.MaxWait, raw, &res)
	var ge *Error
	if errors.As(err, &ge) && ge.Status == http.StatusInternalServerError && ge.raw != nil {
		var failed VerifiedResult
		if json.Unmarshal(ge.raw, &failed) == nil && failed.Status == "verification_failed" {
			ge.Err = ErrVerificationFailed
			return failed, err
		}
	}
	return res, err
}

// flattenJSON merges extra fields into the JSON object v marshals to.
func flattenJSON(v any, extra map[string]any) ([]byte, error) {
	raw, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	m := map[string]any{}
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, err
	}
	for k, x := range extra {
		m[k] = x
	}
	return json.Marshal(m)
}

// Launch starts cmd in the guest without waiting for it to end
// (POST /setup/launch).
func (c *Client) Launch(ctx context.Context, cmd Command) error {
	const op, p = "setup/launch", "/setup/launch"
	if err := cmd.validate(); err != nil {
		return &Error{Op: op, URL: c.base.JoinPath(p).String(), Err: err}
	}
	return c.postJSONInto(ctx, op, p, c.timeouts.Launch, cmd, nil)
}

// OpenFile opens a file (or starts a program by name) in the guest and waits
// until a window named after it appears and is activated
// (POST /setup/open_file). It waits at most Timeouts.OpenFile, and asks the
// guest to give up a little earlier so that the guest's own message explains
// a window that never came.
func (c *Client) OpenFile(ctx context.Context, path string) error {
	const op, p = "setup/open_file", "/setup/open_file"
	if path == "" {
		return &Error{Op: op, URL: c.base.JoinPath(p).String(), Err: errors.New("empty path")}
	}
	limit := c.timeouts.OpenFile
	guestWait := limit - 5*time.Second
	if guestWait < limit/2 {
		guestWait = limit / 2
	}
	body := map[string]any{"path": path, "timeout_seconds": math.Round(guestWait.Seconds())}
	return c.postJSONInto(ctx, op, p, limit, body, nil)
}

// Window selects windows for ActivateWindow and CloseWindow, as OSWorld's
// server does with wmctrl.
type Window struct {
	// Name is matched against window titles (or classes with ByClass).
	Name string `json:"window_name"`
	// Strict matches the whole name, case-sensitively.
	Strict bool `json:"strict"`
	// ByClass matches the window class instead of the title.
	ByClass bool `json:"by_class"`
}

// ActivateWindow raises and focuses a window (POST /setup/activate_window).
// Like OSWorld's server, the guest does not report a window it did not find.
func (c *Client) ActivateWindow(ctx context.Context, w Window) error {
	return c.window(ctx, "setup/activate_window", "/setup/activate_window", w)
}

// CloseWindow asks a window to close (POST /setup/close_window). Like
// OSWorld's server, the guest does not report a window it did not find.
func (c *Client) CloseWindow(ctx context.Context, w Window) error {
	return c.window(ctx, "setup/close_window", "/setup/close_window", w)
}

func (c *Client) window(ctx context.Context, op, p string, w Window) error {
	if w.Name == "" {
		return &Error{Op: op, URL: c.base.JoinPath(p).String(), Err: errors.New("empty window name")}
	}
	return c.postJSONInto(ctx, op, p, c.timeouts.Window, w, nil)
}

// ChangeWallpaper sets the desktop background to an image already in the
// guest (POST /setup/change_wallpaper).
func (c *Client) ChangeWallpaper(ctx context.Context, path string) error {
	const op, p = "setup/change_wallpaper", "/setup/change_wallpaper"
	if path == "" {
		return &Error{Op: op, URL: c.base.JoinPath(p).String(), Err: errors.New("empty path")}
	}
	return c.postJSONInto(ctx, op, p, c.timeouts.Window, map[string]string{"path": path}, nil)
}

// Upload writes size bytes read from content to guestPath in the guest,
// creating its directory (POST /setup/upload, multipart fields file_path and
// file_data). The body is streamed, never held in memory.
func (c *Client) Upload(ctx context.Context, guestPath string, content io.Reader, size int64) error {
	const op, p = "setup/upload", "/setup/upload"
	if guestPath == "" || size < 0 {
		return &Error{Op: op, URL: c.base.JoinPath(p).String(),
			Err: fmt.Errorf("bad upload: path %q, size %d", guestPath, size)}
	}
	body, n, ctype, err := multipartFile(guestPath, content, size)
	if err != nil {
		return &Error{Op: op, URL: c.base.JoinPath(p).String(), Err: err}
	}
	cl, err := c.do(ctx, request{op: op, method: http.MethodPost, path: p, timeout: c.timeouts.Transfer,
		body: body, size: n, ctype: ctype})
	if err != nil {
		return err
	}
	_, err = cl.readAll(maxJSON)
	return err
}

// UploadFile uploads the host file localPath to guestPath.
func (c *Client) UploadFile(ctx context.Context, guestPath, localPath string) error {
	f, err := os.Open(localPath)
	if err != nil {
		return fmt.Errorf("upload %s: %w", guestPath, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return fmt.Errorf("upload %s: %w", guestPath, err)
	}
	if !st.Mode().IsRegular() {
		return fmt.Errorf("upload %s: %s is not a regular file", guestPath, localPath)
	}
	return c.Upload(ctx, guestPath, f, st.Size())
}

// switchWriter lets one multipart.Writer write its header and its trailer
// into different buffers, so the file between them can be streamed.
type switchWriter struct{ w io.Writer }

func (s *switchWriter) Write(p []byte) (int, error) { return s.w.Write(p) }

// multipartFile builds a multipart/form-data body of known length holding
// the field file_path and the file file_data.
func multipartFile(guestPath string, content io.Reader, size int64) (io.Reader, int64, string, error) {
	var head, tail bytes.Buffer
	sw := &switchWriter{w: &head}
	mw := multipart.NewWriter(sw)
	if err := mw.WriteField("file_path", guestPath); err != nil {
		return nil, 0, "", err
	}
	if _, err := mw.CreateFormFile("file_data", path.Base(guestPath)); err != nil {
		return nil, 0, "", err
	}
	sw.w = &tail
	if err := mw.Close(); err != nil {
		return nil, 0, "", err
	}
	n := int64(head.Len()) + size + int64(tail.Len())
	return io.MultiReader(&head, io.LimitReader(content, size), &tail), n, mw.FormDataContentType(), nil
}

// File returns the content of a file in the guest (POST /file). A missing
// file is an error matching ErrNotFound.
func (c *Client) File(ctx context.Context, guestPath string) ([]byte, error) {
	var buf bytes.Buffer
	if _, err := c.CopyFile(ctx, guestPath, &buf); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// CopyFile streams a file of the guest into w (POST /file) and returns how
// many bytes it copied.
func (c *Client) CopyFile(ctx context.Context, guestPath string, w io.Writer) (int64, error) {
	const op, p = "file", "/file"
	if guestPath == "" {
		return 0, &Error{Op: op, URL: c.base.JoinPath(p).String(), Err: errors.New("empty path")}
	}
	form := url.Values{"file_path": {guestPath}}.Encode()
	cl, err := c.do(ctx, request{op: op, method: http.MethodPost, path: p, timeout: c.timeouts.Transfer,
		body: strings.NewReader(form), size: int64(len(form)), ctype: "application/x-www-form-urlencoded"})
	if err != nil {
		return 0, err
	}
	defer cl.close()
	n, err := io.Copy(w, cl.resp.Body)
	if err != nil {
		return n, cl.fail(classify(cl.ctx, cl.callCtx, err, cl.timeout))
	}
	if cl.resp.ContentLength >= 0 && n != cl.resp.ContentLength {
		return n, cl.fail(fmt.Errorf("%w: got %d of %d bytes", ErrUnreachable, n, cl.resp.ContentLength))
	}
	return n, nil
}

// Screenshot is a PNG of the guest's screen.
type Screenshot struct {
	PNG           []byte
	Width, Height int
}

var pngMagic = []byte("\x89PNG\r\n\x1a\n")

// Screenshot returns a PNG of the whole screen (GET /screenshot) and its
// size. An answer that is not a PNG is an error matching ErrBadResponse.
func (c *Client) Screenshot(ctx context.Context) (Screenshot, error) {
	return c.screenshot(ctx, c.timeouts.Screenshot)
}

func (c *Client) screenshot(ctx context.Context, timeout time.Duration) (Screenshot, error) {
	const op = "screenshot"
	cl, err := c.do(ctx, request{op: op, method: http.MethodGet, path: "/screenshot", timeout: timeout})
	if err != nil {
		return Screenshot{}, err
	}
	u, status := cl.url, cl.resp.StatusCode
	data, err := cl.readAll(maxScreenshot)
	if err != nil {
		return Screenshot{}, err
	}
	if !bytes.HasPrefix(data, pngMagic) {
		return Screenshot{}, &Error{Op: op, URL: u, Status: status,
			Err: fmt.Errorf("%w: not a PNG (%d bytes)", ErrBadResponse, len(data))}
	}
	cfg, err := png.DecodeConfig(bytes.NewReader(data))
	if err != nil {
		return Screenshot{}, &Error{Op: op, URL: u, Status: status, Err: fmt.Errorf("%w: %w", ErrBadResponse, err)}
	}
	return Screenshot{PNG: data, Width: cfg.Width, Height: cfg.Height}, nil
}

// Accessibility returns the accessibility tree of the screen as XML
// (GET /accessibility, field "AT").
func (c *Client) Accessibility(ctx context.Context) (string, error) {
	var res struct {
		AT *string `json:"AT"`
	}
	if err := c.getJSON(ctx, "accessibility", "/accessibility", c.timeouts.Accessibility, &res); err != nil {
		return "", err
	}
	if res.AT == nil {
		return "", &Error{Op: "accessibility", URL: c.base.JoinPath("/accessibility").String(),
			Err: fmt.Errorf("%w: no \"AT\" field", ErrBadResponse)}
	}
	return *res.AT, nil
}

// Terminal returns the text of the active terminal (GET /terminal); ok is
// false when the guest found none.
func (c *Client) Terminal(ctx context.Context) (output string, ok bool, err error) {
	var res struct {
		Output *string `json:"output"`
	}
	if err := c.getJSON(ctx, "terminal", "/terminal", c.timeouts.Query, &res); err != nil {
		return "", false, err
	}
	if res.Output == nil {
		return "", false, nil
	}
	return *res.Output, true, nil
}

// ScreenSize returns the guest's screen size in pixels (POST /screen_size).
func (c *Client) ScreenSize(ctx context.Context) (width, height int, err error) {
	var res struct {
		Width  int `json:"width"`
		Height int `json:"height"`
	}
	if err := c.postRawInto(ctx, "screen_size", "/screen_size", c.timeouts.Query, nil, &res); err != nil {
		return 0, 0, err
	}
	return res.Width, res.Height, nil
}

// CursorPosition returns where the pointer is (GET /cursor_position).
func (c *Client) CursorPosition(ctx context.Context) (x, y int, err error) {
	var res []int
	if err := c.getJSON(ctx, "cursor_position", "/cursor_position", c.timeouts.Query, &res); err != nil {
		return 0, 0, err
	}
	if len(res) != 2 {
		return 0, 0, &Error{Op: "cursor_position", URL: c.base.JoinPath("/cursor_position").String(),
			Err: fmt.Errorf("%w: want [x, y], got %v", ErrBadResponse, res)}
	}
	return res[0], res[1], nil
}

// WaitReady polls the guest until it serves a screenshot, each try bounded
// by perTry, all of them by overall. A QEMU port forward accepts connections
// before the guest listens and then stays silent, so short tries are what
// tell a booting guest from a slow one. When overall passes, the error
// matches ErrTimeout and carries the last try's error.
func (c *Client) WaitReady(ctx context.Context, perTry, overall time.Duration) error {
	const op = "wait ready"
	if perTry <= 0 || overall <= 0 {
		return &Error{Op: op, URL: c.URL(), Err: fmt.Errorf("bad wait: per try %v, overall %v", perTry, overall)}
	}
	errOver := errors.New("overall wait over")
	wctx, cancel := context.WithTimeoutCause(ctx, overall, errOver)
	defer cancel()
	const pause = 250 * time.Millisecond
	start := time.Now()
	tries := 0
	for {
		tries++
		_, err := c.screenshot(wctx, perTry)
		if err == nil {
			c.log.Debug("guest ready", "url", c.URL(), "tries", tries, "seconds", time.Since(start).Seconds())
			return nil
		}
		if ctx.Err() != nil {
			return &Error{Op: op, URL: c.URL(), Err: fmt.Errorf("%w (last try: %v)", context.Cause(ctx), err)}
		}
		if wctx.Err() != nil {
			return &Error{Op: op, URL: c.URL(), Err: fmt.Errorf("%w: not ready after %v (%d tries): %w; last try: %v",
				ErrTimeout, overall, tries, ErrUnreachable, err)}
		}
		t := time.NewTimer(pause)
		select {
		case <-wctx.Done():
			t.Stop()
		case <-t.C:
		}
	}
}

// getJSON calls GET path and decodes the JSON answer into out.
func (c *Client) getJSON(ctx context.Context, op, p string, timeout time.Duration, out any) error {
	cl, err := c.do(ctx, request{op: op, method: http.MethodGet, path: p, timeout: timeout})
	if err != nil {
		return err
	}
	return cl.decode(out)
}

// postJSONInto posts v as JSON and decodes the JSON answer into out (or
// discards the answer when out is nil).
func (c *Client) postJSONInto(ctx context.Context, op, p string, timeout time.Duration, v, out any) error {
	raw, err := json.Marshal(v)
	if err != nil {
		return &Error{Op: op, URL: c.base.JoinPath(p).String(), Err: err}
	}
	return c.postRawInto(ctx, op, p, timeout, raw, out)
}

func (c *Client) postRawInto(ctx context.Context, op, p string, timeout time.Duration, raw []byte, out any) error {
	r := request{op: op, method: http.MethodPost, path: p, timeout: timeout}
	if raw != nil {
		r.body, r.size, r.ctype = bytes.NewReader(raw), int64(len(raw)), "application/json"
	}
	cl, err := c.do(ctx, r)
	if err != nil {
		return err
	}
	if out == nil {
		_, err := cl.readAll(maxJSON)
		return err
	}
	return cl.decode(out)
}

// decode reads the JSON answer into out and closes the call.
func (cl *call) decode(out any) error {
	body, err := cl.readAll(maxJSON)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(body, out); err != nil {
		e := cl.fail(fmt.Errorf("%w: %w", ErrBadResponse, err))
		e.Body = truncate(string(body), maxErrorBody)
		return e
	}
	return nil
}

func truncate(s string, n int) string {
	s = strings.ToValidUTF8(s, "?")
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
