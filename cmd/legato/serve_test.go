package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"maps"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	rl "legato/rl"
	"legato/rl/desktop"
	"legato/rl/desktop/fake"
	"legato/rl/policy"
	"legato/rl/policy/policytest"
)

// TestPythonClient runs the Python client's tests (examples/python) against
// real `legato rl serve` processes: this test binary, run as legato.
func TestPythonClient(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("python3 is missing; .ci/test installs it")
		}
		t.Skip("no python3")
	}
	dir, err := filepath.Abs("../../examples/python")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(t.Context(), py, "-m", "unittest", "discover", "-s", dir, "-v")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), runMainEnv+"=1", "LEGATO_BIN="+os.Args[0], "PYTHONDONTWRITEBYTECODE=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("python tests: %v\n%s", err, out)
	}
	t.Logf("%s", out)
}

// testService is a service in this process on one fake desktop against a
// scripted model server, with the task t0 of domain os; its run directory
// is out.
func testService(t *testing.T, pol rl.PolicyConfig) (svc *rl.Service, out string) {
	t.Helper()
	if pol.BaseURL == "" {
		srv := policytest.NewServer(policytest.Options{NoLatency: true})
		t.Cleanup(srv.Close)
		pol.BaseURL = srv.URL()
	}
	pol.Model, pol.Version = "scripted", "v1"
	out = filepath.Join(t.TempDir(), "run")
	svc, err := rl.Serve(t.Context(), pol,
		rl.ServeOptions{CollectOptions: rl.CollectOptions{Out: out,
			NewDesktop: fake.NewFleet(fake.Config{Width: 320, Height: 192}).New, Desktops: 1, Group: 1, MaxSteps: 2,
			Ready: desktop.ReadyOptions{Interval: time.Millisecond, Max: 50 * time.Millisecond}},
			Tasks: []rl.Task{{ID: "t0", Domain: "os", Instruction: "x", Evaluator: json.RawMessage(`{"func":"exact_match"}`)}}})
	if err != nil {
		t.Fatal(err)
	}
	return svc, out
}

// call sends a request with the Authorization header authz (none when
// empty) and returns the status and the body.
func call(t *testing.T, method, url, authz, body string) (int, string) {
	t.Helper()
	return callWithin(t, 6*time.Minute, method, url, authz, body)
}

// callWithin is call with an answer due within d: a request that should be
// answered at once fails the test instead of hanging it.
func callWithin(t *testing.T, d time.Duration, method, url, authz, body string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), d)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if authz != "" {
		req.Header.Set("Authorization", authz)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	return res.StatusCode, string(b)
}

// tokenTransport sends its bearer token with every request.
type tokenTransport string

func (tok tokenTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+string(tok))
	return http.DefaultTransport.RoundTrip(r)
}

// TestServeHTTP checks the HTTP front's answers to bad requests and its
// bearer token, on a service in this process.
func TestServeHTTP(t *testing.T) {
	svc, out := testService(t, rl.PolicyConfig{})
	defer svc.Close()
	h := httptest.NewServer(newServeHandler(svc, serveAuth{token: "s3cret"}, slog.New(slog.DiscardHandler)))
	defer h.Close()
	do := func(method, path, authz, body string) (int, string) { return call(t, method, h.URL+path, authz, body) }
	const ok = "Bearer s3cret"
	task := `{"task_id": "t1", "domain": "os", "config": {"id": "t1", "instruction": "x", "evaluator": {"func": "exact_match"}}}`
	for _, tt := range []struct {
		method, path, authz, body string
		status                    int
		words                     string
	}{
		{"GET", "/v1/status", "", "", 401, "bearer token"},
		{"GET", "/v1/status", "Bearer wrong", "", 401, "bearer token"},
		{"GET", "/v1/status", "bearer s3cret", "", 200, `"desktops":1`}, // RFC 7235: the scheme is case-insensitive
		{"GET", "/v1/status", "BEARER  s3cret", "", 200, `"desktops":1`},
		{"GET", "/v1/status", "Basic s3cret", "", 401, "bearer token"},
		{"GET", "/v1/status", "s3cret", "", 401, "bearer token"},
		{"POST", "/v1/groups", ok, `{"task": ` + task + `, "group_size": 2000}`, 400, "group_size 2000"},
		{"POST", "/v1/groups", ok, `{"task": ` + task + `, "group_size": 0}`, 400, "group_size 0"},
		{"POST", "/v1/groups", ok, `{"task": ` + task + `, "group_size": -1}`, 400, "group_size -1"},
		{"POST", "/v1/groups", ok, `{"task": {"task_id": "t0", "domain": "chrome"}}`, 400, `domain \"chrome\"`},
		{"POST", "/v1/groups", ok, `{"task": {"task_id": "t0", "domain": "os", "extra": 1}}`, 400, "extra: unknown field"},
		{"POST", "/v1/groups", ok, `{"task": ` + task + `} {}`, 400, "more than one JSON value"},
		{"POST", "/v1/groups", ok, `not json`, 400, "body"},
		{"GET", "/v1/groups/g1?wait=-1", ok, "", 400, "wait="},
		{"GET", "/v1/groups/g1?wait=NaN", ok, "", 400, `wait=\"NaN\"`},
		{"GET", "/v1/stream?limit=x", ok, "", 400, "limit="},
		{"GET", "/v1/stream?steps=some", ok, "", 400, `steps=\"some\": want full, prefix or none`},
		{"GET", "/v1/groups/g1?images=all", ok, "", 400, `images=\"all\": want refs`},
		{"POST", "/v1/policy", ok, `{"state": "serving", "version": "a\nb"}`, 400, "version"},
		{"POST", "/v1/policy", ok, `{"state": "serving", "version": "v2\u0000"}`, 400, `version \"v2\\x00\"`},
		{"POST", "/v1/policy", ok, `{"state": "serving", "version": "v2\u001b[2J"}`, 400, "control character"},
		{"POST", "/v1/policy", ok, `{"state": "serving", "version": "v2"}`, 200, `"version":"v2"`},
		{"POST", "/v1/policy", ok, `{"state": "serving", "version": "v1"}`, 409, `version \"v1\" came into force before \"v2\"`},
		{"POST", "/v1/policy", ok, `{"state": "serving", "version": "v1"}`, 409, `\"force\": true`},
		{"POST", "/v1/policy", ok, `{"state": "serving", "version": "v1", "force": true}`, 200, `"version":"v1"`},
		{"POST", "/v1/policy", ok, `{"state": "serving", "drain": true}`, 400, `drain: goes with \"state\": \"paused\"`},
		{"POST", "/v1/policy", ok, `{"state": "paused", "drain": true}`, 200, `"state":"paused","since"`},
		{"GET", "/v1/policy", ok, "", 200, `"in_flight":0,"servers":["http://127.0.0.1:`},
		{"POST", "/v1/policy", ok, `{"state": "serving"}`, 200, `"state":"serving"`},
		{"GET", "/v1/blobs/zz", ok, "", 400, "sha256"},
		{"PUT", "/v1/groups", ok, "", 404, "no endpoint PUT /v1/groups"},
		// Last: a stream that took NaN for no bound would wait here for ever.
		{"GET", "/v1/stream?wait=nan", ok, "", 400, `wait=\"nan\"`},
		{"GET", "/v1/stream?wait=Inf", ok, "", 400, `wait=\"Inf\"`},
		{"POST", "/v1/groups", ok, `{"task": ` + task + `, "group_size": 1}`, 201, `"id":"g000001"`},
	} {
		// Each is answered at once, unless it waits for nothing by mistake.
		status, body := callWithin(t, time.Minute, tt.method, h.URL+tt.path, tt.authz, tt.body)
		if status != tt.status || !strings.Contains(body, tt.words) {
			t.Errorf("%s %s (%s): %d %s, want %d with %q", tt.method, tt.path, tt.body, status, body, tt.status, tt.words)
		}
		if status >= 400 {
			var e struct{ Error string }
			if json.Unmarshal([]byte(body), &e) != nil || e.Error == "" {
				t.Errorf("%s %s: error body %q is not {\"error\": ...}", tt.method, tt.path, body)
			}
		}
	}
	// Only the versions accepted were journaled, the reset marked so (then
	// the drained pause and the serving after it).
	var versions []string
	for _, line := range journalLines(t, out) {
		if line["op"] == "policy" {
			versions = append(versions, fmt.Sprint(line["version"], " force=", line["force"] == true))
		}
	}
	if want := []string{"v2 force=false", "v1 force=true", "v1 force=false", "v1 force=false"}; !slices.Equal(versions, want) {
		t.Errorf("policy changes journaled %q, want %q", versions, want)
	}
	// Once the group ended (waited for as an event: on a loaded machine
	// at -race it took longer than the stream's idle bound below), the
	// stream hands it over, then waits for more until that bound.
	if status, body := do("GET", "/v1/groups/g000001?wait=300", ok, ""); status != 200 || !strings.Contains(body, `"state":"closed"`) || !strings.Contains(body, `"cursor":1`) {
		t.Fatalf("group g000001: %d %s, want it ended", status, body)
	}
	status, body := do("GET", "/v1/stream?after=0&wait=0.2", ok, "")
	lines := bytes.Split(bytes.TrimSpace([]byte(body)), []byte("\n"))
	if status != 200 || len(lines) != 1 || !bytes.Contains(lines[0], []byte(`"cursor":1`)) {
		t.Errorf("stream: %d %q, want one line with cursor 1", status, body)
	}
	_, metrics := do("GET", "/metrics", ok, "")
	for _, want := range []string{"# TYPE legato_groups gauge\n", `legato_groups{state="closed"} 1` + "\n",
		`legato_records_total{status="ok"} 1` + "\n", "legato_stream_cursor 1\n", "legato_policy_paused 0\n"} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %q:\n%s", want, metrics)
		}
	}
}

// journalLines reads the service journal in dir.
func journalLines(t *testing.T, dir string) []map[string]any {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, rl.JournalFile))
	if err != nil {
		t.Fatal(err)
	}
	var out []map[string]any
	for line := range bytes.Lines(b) {
		var m map[string]any
		if err := json.Unmarshal(line, &m); err != nil {
			t.Fatalf("%s: %v", rl.JournalFile, err)
		}
		out = append(out, m)
	}
	return out
}

// TestServeAuthEveryRoute: every route, and a path that is none, refuses
// a caller without the token, with a wrong one or another scheme; with
// --metrics-open, /metrics alone answers without it.
func TestServeAuthEveryRoute(t *testing.T) {
	svc, _ := testService(t, rl.PolicyConfig{})
	defer svc.Close()
	closed := httptest.NewServer(newServeHandler(svc, serveAuth{token: "s3cret"}, slog.New(slog.DiscardHandler)))
	defer closed.Close()
	open := httptest.NewServer(newServeHandler(svc, serveAuth{token: "s3cret", metricsOpen: true}, slog.New(slog.DiscardHandler)))
	defer open.Close()
	patterns := slices.Sorted(maps.Keys((&serveHandler{}).routes()))
	patterns = append(patterns, "PUT /v1/nothing")
	if len(patterns) < 10 {
		t.Fatalf("routes %q: too few", patterns)
	}
	path := strings.NewReplacer("{id}", "g000001", "{sha}", strings.Repeat("0", 64))
	for _, p := range patterns {
		method, route, _ := strings.Cut(path.Replace(p), " ")
		for _, authz := range []string{"", "Bearer", "Bearer ", "Bearer wrong", "Bearer s3cret2", "Bearer s3cre", "Basic czNjcmV0", "s3cret", "Token s3cret"} {
			if status, body := call(t, method, closed.URL+route, authz, `{"state": "paused"}`); status != http.StatusUnauthorized {
				t.Errorf("%s %s with Authorization %q: %d %s, want 401", method, route, authz, status, body)
			}
			status, _ := call(t, method, open.URL+route, authz, `{"state": "paused"}`)
			if want := http.StatusUnauthorized; route == "/metrics" {
				if status != http.StatusOK {
					t.Errorf("--metrics-open: GET /metrics with Authorization %q: %d, want 200", authz, status)
				}
			} else if status != want {
				t.Errorf("--metrics-open: %s %s with Authorization %q: %d, want 401", method, route, authz, status)
			}
		}
	}
	if p := svc.Policy(); p.Paused {
		t.Error("a caller without the token paused the policy")
	}
}

// TestServeToken: a token the service makes is random, written to the run
// directory readable by its owner only (by no other user, when the test
// runs as root), and replaced by each start; a token from the environment
// is not written, and removes the file an earlier start left.
func TestServeToken(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, serveTokenFile)
	tok, err := serveToken(dir, "")
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("%s has mode %v, want 0600", path, fi.Mode().Perm())
	}
	if b, _ := os.ReadFile(path); strings.TrimSpace(string(b)) != tok || len(tok) != 64 {
		t.Errorf("%s holds %q, want the token %q of 64 hex digits", path, b, tok)
	}
	notReadableByOthers(t, dir, path)
	again, err := serveToken(dir, "")
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(path); again == tok || strings.TrimSpace(string(b)) != again {
		t.Errorf("a second start: token %q (first %q), file %q: want a new token in the file", again, tok, b)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("the run directory holds %d files, want only %s", len(entries), serveTokenFile)
	}
	if got, err := serveToken(dir, "from-env"); err != nil || got != "from-env" {
		t.Errorf("with the token set: %q %v", got, err)
	}
	if _, err := os.Stat(path); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("with the token set, the last start's %s is left: %v", serveTokenFile, err)
	}
}

// notReadableByOthers shows that a user other than the file's owner
// cannot read path: `cat` run as nobody (uid 65534) fails, while it
// reads a world-readable file beside it (the directory does not stop it).
func notReadableByOthers(t *testing.T, dir, path string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Logf("not root: cannot run a process as another user to show it cannot read %s", path)
		return
	}
	cat, err := exec.LookPath("cat")
	if err != nil {
		t.Skip("no cat")
	}
	// Open the way to the file, so only its own mode can refuse.
	for d := dir; d != filepath.Dir(d) && strings.HasPrefix(d, os.TempDir()); d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	public := filepath.Join(dir, "public")
	if err := os.WriteFile(public, []byte("public\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(public)
	asNobody := func(file string) ([]byte, error) {
		cmd := exec.CommandContext(t.Context(), cat, file)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		return cmd.CombinedOutput()
	}
	if out, err := asNobody(public); err != nil {
		t.Fatalf("nobody cannot read even %s (%v: %s): the test shows nothing", public, err, out)
	}
	if out, err := asNobody(path); err == nil || !strings.Contains(string(out), "Permission denied") {
		t.Errorf("nobody read %s: %v %q", path, err, out)
	}
}

// TestServeNeedsToken runs `legato rl serve` as a user starts it, no token
// set: it makes one and says it once, and another local user without it
// can move the policy to its own server neither now nor after a restart
// (nothing is journaled), so the model key never reaches it.
func TestServeNeedsToken(t *testing.T) {
	t.Setenv(serveTokenEnv, "")
	t.Setenv(policy.KeyEnv, "model-key")
	model := policytest.NewServer(policytest.Options{NoLatency: true, APIKey: "model-key"})
	defer model.Close()
	var stolen atomic.Int32
	thief := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "" {
			stolen.Add(1)
		}
		http.Error(w, "no", http.StatusInternalServerError)
	}))
	defer thief.Close()
	out := filepath.Join(t.TempDir(), "run")
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- runServe(ctx, []string{"--out", out, "--addr", "127.0.0.1:0", "--policy-url", model.URL(), "--model", "scripted", "--version", "v1",
			"--fake-speed", "none", "--desktops", "1", "--group", "1", "--max-steps", "2"}, pw, io.Discard)
		pw.Close()
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("serve: %v", err)
		}
	}()
	br := bufio.NewReader(pr)
	defer func() { go io.Copy(io.Discard, br) }()
	first, err := br.ReadString('\n')
	if err != nil {
		t.Fatalf("no first line: %v", err)
	}
	second, err := br.ReadString('\n')
	if err != nil {
		t.Fatalf("no second line: %v", err)
	}
	base := strings.Fields(first)[1]
	b, err := os.ReadFile(filepath.Join(out, serveTokenFile))
	if err != nil {
		t.Fatal(err)
	}
	token := strings.TrimSpace(string(b))
	if !strings.Contains(second, "Authorization: Bearer "+token+" ") || !strings.Contains(second, filepath.Join(out, serveTokenFile)) {
		t.Errorf("second line %q does not give the token and its file", second)
	}
	redirect := `{"state": "serving", "version": "v2", "base_urls": ["` + thief.URL + `"]}`
	for _, authz := range []string{"", "Bearer ", "Bearer " + token[:63]} {
		if status, body := call(t, "POST", base+"/v1/policy", authz, redirect); status != http.StatusUnauthorized {
			t.Fatalf("POST /v1/policy to another server with Authorization %q: %d %s, want 401", authz, status, body)
		}
	}
	for _, line := range journalLines(t, out) {
		if line["op"] == "policy" {
			t.Errorf("a refused policy change was journaled: %v", line)
		}
	}
	// A group run with the token calls the model server, not the thief's.
	authz := "Bearer " + token
	if status, body := call(t, "POST", base+"/v1/groups", authz, `{"task": {"task_id": "demo-write-note", "domain": "os"}, "group_size": 1}`); status != http.StatusCreated {
		t.Fatalf("submit with the token: %d %s", status, body)
	}
	if status, body := call(t, "GET", base+"/v1/groups/g000001?wait=300", authz, ""); status != 200 || !strings.Contains(body, `"state":"closed"`) {
		t.Fatalf("group with the token: %d %s, want closed", status, body)
	}
	if n := stolen.Load(); n > 0 {
		t.Errorf("the other server got %d requests with the model key", n)
	}
	if status, _ := call(t, "GET", base+"/metrics", "", ""); status != http.StatusUnauthorized {
		t.Errorf("/metrics without the token: %d, want 401 without --metrics-open", status)
	}
}

func TestCheckServeAddr(t *testing.T) {
	for _, tt := range []struct {
		addr, cert, key, token string
		ok                     bool
	}{
		{"127.0.0.1:0", "", "", "", true},
		{"[::1]:8300", "", "", "", true},
		{"localhost:8300", "", "", "", true},
		{"0.0.0.0:8300", "", "", "", false},
		{"10.0.0.5:8300", "c.pem", "k.pem", "", false},
		{"10.0.0.5:8300", "c.pem", "k.pem", "tok", true},
		{"127.0.0.1:8300", "c.pem", "", "", false},
		{"8300", "", "", "", false},
	} {
		if err := checkServeAddr(tt.addr, tt.cert, tt.key, tt.token); (err == nil) != tt.ok {
			t.Errorf("checkServeAddr(%q, %q, %q, token %v) = %v, want ok %v", tt.addr, tt.cert, tt.key, tt.token != "", err, tt.ok)
		}
	}
}

// TestServeTLS runs `legato rl serve` with TLS and a bearer token: callers
// without the token are refused, callers with it served, over HTTPS only.
func TestServeTLS(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile, roots := selfSigned(t, dir)
	t.Setenv(serveTokenEnv, "tls-token")
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- runServe(ctx, []string{"--out", filepath.Join(dir, "run"), "--addr", "127.0.0.1:0", "--tls-cert", certFile, "--tls-key", keyFile,
			"--fake-speed", "none", "--desktops", "1"}, pw, io.Discard)
		pw.Close()
	}()
	br := bufio.NewReader(pr)
	line, err := br.ReadString('\n')
	if err != nil {
		t.Fatalf("no first line: %v", err)
	}
	fields := strings.Fields(line)
	if len(fields) < 2 || !strings.HasPrefix(fields[1], "https://") {
		t.Fatalf("first line %q does not name an https address", line)
	}
	base := fields[1]
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}}
	defer client.CloseIdleConnections()
	get := func(token string) int {
		req, _ := http.NewRequestWithContext(t.Context(), "GET", base+"/v1/status", nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		res, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res.StatusCode
	}
	if got := get(""); got != http.StatusUnauthorized {
		t.Errorf("no token: %d, want 401", got)
	}
	if got := get("tls-token"); got != http.StatusOK {
		t.Errorf("with the token: %d, want 200", got)
	}
	if res, err := http.Get(strings.Replace(base, "https://", "http://", 1) + "/v1/status"); err == nil {
		if res.StatusCode == http.StatusOK {
			t.Error("plain HTTP was served")
		}
		res.Body.Close()
	}
	cancel()
	go io.Copy(io.Discard, br)
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		t.Errorf("serve: %v", err)
	}
}

// selfSigned writes a certificate for 127.0.0.1 and its key under dir and
// returns their paths and a pool that trusts it.
func selfSigned(t *testing.T, dir string) (certFile, keyFile string, roots *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "legato test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	roots = x509.NewCertPool()
	roots.AddCert(cert)
	return certFile, keyFile, roots
}
