package grade

import (
	"bufio"
	"bytes"
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"legato/rl/desktop"
)

//go:embed bridge.py
var bridgeSource []byte

const (
	// stderrTail is how many lines of the bridge's stderr an error quotes.
	stderrTail = 20
	// maxAnswer bounds one answer line (a "list" of a large checkout is the
	// biggest).
	maxAnswer = 64 << 20
	// pipeGrace is how long the bridge's output may stay open after the
	// process exited (a child it started and that escaped the kill may hold
	// it) before we stop reading.
	pipeGrace = 2 * time.Second
)

// bridge is the long-lived Python process of one grader. It is started on
// first use, restarted on the next request after it died or was killed, and
// killed by close. Requests are serialized.
type bridge struct {
	python  string
	root    string // the OSWorld checkout
	workDir string // holds bridge.py and Python's bytecode cache
	log     *slog.Logger

	reqMu sync.Mutex // one request at a time

	mu     sync.Mutex
	proc   *bridgeProc
	closed bool
	nextID int64
	starts int // processes started, for tests and logs
}

// bridgeProc is one Python process and the goroutines that read it. Its
// goroutines end when the process has exited and its pipes are drained.
type bridgeProc struct {
	cmd   *exec.Cmd
	stdin *os.File
	lines chan []byte   // answer lines; closed at EOF
	quit  chan struct{} // closed by kill: readers stop delivering
	done  chan struct{} // closed once the process is reaped and readers ended

	killOnce sync.Once
	tailMu   sync.Mutex
	tail     []string
	exitErr  error // set before done is closed
}

type bridgeEnv struct {
	Host         string `json:"host,omitempty"`
	ServerPort   int    `json:"server_port,omitempty"`
	ChromiumPort int    `json:"chromium_port,omitempty"`
	VLCPort      int    `json:"vlc_port,omitempty"`
	Platform     string `json:"platform,omitempty"`
}

type bridgeRequest struct {
	ID       int64           `json:"id"`
	Op       string          `json:"op"`
	Metric   string          `json:"metric,omitempty"`
	Result   json.RawMessage `json:"result,omitempty"`
	Expected json.RawMessage `json:"expected,omitempty"`
	Options  json.RawMessage `json:"options,omitempty"`
	CacheDir string          `json:"cache_dir,omitempty"`
	Env      *bridgeEnv      `json:"env,omitempty"`
}

type bridgeAnswer struct {
	ID        *int64             `json:"id"`
	Ready     bool               `json:"ready"`
	Python    string             `json:"python"`
	PID       int                `json:"pid"`
	Pong      bool               `json:"pong"`
	Score     *float64           `json:"score"`
	Error     string             `json:"error"`
	Kind      string             `json:"kind"`
	Where     string             `json:"where"`
	ExcType   string             `json:"exc_type"`
	Traceback string             `json:"traceback"`
	Metrics   map[string]*string `json:"metrics"`
	Getters   map[string]*string `json:"getters"`
}

// do sends one request and returns its answer. The timeout covers starting
// the process if needed and the request itself; when it passes, or ctx is
// done, the process is killed (a hung evaluator cannot be interrupted any
// other way) and the next request starts a new one.
func (b *bridge) do(ctx context.Context, req *bridgeRequest, timeout time.Duration) (*bridgeAnswer, error) {
	b.reqMu.Lock()
	defer b.reqMu.Unlock()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()

	p, err := b.process(ctx, deadline.C, timeout)
	if err != nil {
		return nil, err
	}
	b.mu.Lock()
	b.nextID++
	req.ID = b.nextID
	b.mu.Unlock()
	line, err := json.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("encode %s request: %w", req.Op, err)
	}
	_ = p.stdin.SetWriteDeadline(time.Now().Add(timeout))
	if _, err := p.stdin.Write(append(line, '\n')); err != nil {
		// The process is gone or not reading; wait below reports why.
		b.log.Debug("grader bridge: write request", "err", err)
	}
	for {
		ans, err := b.wait(ctx, p, deadline.C, timeout)
		if err != nil {
			return nil, err
		}
		if ans.ID == nil || *ans.ID != req.ID {
			b.log.Warn("grader bridge: ignoring an answer to another request", "want", req.ID)
			continue
		}
		return ans, nil
	}
}

// process returns the running process, starting one if needed.
func (b *bridge) process(ctx context.Context, deadline <-chan time.Time, timeout time.Duration) (*bridgeProc, error) {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil, desktop.ErrClosed
	}
	if p := b.proc; p != nil && !p.exited() {
		b.mu.Unlock()
		return p, nil
	}
	began := time.Now()
	p, err := b.spawn()
	if err != nil {
		b.mu.Unlock()
		return nil, err
	}
	b.proc = p
	b.starts++
	b.mu.Unlock()

	ans, err := b.wait(ctx, p, deadline, timeout)
	if err != nil {
		return nil, fmt.Errorf("start grader: %w", err)
	}
	if !ans.Ready {
		b.kill(p)
		return nil, fmt.Errorf("start grader: %w: unexpected first line from the bridge", ErrBridgeExited)
	}
	b.log.Info("grader bridge started", "pid", ans.PID, "python", ans.Python, "checkout", b.root, "took", time.Since(began))
	return p, nil
}

// spawn starts the Python process. Called with b.mu held.
func (b *bridge) spawn() (*bridgeProc, error) {
	script := filepath.Join(b.workDir, "bridge.py")
	if err := os.MkdirAll(b.workDir, 0o755); err != nil {
		return nil, fmt.Errorf("grader work dir: %w", err)
	}
	if err := os.WriteFile(script, bridgeSource, 0o644); err != nil {
		return nil, fmt.Errorf("write grader bridge: %w", err)
	}
	cmd := exec.Command(b.python, "-u", script, b.root)
	cmd.Dir = b.root
	cmd.Env = bridgeEnviron(os.Environ(), filepath.Join(b.workDir, "pycache"))
	setProcessGroup(cmd)

	inR, inW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		inR.Close()
		inW.Close()
		return nil, err
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		inR.Close()
		inW.Close()
		outR.Close()
		outW.Close()
		return nil, err
	}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = inR, outW, errW
	err = cmd.Start()
	// The child has its own copies now.
	inR.Close()
	outW.Close()
	errW.Close()
	if err != nil {
		inW.Close()
		outR.Close()
		errR.Close()
		return nil, fmt.Errorf("start grader %q: %w (set the Python interpreter with GraderConfig.Python)", b.python, err)
	}
	p := &bridgeProc{
		cmd:   cmd,
		stdin: inW,
		lines: make(chan []byte, 4),
		quit:  make(chan struct{}),
		done:  make(chan struct{}),
	}
	var readers sync.WaitGroup
	readers.Add(2)
	go func() {
		defer readers.Done()
		p.readAnswers(outR)
	}()
	go func() {
		defer readers.Done()
		p.readStderr(errR, b.log.With("grader_pid", cmd.Process.Pid))
	}()
	go func() {
		err := cmd.Wait()
		readersDone := make(chan struct{})
		go func() {
			readers.Wait()
			close(readersDone)
		}()
		select {
		case <-readersDone:
		case <-time.After(pipeGrace):
			// Closing the read ends makes the blocked reads return.
			outR.Close()
			errR.Close()
			<-readersDone
		}
		outR.Close()
		errR.Close()
		inW.Close()
		p.exitErr = err
		close(p.done)
	}()
	return p, nil
}

// bridgeEnviron is the environment of the Python process: ours, minus the
// model API key, with bytecode caches kept out of the user's checkout.
func bridgeEnviron(env []string, pycache string) []string {
	out := make([]string, 0, len(env)+2)
	for _, kv := range env {
		if strings.HasPrefix(kv, "LEGATO_POLICY_KEY=") || strings.HasPrefix(kv, "PYTHONPYCACHEPREFIX=") {
			continue
		}
		out = append(out, kv)
	}
	return append(out, "PYTHONPYCACHEPREFIX="+pycache, "PYTHONIOENCODING=utf-8")
}

func (p *bridgeProc) readAnswers(r *os.File) {
	defer close(p.lines)
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), maxAnswer)
	for sc.Scan() {
		line := bytes.Clone(sc.Bytes())
		select {
		case p.lines <- line:
		case <-p.quit:
			return
		}
	}
}

func (p *bridgeProc) readStderr(r *os.File, log *slog.Logger) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if len(line) > 2000 {
			line = line[:2000] + "…"
		}
		log.Debug("grader output", "line", line)
		p.tailMu.Lock()
		p.tail = append(p.tail, line)
		if len(p.tail) > stderrTail {
			p.tail = p.tail[len(p.tail)-stderrTail:]
		}
		p.tailMu.Unlock()
	}
}

func (p *bridgeProc) stderr() string {
	p.tailMu.Lock()
	defer p.tailMu.Unlock()
	return strings.Join(p.tail, "\n")
}

func (p *bridgeProc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// kill kills the process and everything it started, and waits until it is
// reaped.
func (b *bridge) kill(p *bridgeProc) {
	p.killOnce.Do(func() {
		close(p.quit)
		killProcessGroup(p.cmd)
	})
	<-p.done
}

// wait returns the next answer line from p.
func (b *bridge) wait(ctx context.Context, p *bridgeProc, deadline <-chan time.Time, timeout time.Duration) (*bridgeAnswer, error) {
	select {
	case line, ok := <-p.lines:
		if !ok {
			b.kill(p)
			return nil, b.exitError(p)
		}
		var ans bridgeAnswer
		if err := json.Unmarshal(line, &ans); err != nil {
			b.kill(p)
			return nil, fmt.Errorf("grader bridge protocol: %w (line %.200q)", err, line)
		}
		return &ans, nil
	case <-deadline:
		b.log.Warn("grader bridge timed out; killing it", "timeout", timeout)
		b.kill(p)
		return nil, fmt.Errorf("%w: no answer after %v; killed the grader process", ErrTimeout, timeout)
	case <-ctx.Done():
		b.kill(p)
		return nil, fmt.Errorf("grader: %w", ctx.Err())
	}
}

func (b *bridge) exitError(p *bridgeProc) error {
	b.mu.Lock()
	closed := b.closed
	b.mu.Unlock()
	if closed {
		return desktop.ErrClosed
	}
	msg := fmt.Sprintf("%v", p.exitErr)
	if p.exitErr == nil {
		msg = "exit status 0"
	}
	if tail := p.stderr(); tail != "" {
		msg += "; last output:\n" + tail
	}
	return fmt.Errorf("%w (%s)", ErrBridgeExited, msg)
}

// close kills the process, if any; later requests fail with ErrClosed.
func (b *bridge) close() {
	b.mu.Lock()
	b.closed = true
	p := b.proc
	b.mu.Unlock()
	if p != nil {
		b.kill(p)
	}
}

// startCount reports how many processes were started.
func (b *bridge) startCount() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.starts
}

// list asks which getters and metrics the checkout provides; a name maps
// to "" when it imports, else to the reason it does not.
func (b *bridge) list(ctx context.Context, timeout time.Duration) (metrics, getters map[string]string, err error) {
	ans, err := b.do(ctx, &bridgeRequest{Op: "list"}, timeout)
	if err != nil {
		return nil, nil, fmt.Errorf("list evaluators of %s: %w", b.root, err)
	}
	if ans.Error != "" {
		return nil, nil, fmt.Errorf("list evaluators of %s: %s", b.root, ans.Error)
	}
	conv := func(in map[string]*string, prefix string) map[string]string {
		out := make(map[string]string, len(in))
		for name, reason := range in {
			if prefix != "" {
				var ok bool
				if name, ok = strings.CutPrefix(name, prefix); !ok {
					continue
				}
			}
			out[name] = ""
			if reason != nil {
				out[name] = *reason
			}
		}
		return out
	}
	return conv(ans.Metrics, ""), conv(ans.Getters, "get_"), nil
}

// errAnswer turns an error answer into the error Grade reports.
func errAnswer(ans *bridgeAnswer) error {
	switch ans.Kind {
	case "raised":
		return &PythonError{Type: ans.ExcType, Message: strings.TrimPrefix(ans.Error, ans.ExcType+": "), Traceback: ans.Traceback}
	case "file_not_found":
		return fmt.Errorf("%w: %s", ErrNoFile, ans.Error)
	case "unavailable":
		return fmt.Errorf("%w: %s", desktop.ErrUnsupported, ans.Error)
	case "guest":
		return errors.New(ans.Error)
	}
	return fmt.Errorf("%s: %s", ans.Kind, ans.Error)
}
