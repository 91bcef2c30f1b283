package main

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/cookiejar"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"legato/rl/internal/httpapi"
)

// TestViewServes runs legato rl view on a free loopback port: the link it
// prints opens the run's page (its token sets the cookie), a request
// without the token is refused, and the command returns when its ctx ends.
func TestViewServes(t *testing.T) {
	t.Setenv(httpapi.TokenEnv, "")
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- new(viewCommand).Run(ctx, []string{fixedRun, "--addr", "127.0.0.1:0"}, pw, io.Discard)
		pw.Close()
	}()
	lines := bufio.NewReader(pr)
	first, err := lines.ReadString('\n')
	if err != nil {
		t.Fatalf("no link printed: %v (command: %v)", err, <-done)
	}
	go io.Copy(io.Discard, lines)
	link, ok := strings.CutPrefix(strings.TrimSpace(first), "open ")
	if !ok || !strings.Contains(link, "/?token=") || !strings.HasPrefix(link, "http://127.0.0.1:") {
		t.Fatalf("first line %q: want open http://127.0.0.1:PORT/?token=...", first)
	}
	jar, _ := cookiejar.New(nil)
	resp, err := (&http.Client{Jar: jar, Timeout: time.Minute}).Get(link)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !bytes.Contains(body, []byte(`id="attempts"`)) {
		t.Errorf("GET %s: %s; want 200 with the run's attempts", link, resp.Status)
	}
	base, _, _ := strings.Cut(link, "?")
	resp, err = http.Get(base)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("GET %s without the token: %s, want 401", base, resp.Status)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("view after its ctx ended: %v, want nil", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("view still serving a minute after its ctx ended")
	}
}

// TestViewOut writes the static pages of the export tests' run, and
// refuses a directory that holds files or lies in the run.
func TestViewOut(t *testing.T) {
	out := filepath.Join(t.TempDir(), "pages")
	var stdout bytes.Buffer
	if err := new(viewCommand).Run(t.Context(), []string{fixedRun, "--out", out}, &stdout, io.Discard); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(stdout.String(), "wrote ") {
		t.Errorf("stdout %q", stdout.String())
	}
	for _, name := range []string{"index.html", "static/view.css", "static/view.js"} {
		if _, err := os.Stat(filepath.Join(out, name)); err != nil {
			t.Error(err)
		}
	}
	if err := new(viewCommand).Run(t.Context(), []string{fixedRun, "--out", out}, io.Discard, io.Discard); err == nil || !strings.Contains(err.Error(), "holds files") {
		t.Errorf("view --out into a full directory: %v, want a refusal", err)
	}
	if err := new(viewCommand).Run(t.Context(), []string{fixedRun, "--out", filepath.Join(fixedRun, "pages")}, io.Discard, io.Discard); err == nil || !strings.Contains(err.Error(), "inside the run directory") {
		t.Errorf("view --out inside the run: %v, want a refusal", err)
	}
}
