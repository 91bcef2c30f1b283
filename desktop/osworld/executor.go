package osworld

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	"legato/rl/desktop/osworld/guest"
)

// The executor is a Python program (guestpy/executor.py) that a Reset
// starts in the guest through /setup/launch: it imports pyautogui once and
// runs the attempt's actions, each handed to it by a small /execute, as
// `python -c PREFIX+CODE` would run them (the same output, exit status and
// tracebacks, pyautogui's settings as imported), without an interpreter's
// start and pyautogui's import per action. It also answers when the screen
// has settled after an action, in one round trip. It reaches the guest
// only through its server's API, never through a port of its own.
//
// A fast reset ends it with every other process of the attempt, and the
// clean snapshot never holds it (it is taken before any reset), so every
// reset starts a new one, except the load of a golden state: that was
// taken after the task's setup with the executor running, and brings it
// back ready. Where it does not run or stops answering, actions run
// through `python -c` and the ready signal probes the guest, as without
// it, until the next reset.
var (
	//go:embed guestpy/executor.py
	executorPySrc string
	//go:embed guestpy/shot.py
	shotPySrc string
	// executorSrc is the program's text: the X protocol (x11.py), the
	// load reading (quiet.py) and the screenshot (shot.py) come first.
	executorSrc = strings.Join([]string{x11Src, quietSrc, shotPySrc, executorPySrc}, "\n")
)

// executorCall hands one request to the executor: $1 is its directory, $2
// the request's nonce, $3 the request, $4 how long to wait for the
// executor to start (in 50 ms ticks; it has not answered yet). It waits
// while the executor starts and imports pyautogui, then answers its JSON
// reply through a FIFO of its own. The executor opens that FIFO before it
// runs the request (a reply that ends empty means it died meanwhile); until
// it does, a watchdog answers "gone" for an executor that ended, and the
// request did not run. An executor that ended is a zombie until the guest
// server reaps it: alive looks at its state. Shell built-ins besides
// mkfifo, sleep and cat, which takes the shell's place: under software
// emulation every program started costs. Exit 91: no executor runs there;
// 93: it is still starting after 30 s.
const executorCall = `d=$1
alive() {
  kill -0 "$1" 2>/dev/null || return 1
  while read -r k v _; do
    [ "$k" = State: ] && { [ "$v" != Z ]; return; }
  done <"/proc/$1/status"
}
i=0
while [ ! -p "$d/req" ]; do
  [ -e "$d/failed" ] && exit 91
  if read -r pid 2>/dev/null <"$d/pid"; then
    alive "$pid" || exit 91
  elif [ "$i" -ge "$4" ]; then
    exit 91
  fi
  [ "$i" -ge 600 ] && exit 93
  i=$((i + 1))
  sleep 0.05
done
read -r pid 2>/dev/null <"$d/pid" && alive "$pid" || exit 91
r="$d/r-$2"
mkfifo -m 600 "$r" || exit 91
printf '%s\n' "$3" 1<>"$d/req"
(
  while [ -p "$r" ]; do
    sleep 0.1
    alive "$pid" || { [ -p "$r" ] && echo gone >"$r"; exit; }
  done
) >/dev/null 2>&1 &
exec cat "$r"`

// executorStartTicks is how long a request waits for an executor that has
// not answered yet to start (50 ms ticks): its interpreter's start, before
// it writes its pid.
const executorStartTicks = 200

// executorStop ends the executor of directory $1 and removes the
// directory.
const executorStop = `read -r pid 2>/dev/null <"$1/pid" && kill -9 "$pid" 2>/dev/null
rm -rf "$1"`

// executorWhy prints why the executor of directory $1 stopped, if it
// said.
const executorWhy = `cat "$1/failed" 2>/dev/null | tail -n 4`

const (
	executorAbsent   = 91
	executorStarting = 93
	// executorActLimit is the executor's bound on one action, a little
	// under the 120 s after which OSWorld's /execute kills a `python -c`
	// action (and would kill the call that waits for the executor's
	// answer).
	executorActLimit = 118 * time.Second
)

// executor is the state of the desktop's executor since the last reset.
type executor struct {
	// dir is its guest directory; "" when none was started.
	dir string
	// up says it answered; down that it stopped answering: the attempt
	// goes on without it.
	up, down bool
	// noWatch says it cannot watch the screen: the ready signal probes.
	noWatch bool
	// window is the settle window the tests compare; "" is the default.
	window string
}

func (e executor) usable() bool { return e.dir != "" && !e.down }

// executorBase is the guest directory the executor's own goes in: one a
// fast reset restores, so that the reset removes it with the executor;
// /dev/shm where it can be (a task's files and its checks are in the home
// and /tmp, hardly ever there), else /tmp.
func (c Config) executorBase() string {
	for _, d := range []string{"/dev/shm", "/tmp"} {
		if len(c.FastReset.Restore) == 0 || slices.Contains(c.FastReset.Restore, d) {
			return d
		}
	}
	return c.FastReset.Restore[0]
}

// startExecutor starts the attempt's executor after a reset. It does not
// wait for it: it imports pyautogui while the task's setup runs, and the
// first action waits for it if need be. A guest that cannot start it runs
// the attempt without it.
func (d *Desktop) startExecutor(ctx context.Context) {
	d.exec = executor{}
	if d.cfg.NoExecutor {
		return
	}
	dir := path.Join(d.cfg.executorBase(), "legato-exec-"+strings.TrimPrefix(newNonce(), "legato-"))
	conf, err := json.Marshal(map[string]string{"prefix": guest.PyautoguiPrefix, "pointer": d.testPointer})
	if err != nil {
		d.log.Warn("cannot start the action executor; actions run one python each", "err", err)
		return
	}
	// Known before the launch: a launch that Close or Ctrl-C interrupts
	// may have started the program all the same, and Close must stop it.
	d.mu.Lock()
	d.execDir = dir
	d.mu.Unlock()
	if err := d.guest.Launch(ctx, guest.Argv("python", "-c", executorSrc, dir, string(conf))); err != nil {
		d.log.Warn("cannot start the action executor; actions run one python each", "err", err)
		return
	}
	d.exec.dir = dir
}

// running returns the executor's directory, "" when none runs.
func (e executor) running() string {
	if e.down {
		return ""
	}
	return e.dir
}

// resumeExecutor takes over the executor of dir after a golden state that
// holds it was loaded (it imported pyautogui before the snapshot); with
// none there, it starts one.
func (d *Desktop) resumeExecutor(ctx context.Context, dir string) {
	if dir == "" || d.cfg.NoExecutor {
		d.startExecutor(ctx)
		return
	}
	d.exec = executor{dir: dir}
	d.mu.Lock()
	d.execDir = dir
	d.mu.Unlock()
}

// stopExecutor ends the executor of a guest given by URL, whose processes
// outlive the desktop (a VM's go with it). Close calls it.
func (d *Desktop) stopExecutor() {
	d.mu.Lock()
	dir := d.execDir
	d.mu.Unlock()
	if dir == "" || d.vm != nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), executorStopTimeout)
	defer cancel()
	if _, err := d.sh.run(ctx, executorStop, dir); err != nil {
		d.log.Warn("could not end the action executor in the guest", "dir", dir, "err", err)
	}
}

// executorStopTimeout bounds Close's call that ends a guest's executor.
const executorStopTimeout = 5 * time.Second

// executorRequest is one request to the executor; see guestpy/executor.py.
type executorRequest struct {
	Op    string `json:"op"`
	Nonce string `json:"nonce"`
	// act
	Code  string  `json:"code,omitempty"`
	Limit float64 `json:"limit,omitempty"`
	// settle
	Max       float64 `json:"max,omitempty"`
	Interval  float64 `json:"interval,omitempty"`
	MaxLoad   float64 `json:"max_load,omitempty"`
	MaxDamage int64   `json:"max_damage,omitempty"`
	// Window says from when the load and the damage count; "" is the
	// executor's default (see guestpy/executor.py).
	Window string `json:"window,omitempty"`
	// Shot asks for the settled screen as PNG, at this zlib level.
	Shot *int `json:"shot,omitempty"`
	// Then is the settle request an act request runs right after the
	// action: act, wait and screenshot in one round trip.
	Then *executorRequest `json:"then,omitempty"`
}

// errExecutorDied means the executor ended while it ran a request.
var errExecutorDied = errors.New("the action executor ended while it ran the request")

// callExecutor hands req to the executor and decodes its reply into out.
// delivered is false when no executor took the request: it was not run,
// and the caller does it the other way. The executor is marked down when
// it is absent or died.
func (d *Desktop) callExecutor(ctx context.Context, req executorRequest, out any) (delivered bool, err error) {
	if !d.exec.usable() {
		return false, nil
	}
	req.Nonce = newNonce()
	line, err := json.Marshal(req)
	if err != nil {
		return false, err
	}
	ticks := 0
	if !d.exec.up {
		ticks = executorStartTicks
	}
	res, err := d.sh.run(ctx, executorCall, d.exec.dir, req.Nonce, string(line), strconv.Itoa(ticks))
	if err != nil {
		// Whether it ran is unknown, as for a `python -c` action whose
		// call failed. The guest server answering with an error means it
		// stopped the call (its 120 s limit): the executor hangs.
		var gerr *guest.Error
		if errors.As(err, &gerr) && gerr.Status >= 400 {
			d.executorDown(ctx, err.Error())
		}
		return true, err
	}
	switch {
	case res.ReturnCode == executorAbsent || res.ReturnCode == executorStarting:
		d.executorDown(ctx, fmt.Sprintf("exit %d", res.ReturnCode))
		return false, nil
	case res.ReturnCode != 0:
		// The request may have been handed over before the call failed:
		// whether it ran is unknown, and running it again could do it
		// twice.
		d.executorDown(ctx, fmt.Sprintf("exit %d: %s", res.ReturnCode, clip(res.Error)))
		return true, fmt.Errorf("action executor: exit %d: %s", res.ReturnCode, clip(res.Error))
	case strings.TrimSpace(res.Output) == "gone":
		d.executorDown(ctx, "it ended before it took the request")
		return false, nil
	case strings.TrimSpace(res.Output) == "":
		d.executorDown(ctx, "it ended while it ran a request")
		return true, errExecutorDied
	}
	var failed struct {
		Failed string `json:"failed"`
	}
	if err := json.Unmarshal([]byte(res.Output), &failed); err != nil {
		d.executorDown(ctx, fmt.Sprintf("reply %q: %v", clip(res.Output), err))
		return true, fmt.Errorf("action executor: reply %q: %w", clip(res.Output), err)
	}
	d.exec.up = true
	if failed.Failed != "" {
		return true, fmt.Errorf("action executor: %s", failed.Failed)
	}
	return true, json.Unmarshal([]byte(res.Output), out)
}

// executorDown marks the executor down for the rest of the attempt, saying
// why it stopped where it said.
func (d *Desktop) executorDown(ctx context.Context, what string) {
	d.exec.down = true
	why := ""
	if res, err := d.sh.run(ctx, executorWhy, d.exec.dir); err == nil {
		why = strings.TrimSpace(res.Output)
	}
	d.log.Warn("the action executor does not answer; actions run one python each until the next reset",
		"dir", d.exec.dir, "what", what, "why", why)
}

// actExecutor runs code through the executor. ran is false when no
// executor took it: the caller runs it through `python -c`. The result is
// what the guest's /execute would give for `python -c PREFIX+code`. With
// then, the executor runs that settle request right after the action and
// its answer comes back (nil when the action did not end normally);
// actTime is how long the action ran in the guest.
func (d *Desktop) actExecutor(ctx context.Context, code string, then *executorRequest) (res guest.ExecResult, settle *settleAnswer, actTime time.Duration, ran bool, err error) {
	var reply struct {
		Output     string        `json:"output"`
		Error      string        `json:"error"`
		ReturnCode int           `json:"returncode"`
		Timeout    *float64      `json:"timeout"`
		ActS       float64       `json:"act_s"`
		Settle     *settleAnswer `json:"settle"`
	}
	ran, err = d.callExecutor(ctx, executorRequest{Op: "act", Code: code, Limit: executorActLimit.Seconds(), Then: then}, &reply)
	if !ran || err != nil {
		if errors.Is(err, errExecutorDied) {
			return guest.ExecResult{Status: "error", ReturnCode: -1, Error: err.Error()}, nil, 0, true, nil
		}
		return res, nil, 0, ran, err
	}
	if reply.Timeout != nil {
		return guest.ExecResult{Status: "error", ReturnCode: -1,
			Error: fmt.Sprintf("the action ran past %ss and was stopped", strconv.FormatFloat(*reply.Timeout, 'f', -1, 64))}, nil, 0, true, nil
	}
	return guest.ExecResult{Status: "success", Output: reply.Output, Error: reply.Error, ReturnCode: reply.ReturnCode},
		reply.Settle, seconds(reply.ActS), true, nil
}

// seconds converts a duration the guest reported in seconds.
func seconds(s float64) time.Duration {
	if !(s > 0) {
		return 0
	}
	return time.Duration(s * float64(time.Second))
}

// settleAnswer is the executor's reply to a settle request.
type settleAnswer struct {
	Settled bool `json:"settled"`
	// Waited is how long the executor waited, in seconds.
	Waited float64 `json:"waited"`
	// Error says why it cannot watch the screen.
	Error  string  `json:"error"`
	Load   float64 `json:"load"`
	Damage int64   `json:"damage"`
	// Repeated is the area of regions redrawn with at most two
	// contents (a blinking cursor), which do not count as damage.
	Repeated int64 `json:"repeated"`
	// HeldLoad and HeldDamage count the looks (every 50 ms) that found
	// the CPUs busy and the screen changing.
	HeldLoad   int `json:"held_load"`
	HeldDamage int `json:"held_damage"`
	// HeldLate counts the looks that found the screen quiet but waited
	// on for a late redraw: one came after the last settles, that long
	// (Late, seconds) after the screen went quiet.
	HeldLate int     `json:"held_late"`
	Late     float64 `json:"late"`
	// The screenshot asked for (Shot): a PNG in base64, its size, and
	// the seconds its capture and its encoding took in the guest; or
	// why it could not be taken.
	PNG       []byte  `json:"png"`
	Width     int     `json:"width"`
	Height    int     `json:"height"`
	CaptureS  float64 `json:"capture_s"`
	EncodeS   float64 `json:"encode_s"`
	ShotError string  `json:"shot_error"`
	// Early says the screenshot was taken while the executor waited out
	// its quiet interval, nothing drawn since: its capture and encoding
	// are part of Waited.
	Early bool `json:"early"`
	// LoadTerms is what Load was computed from, for the debug log: the
	// seconds it spans, and the guest's busy ticks, the executor's own
	// and all ticks in them (/proc/stat counts ticks, os.times the
	// scheduler's precise time; under a loaded host the two disagree,
	// and Load has been seen negative).
	LoadTerms []float64 `json:"load_terms"`
}

// firstSettleOverhead is the guess of a settle request's round trip
// beyond the executor's wait before one was measured: an /execute with a
// shell, mkfifo and cat under software emulation.
const firstSettleOverhead = 300 * time.Millisecond

// minSettleOverhead is the least time a settle request leaves for its
// round trip: its cost varies with the guest's and the host's load.
const minSettleOverhead = 100 * time.Millisecond
