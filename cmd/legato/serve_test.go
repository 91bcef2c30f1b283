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
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rl "legato/rl"
	"legato/rl/desktop"
	"legato/rl/desktop/fake"
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

// TestServeHTTP checks the HTTP front's answers to bad requests and its
// bearer token, on a service in this process.
func TestServeHTTP(t *testing.T) {
	srv := policytest.NewServer(policytest.Options{NoLatency: true})
	defer srv.Close()
	svc, err := rl.Serve(t.Context(), rl.PolicyConfig{BaseURL: srv.URL(), Model: "scripted", Version: "v1"},
		rl.ServeOptions{CollectOptions: rl.CollectOptions{Out: filepath.Join(t.TempDir(), "run"),
			NewDesktop: fake.NewFleet(fake.Config{Width: 320, Height: 192}).New, Desktops: 1, Group: 1, MaxSteps: 2,
			Ready: desktop.ReadyOptions{Interval: time.Millisecond, Max: 50 * time.Millisecond}}})
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close()
	h := httptest.NewServer(newServeHandler(svc, "s3cret", slog.New(slog.DiscardHandler)))
	defer h.Close()
	do := func(method, path, token, body string) (int, string) {
		req, _ := http.NewRequestWithContext(t.Context(), method, h.URL+path, strings.NewReader(body))
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	task := `{"task_id": "t1", "domain": "os", "config": {"id": "t1", "instruction": "x", "evaluator": {"func": "exact_match"}}}`
	for _, tt := range []struct {
		method, path, token, body string
		status                    int
		words                     string
	}{
		{"GET", "/v1/status", "", "", 401, "bearer token"},
		{"GET", "/v1/status", "wrong", "", 401, "bearer token"},
		{"POST", "/v1/groups", "s3cret", `{"task": ` + task + `, "group_size": 2000}`, 400, "group_size 2000"},
		{"POST", "/v1/groups", "s3cret", `{"task": ` + task + `} {}`, 400, "more than one JSON value"},
		{"POST", "/v1/groups", "s3cret", `not json`, 400, "body"},
		{"GET", "/v1/groups/g1?wait=-1", "s3cret", "", 400, "wait="},
		{"GET", "/v1/stream?limit=x", "s3cret", "", 400, "limit="},
		{"POST", "/v1/policy", "s3cret", `{"state": "serving", "version": "a\nb"}`, 400, "one line"},
		{"GET", "/v1/blobs/zz", "s3cret", "", 400, "sha256"},
		{"PUT", "/v1/groups", "s3cret", "", 404, "no endpoint PUT /v1/groups"},
		{"POST", "/v1/groups", "s3cret", `{"task": ` + task + `, "group_size": 1}`, 201, `"id":"g000001"`},
	} {
		status, body := do(tt.method, tt.path, tt.token, tt.body)
		if status != tt.status || !strings.Contains(body, tt.words) {
			t.Errorf("%s %s: %d %s, want %d with %q", tt.method, tt.path, status, body, tt.status, tt.words)
		}
		if status >= 400 {
			var e struct{ Error string }
			if json.Unmarshal([]byte(body), &e) != nil || e.Error == "" {
				t.Errorf("%s %s: error body %q is not {\"error\": ...}", tt.method, tt.path, body)
			}
		}
	}
	// Once the group ended (waited for as an event: on a loaded machine
	// at -race it took longer than the stream's idle bound below), the
	// stream hands it over, then waits for more until that bound.
	if status, body := do("GET", "/v1/groups/g000001?wait=300", "s3cret", ""); status != 200 || !strings.Contains(body, `"state":"closed"`) || !strings.Contains(body, `"cursor":1`) {
		t.Fatalf("group g000001: %d %s, want it ended", status, body)
	}
	status, body := do("GET", "/v1/stream?after=0&wait=0.2", "s3cret", "")
	lines := bytes.Split(bytes.TrimSpace([]byte(body)), []byte("\n"))
	if status != 200 || len(lines) != 1 || !bytes.Contains(lines[0], []byte(`"cursor":1`)) {
		t.Errorf("stream: %d %q, want one line with cursor 1", status, body)
	}
	_, metrics := do("GET", "/metrics", "s3cret", "")
	for _, want := range []string{"# TYPE legato_groups gauge\n", `legato_groups{state="closed"} 1` + "\n",
		`legato_records_total{status="ok"} 1` + "\n", "legato_stream_cursor 1\n", "legato_policy_paused 0\n"} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %q:\n%s", want, metrics)
		}
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
