package grade

import (
	"bufio"
	"bytes"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"

	"legato/rl/desktop"
	"legato/rl/internal/childenv"
)

// The bridge is the Python side of a grader worker: bridge.py, run by the
// user's interpreter in the OSWorld checkout's context. This file holds one
// bridge process and its JSON-lines protocol; pool.go runs a few of them
// for all the desktops of a batch.

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
	ID         *int64             `json:"id"`
	Ready      bool               `json:"ready"`
	Python     string             `json:"python"`
	Executable string             `json:"executable"`
	PID        int                `json:"pid"`
	Pong       bool               `json:"pong"`
	Score      *float64           `json:"score"`
	Error      string             `json:"error"`
	Kind       string             `json:"kind"`
	Where      string             `json:"where"`
	ExcType    string             `json:"exc_type"`
	Traceback  string             `json:"traceback"`
	Metrics    map[string]*string `json:"metrics"`
	Getters    map[string]*string `json:"getters"`
	Missing    map[string]string  `json:"missing"`
	// Inputs are the digests of what the metric was given (inputDigest);
	// null, as for no expected getter, decodes as "".
	Inputs struct {
		Result   string `json:"result"`
		Expected string `json:"expected"`
	} `json:"inputs"`
	// Shown is the start of the text the result's digest is of.
	Shown string `json:"shown"`
}

// bridgeSpec is how to start a bridge process.
type bridgeSpec struct {
	python   string // the interpreter
	script   string // absolute path of bridge.py
	checkout string // absolute path of the OSWorld checkout
	bytecode string // absolute path of the checkout's bytecode cache; "" none
	dir      string // the process's working directory
	log      *slog.Logger
}

// bridgeProc is one Python process and the goroutines that read it. Its
// goroutines end when the process has exited and its pipes are drained.
type bridgeProc struct {
	cmd   *exec.Cmd
	stdin *os.File
	lines chan []byte   // answer lines; closed at EOF
	quit  chan struct{} // closed by kill: readers stop delivering
	done  chan struct{} // closed once the process is reaped and readers ended

	nextID   int64 // protocol ids; used by the one goroutine that talks to it
	killOnce sync.Once
	tailMu   sync.Mutex
	tail     []string
	exitErr  error // set before done is closed
}

// startBridge starts the Python process; its first answer is the ready
// line.
func startBridge(spec bridgeSpec) (*bridgeProc, error) {
	args := []string{"-u", spec.script, spec.checkout}
	if spec.bytecode != "" {
		args = append(args, spec.bytecode)
	}
	cmd := exec.Command(spec.python, args...)
	cmd.Dir = spec.dir
	cmd.Env = bridgeEnviron(os.Environ())
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
		return nil, fmt.Errorf("start grader %q: %w (set the Python interpreter with GraderConfig.Python)", spec.python, err)
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
		p.readStderr(errR, spec.log.With("grader_pid", cmd.Process.Pid))
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

// bridgeEnviron is the environment of the Python process: what a Python
// program may need of ours (childenv.Python: never the model API key nor
// anything else the user exported), minus PYTHONPYCACHEPREFIX, which would
// make Python ignore the bytecode its distribution ships and compile every
// module it imports again (the bridge caches the checkout's own bytecode
// itself).
func bridgeEnviron(env []string) []string {
	var out []string
	for _, kv := range childenv.Python(env) {
		if strings.HasPrefix(kv, "PYTHONPYCACHEPREFIX=") || strings.HasPrefix(kv, "PYTHONIOENCODING=") {
			continue
		}
		out = append(out, kv)
	}
	return append(out, "PYTHONIOENCODING=utf-8")
}

func (p *bridgeProc) pid() int { return p.cmd.Process.Pid }

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
func (p *bridgeProc) kill() {
	p.killOnce.Do(func() {
		close(p.quit)
		killProcessGroup(p.cmd)
	})
	<-p.done
}

// send writes one request, numbering it.
func (p *bridgeProc) send(req *bridgeRequest, timeout time.Duration) error {
	p.nextID++
	req.ID = p.nextID
	line, err := json.Marshal(req)
	if err != nil {
		return fmt.Errorf("encode %s request: %w", req.Op, err)
	}
	_ = p.stdin.SetWriteDeadline(time.Now().Add(timeout))
	_, err = p.stdin.Write(append(line, '\n'))
	return err
}

// errStopped is what recv returns when its stop channel closed.
var errStopped = errors.New("stopped")

// recv returns the next answer line. stop ends the wait early with
// errStopped (the process is left running); deadline with ErrTimeout.
func (p *bridgeProc) recv(deadline <-chan time.Time, stop <-chan struct{}) (*bridgeAnswer, error) {
	select {
	case line, ok := <-p.lines:
		return p.decode(line, ok)
	case <-deadline:
		return nil, ErrTimeout
	case <-stop:
		return nil, errStopped
	}
}

// decode turns a line of the process's output (ok false: the output ended)
// into an answer. An ended output or a line that does not parse kills the
// process: its answers can no longer be trusted to match their requests.
func (p *bridgeProc) decode(line []byte, ok bool) (*bridgeAnswer, error) {
	if !ok {
		p.kill()
		return nil, p.exitError()
	}
	var ans bridgeAnswer
	if err := json.Unmarshal(line, &ans); err != nil {
		p.kill()
		return nil, fmt.Errorf("%w: grader bridge protocol: %v (line %.200q)", ErrBridgeExited, err, line)
	}
	return &ans, nil
}

// answer returns the answer to the request numbered id, skipping answers to
// requests given up on earlier.
func (p *bridgeProc) answer(id int64, deadline <-chan time.Time, stop <-chan struct{}) (*bridgeAnswer, error) {
	for {
		ans, err := p.recv(deadline, stop)
		if err != nil {
			return nil, err
		}
		if ans.ID != nil && *ans.ID == id {
			return ans, nil
		}
	}
}

func (p *bridgeProc) exitError() error {
	msg := fmt.Sprintf("%v", p.exitErr)
	if p.exitErr == nil {
		msg = "exit status 0"
	}
	if tail := p.stderr(); tail != "" {
		msg += "; last output:\n" + tail
	}
	return fmt.Errorf("%w (%s)", ErrBridgeExited, msg)
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
