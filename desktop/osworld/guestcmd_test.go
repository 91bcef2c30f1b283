package osworld

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"legato/rl/desktop/osworld/guest"
)

// TestPasswordNotInErrors: a guest server that quotes the failed command in
// its answer (as OSWorld's does for a command that timed out) does not get
// the sudo password into the error.
func TestPasswordNotInErrors(t *testing.T) {
	const pw = "hunter2-legato"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusInternalServerError)
		// The command, quoted the way Python's TimeoutExpired does.
		w.Write([]byte(`{"status": "error", "message": "Command '` + strings.ReplaceAll(string(body), `"`, `'`) + `' timed out after 120 seconds"}`))
	}))
	defer srv.Close()
	c, err := guest.New(srv.URL, guest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseIdleConnections()
	sh := &guestShell{client: c, password: pw}
	_, err = sh.runRoot(t.Context(), `true`)
	if err == nil {
		t.Fatal("runRoot against a failing guest: nil error")
	}
	if strings.Contains(err.Error(), pw) {
		t.Errorf("the error shows the password: %v", err)
	}
	var gerr *guest.Error
	if !errors.As(err, &gerr) || gerr.Status != http.StatusInternalServerError {
		t.Errorf("the error lost its guest.Error: %#v", err)
	}
	if !strings.Contains(gerr.Error(), pw) {
		t.Errorf("the guest's answer, %q, does not quote the password: the test proves nothing", gerr.Body)
	}
	if !strings.Contains(err.Error(), "timed out") {
		t.Errorf("the error lost its message: %v", err)
	}
}
