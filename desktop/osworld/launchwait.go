package osworld

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"legato/rl/desktop/osworld/setup"
)

// The desktop's setup.WindowWaiter: the guest tool's windowmark and
// windowwait (guestpy/launched.py), one round trip each, through its
// helper where one runs.

var _ setup.WindowWaiter = (*guestShell)(nil)

// windowWaitCall is the longest one windowwait call waits in the guest: a
// longer wait is several calls. The helper serves one call at a time, so a
// wait the host gave up holds it that long at most.
const windowWaitCall = 10 * time.Second

// MarkWindows notes the windows the guest shows and the time its processes
// count from, before a setup step starts a program.
func (s *guestShell) MarkWindows(ctx context.Context) (setup.WindowMark, error) {
	res, err := s.tool(ctx, false, "windowmark", "-", "")
	if err != nil {
		return nil, err
	}
	if err := toolFailed("window mark", res.ReturnCode, res.Error+res.Output); err != nil {
		return nil, err
	}
	var m struct {
		Ticks   *int64   `json:"ticks"`
		Windows []string `json:"windows"`
	}
	if err := json.Unmarshal([]byte(res.Output), &m); err != nil || m.Ticks == nil {
		return nil, fmt.Errorf("window mark: answer %q: want ticks and windows", clip(res.Output))
	}
	return setup.WindowMark(res.Output), nil
}

// WaitWindow waits until a window want counts has mapped, at most max: in
// calls of at most windowWaitCall, each waiting in the guest on the X
// server's events.
func (s *guestShell) WaitWindow(ctx context.Context, mark setup.WindowMark, want setup.WantedWindow, max time.Duration) (setup.WindowSeen, error) {
	t0 := time.Now()
	var seen setup.WindowSeen
	for {
		left := max - time.Since(t0)
		if left <= 0 {
			break
		}
		arg, err := json.Marshal(struct {
			setup.WantedWindow
			Mark    json.RawMessage `json:"mark"`
			Seconds float64         `json:"seconds"`
		}{want, json.RawMessage(mark), min(left, windowWaitCall).Seconds()})
		if err != nil {
			return seen, err
		}
		res, err := s.tool(ctx, false, "windowwait", string(arg), "")
		if err != nil {
			return seen, err
		}
		if err := toolFailed("window wait", res.ReturnCode, res.Error+res.Output); err != nil {
			return seen, err
		}
		var got setup.WindowSeen
		if err := json.Unmarshal([]byte(res.Output), &got); err != nil {
			return seen, fmt.Errorf("window wait: answer %q: %v", clip(res.Output), err)
		}
		seen.Window, seen.Others = got.Window, got.Others
		if seen.Window != nil {
			break
		}
	}
	seen.Waited = time.Since(t0)
	return seen, nil
}

// toolFailed is the error of a guest tool call that exited with code.
func toolFailed(what string, code int, out string) error {
	switch code {
	case 0:
		return nil
	case 127:
		return fmt.Errorf("%w: %s", errNoPython, clip(out))
	}
	return fmt.Errorf("%s: exit %d: %s", what, code, clip(lastLines(out, 6)))
}
