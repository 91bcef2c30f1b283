package grade

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"legato/rl/desktop"
)

func TestGraderConfigValidate(t *testing.T) {
	tests := []struct {
		name    string
		cfg     GraderConfig
		wantErr string // "" for valid
	}{
		{"zero value grades natively", GraderConfig{}, ""},
		{"fixture checkout", GraderConfig{OSWorldDir: "testdata/osworld"}, ""},
		{"not a checkout", GraderConfig{OSWorldDir: "testdata"}, "no desktop_env/evaluators"},
		{"native-only ignores the checkout", GraderConfig{OSWorldDir: "testdata", Mode: NativeOnly}, ""},
		{"unknown mode", GraderConfig{Mode: 7}, "unknown mode"},
		{"negative timeout", GraderConfig{Timeout: -1}, "negative timeout"},
		{"bad port", GraderConfig{Env: Env{VLCPort: 70000}}, "vlc port"},
		{"catalog with a checkout but no bridge", GraderConfig{Catalog: &Catalog{checkout: "/osworld"}}, "set OSWorldDir"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if tt.wantErr == "" {
				if err != nil {
					t.Errorf("Validate = %v, want nil", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("Validate = %v, want an error containing %q", err, tt.wantErr)
			}
		})
	}
}

func TestCloseInterruptsANativeGrade(t *testing.T) {
	entered := make(chan struct{})
	guest := stuckGuest(t, entered)
	g, err := New(GraderConfig{Guest: clientFor(t, guest.URL), CacheDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	task := desktop.Task{ID: "stuck", Evaluator: json.RawMessage(`{"func":"exact_match","result":{"type":"vm_file","path":"/x","dest":"x"},"expected":{"type":"rule","rules":{"expected":null}}}`)}
	errc := make(chan error, 1)
	go func() {
		_, err := g.Grade(context.Background(), task, desktop.DoneAction)
		errc <- err
	}()
	<-entered
	g.Close()
	if err := <-errc; !errors.Is(err, desktop.ErrClosed) {
		t.Errorf("Grade interrupted by Close = %v, want ErrClosed", err)
	}
}

func TestGradeTimesOutASlowGuest(t *testing.T) {
	guest := stuckGuest(t, make(chan struct{}))
	g := newNativeGrader(t, GraderConfig{Guest: clientFor(t, guest.URL), Timeout: 50e6})
	task := desktop.Task{ID: "slow", Evaluator: json.RawMessage(`{"func":"exact_match","result":{"type":"vm_command_line","command":["true"]},"expected":{"type":"rule","rules":{"expected":""}}}`)}
	_, err := g.Grade(context.Background(), task, desktop.DoneAction)
	var ge *Error
	if !errors.Is(err, ErrTimeout) || !errors.As(err, &ge) || ge.Metric != "exact_match" || ge.Op != "result getter vm_command_line" {
		t.Errorf("Grade = %v, want an ErrTimeout naming exact_match's result getter", err)
	}
}

// stuckGuest is a guest server that never answers; entered is closed when
// the first request arrives.
func stuckGuest(t *testing.T, entered chan struct{}) *httptest.Server {
	release := make(chan struct{})
	var once sync.Once
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		once.Do(func() { close(entered) })
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(func() {
		close(release)
		srv.Close()
	})
	return srv
}

func TestGuestClientSaysWhatTheGuestAnswered(t *testing.T) {
	fg := newFakeGuest(t)
	fg.setFile("/there", "x")
	up := fg.client(t)
	down := clientFor(t, fmt.Sprintf("http://127.0.0.1:%d", closedPort(t)))
	ctx := context.Background()
	_, errMissing := up.File(ctx, "/missing")
	_, errCommand := up.Execute(ctx, []string{"no-such-command"}, false)
	_, errDown := down.File(ctx, "/there")
	data, errThere := up.File(ctx, "/there")
	tests := []struct {
		name        string
		err         error
		wantRefused bool
		wantErr     bool
	}{
		{"missing file: 404", errMissing, true, true},
		{"command the guest cannot run: 500", errCommand, true, true},
		{"guest down", errDown, false, true},
		{"file there", errThere, false, false},
	}
	for _, tt := range tests {
		if (tt.err != nil) != tt.wantErr || errors.Is(tt.err, ErrRefused) != tt.wantRefused {
			t.Errorf("%s: error %v, want error %v, refused %v", tt.name, tt.err, tt.wantErr, tt.wantRefused)
		}
	}
	if string(data) != "x" {
		t.Errorf("File(/there) = %q, want %q", data, "x")
	}
}

func TestBridgeEnvironmentKeepsTheKeyOut(t *testing.T) {
	got := bridgeEnviron([]string{"PATH=/bin", "LEGATO_POLICY_KEY=sk-secret", "PYTHONPYCACHEPREFIX=/elsewhere", "HOME=/root",
		"PYTHONIOENCODING=latin-1", "AWS_SECRET_ACCESS_KEY=x", "OPENAI_API_KEY=y", "LC_ALL=C.UTF-8", "PYTHONPATH=/osworld", "LEGATO_OTHER=z",
		"HF_TOKEN=hf_x", "HUGGING_FACE_HUB_TOKEN=hf_y", "HF_HOME=/hf"})
	want := []string{"PATH=/bin", "HOME=/root", "LC_ALL=C.UTF-8", "PYTHONPATH=/osworld", "HF_HOME=/hf", "PYTHONIOENCODING=utf-8"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("bridgeEnviron (-want +got):\n%s", diff)
	}
}
