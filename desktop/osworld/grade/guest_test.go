package grade

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"go.uber.org/goleak"

	"legato/rl/desktop/osworld/guest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeGuest is an in-process stand-in for OSWorld's guest server: the
// endpoints graders use, answering like the real one (404 for a missing
// file, 500 for a command that cannot run).
type fakeGuest struct {
	srv *httptest.Server

	mu       sync.Mutex
	files    map[string][]byte
	commands map[string]string // commandKey → stdout
	tree     string
	platform string
	signals  chan string // paths fetched under /signal/
}

func newFakeGuest(t testing.TB) *fakeGuest {
	t.Helper()
	g := &fakeGuest{
		files:    map[string][]byte{},
		commands: map[string]string{},
		platform: "Linux",
		signals:  make(chan string, 16),
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /file", g.file)
	mux.HandleFunc("POST /execute", g.execute)
	mux.HandleFunc("POST /setup/execute", g.execute)
	mux.HandleFunc("GET /accessibility", func(w http.ResponseWriter, r *http.Request) {
		g.mu.Lock()
		defer g.mu.Unlock()
		writeJSON(w, 200, map[string]any{"AT": g.tree})
	})
	g.srv = httptest.NewServer(mux) // listens on 127.0.0.1
	t.Cleanup(g.srv.Close)
	return g
}

func (g *fakeGuest) port() int { return serverPort(g.srv) }

// serverPort is the loopback port a test server listens on.
func serverPort(srv *httptest.Server) int {
	u, _ := url.Parse(srv.URL)
	p, _ := strconv.Atoi(u.Port())
	return p
}

func (g *fakeGuest) setFile(path string, content string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.files[path] = []byte(content)
}

// setCommand scripts the output of a command, as the guest receives it.
func (g *fakeGuest) setCommand(command any, shell bool, stdout string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.commands[commandKey(command, shell)] = stdout
}

func commandKey(command any, shell bool) string {
	b, _ := json.Marshal(command)
	return fmt.Sprintf("%s shell=%v", b, shell)
}

func (g *fakeGuest) file(w http.ResponseWriter, r *http.Request) {
	path := r.FormValue("file_path")
	if sig, ok := strings.CutPrefix(path, "/signal/"); ok {
		g.signals <- sig
	}
	g.mu.Lock()
	data, ok := g.files[path]
	g.mu.Unlock()
	if !ok {
		writeJSON(w, 404, map[string]any{"error": "File not found"})
		return
	}
	w.Write(data)
}

func (g *fakeGuest) execute(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Command any `json:"command"`
		Shell   any `json:"shell"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		writeJSON(w, 400, map[string]any{"status": "error", "message": err.Error()})
		return
	}
	shell := req.Shell == true || req.Shell == "true"
	command := req.Command
	// Like the real server, split a string run without a shell.
	if s, ok := command.(string); ok && !shell {
		words, err := shlexSplit(s)
		if err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		list := make([]any, len(words))
		for i, w := range words {
			list[i] = w
		}
		command = list
	}
	// A one-element list run by a shell is the same command line as the
	// string itself.
	if list, ok := command.([]any); ok && shell && len(list) == 1 {
		command = list[0]
	}
	g.mu.Lock()
	out, ok := g.commands[commandKey(command, shell)]
	platform := g.platform
	g.mu.Unlock()
	if !ok {
		if list, isList := command.([]any); isList && len(list) == 3 && list[0] == "python" && strings.Contains(fmt.Sprint(list[2]), "platform.system()") {
			out, ok = platform+"\n", true
		}
	}
	if !ok {
		writeJSON(w, 500, map[string]any{"status": "error", "message": "no such command"})
		return
	}
	writeJSON(w, 200, map[string]any{"status": "success", "output": out, "error": "", "returncode": 0})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

// client returns a Guest for the fake guest through the guest package's
// client, as the desktop backend wires it.
func (g *fakeGuest) client(t testing.TB) Guest {
	t.Helper()
	return clientFor(t, g.srv.URL)
}

func clientFor(t testing.TB, url string) Guest {
	t.Helper()
	c, err := guest.New(url, guest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.CloseIdleConnections)
	return GuestClient(c)
}

// closedPort returns a loopback port nothing listens on.
func closedPort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	return port
}

// fixtureDir is the Python package laid out like OSWorld's.
func fixtureDir(t testing.TB) string {
	t.Helper()
	dir, err := filepath.Abs(filepath.Join("testdata", "osworld"))
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// pythonPath is the interpreter LEGATO_PYTHON, or python3, stands for,
// resolved once: a version manager's shim (pyenv) can take seconds per
// start on a busy machine.
var pythonPath = sync.OnceValue(func() string {
	python := cmp.Or(os.Getenv("LEGATO_PYTHON"), DefaultPython)
	out, err := exec.Command(python, "-c", "import sys; print(sys.executable)").Output()
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(out))
})

// needPython skips tests that run the bridge where there is no python3, and
// returns the interpreter to use.
func needPython(t testing.TB) string {
	t.Helper()
	p := pythonPath()
	if p == "" {
		t.Skip("python3 not found; bridge tests need it")
	}
	return p
}

// fileServer serves cloud files on loopback and counts requests per path.
type fileServer struct {
	srv   *httptest.Server
	mu    sync.Mutex
	files map[string]string
	hits  map[string]int
}

func newFileServer(t testing.TB, files map[string]string) *fileServer {
	t.Helper()
	fs := &fileServer{files: files, hits: map[string]int{}}
	fs.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fs.mu.Lock()
		fs.hits[r.URL.Path]++
		body, ok := fs.files[r.URL.Path]
		fs.mu.Unlock()
		if !ok {
			http.NotFound(w, r)
			return
		}
		io.WriteString(w, body)
	}))
	t.Cleanup(fs.srv.Close)
	return fs
}

func (fs *fileServer) url(path string) string { return fs.srv.URL + path }

func (fs *fileServer) hitCount(path string) int {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return fs.hits[path]
}

// writeTemp writes content to a new file in t's temp dir.
func writeTemp(t testing.TB, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}
