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
	"encoding/pem"
	"errors"
	"io"
	"io/fs"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"legato/rl/internal/httpapi"
	"legato/rl/internal/httpapi/httpapitest"
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

// TestServeToken: a token the service makes is random, written to the run
// directory readable by its owner only (by no other user, when the test
// runs as root), and replaced by each start; a token from the environment
// is not written, and removes the file an earlier start left.
func TestServeToken(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, httpapi.TokenFile)
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
		t.Errorf("the run directory holds %d files, want only %s", len(entries), httpapi.TokenFile)
	}
	if got, err := serveToken(dir, "from-env"); err != nil || got != "from-env" {
		t.Errorf("with the token set: %q %v", got, err)
	}
	if _, err := os.Stat(path); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("with the token set, the last start's %s is left: %v", httpapi.TokenFile, err)
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
	t.Setenv(httpapi.TokenEnv, "")
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
	b, err := os.ReadFile(filepath.Join(out, httpapi.TokenFile))
	if err != nil {
		t.Fatal(err)
	}
	token := strings.TrimSpace(string(b))
	if !strings.Contains(second, "Authorization: Bearer "+token+" ") || !strings.Contains(second, filepath.Join(out, httpapi.TokenFile)) {
		t.Errorf("second line %q does not give the token and its file", second)
	}
	redirect := `{"state": "serving", "version": "v2", "base_urls": ["` + thief.URL + `"]}`
	for _, authz := range []string{"", "Bearer ", "Bearer " + token[:63]} {
		if status, body := httpapitest.Call(t, "POST", base+"/v1/policy", authz, redirect); status != http.StatusUnauthorized {
			t.Fatalf("POST /v1/policy to another server with Authorization %q: %d %s, want 401", authz, status, body)
		}
	}
	for _, line := range httpapitest.JournalLines(t, out) {
		if line["op"] == "policy" {
			t.Errorf("a refused policy change was journaled: %v", line)
		}
	}
	// A group run with the token calls the model server, not the thief's.
	authz := "Bearer " + token
	if status, body := httpapitest.Call(t, "POST", base+"/v1/groups", authz, `{"task": {"task_id": "demo-write-note", "domain": "os"}, "group_size": 1}`); status != http.StatusCreated {
		t.Fatalf("submit with the token: %d %s", status, body)
	}
	if status, body := httpapitest.Call(t, "GET", base+"/v1/groups/g000001?wait=300", authz, ""); status != 200 || !strings.Contains(body, `"state":"closed"`) {
		t.Fatalf("group with the token: %d %s, want closed", status, body)
	}
	// The run's pages are served under /view/, behind the same token.
	// All three lines are written before serving: a service that writes
	// no third line must fail the test, not hang it.
	type line struct {
		s   string
		err error
	}
	got := make(chan line, 1)
	go func() {
		s, err := br.ReadString('\n')
		got <- line{s, err}
	}()
	var third string
	select {
	case l := <-got:
		third, err = l.s, l.err
	case <-time.After(time.Minute):
		pr.Close()
		<-got
		t.Fatal("no third line a minute after the second")
	}
	if err != nil || !strings.Contains(third, base+"/view/?token="+token) {
		t.Errorf("third line %q (%v): want the link to %s/view/ with the token", third, err, base)
	}
	if status, body := httpapitest.Call(t, "GET", base+"/view/", authz, ""); status != 200 || !strings.Contains(body, `class="attempt" data-rollout=`) {
		t.Errorf("GET /view/ with the token: %d, want 200 listing the attempt", status)
	}
	if status, _ := httpapitest.Call(t, "GET", base+"/view/", "", ""); status != http.StatusUnauthorized {
		t.Errorf("GET /view/ without the token: %d, want 401", status)
	}
	if n := stolen.Load(); n > 0 {
		t.Errorf("the other server got %d requests with the model key", n)
	}
	if status, _ := httpapitest.Call(t, "GET", base+"/metrics", "", ""); status != http.StatusUnauthorized {
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
	t.Setenv(httpapi.TokenEnv, "tls-token")
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

// TestServeAdvantageStdFlag: serve takes collect's --advantage-std, and a
// kind it does not know exits 2 naming the flag and the kinds, before
// anything starts.
func TestServeAdvantageStdFlag(t *testing.T) {
	out := filepath.Join(t.TempDir(), "run")
	var stderr bytes.Buffer
	err := runServe(t.Context(), []string{"--out", out, "--addr", "127.0.0.1:0", "--advantage-std", "unbiased"}, io.Discard, io.Discard)
	if code := exitCode(t.Context(), err, &stderr); code != exitUsage || !strings.Contains(stderr.String(), `invalid value "unbiased" for flag -advantage-std: want population or sample`) {
		t.Errorf("serve --advantage-std unbiased: exit %d, stderr %q; want %d naming the flag and the kinds", code, stderr.String(), exitUsage)
	}
	if _, err := os.Stat(out); err == nil {
		t.Errorf("the refused serve made %s", out)
	}
}
