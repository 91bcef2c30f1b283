// Package httpapitest holds what the tests of `legato rl serve` share, in
// process (package httpapi) and as the real command (cmd/legato): a call
// over HTTP with a bearer token, and the service's journal.
package httpapitest

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rl "legato/rl"
)

// Call sends a request with the Authorization header authz (none when
// empty) and returns the status and the body.
func Call(t testing.TB, method, url, authz, body string) (int, string) {
	t.Helper()
	return CallWithin(t, 6*time.Minute, method, url, authz, body)
}

// CallWithin is Call with an answer due within d: a request that should be
// answered at once fails the test instead of hanging it.
func CallWithin(t testing.TB, d time.Duration, method, url, authz, body string) (int, string) {
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

// JournalLines reads the service journal in the run directory dir.
func JournalLines(t testing.TB, dir string) []map[string]any {
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
