package setup_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"

	"legato/rl/desktop"
	"legato/rl/desktop/osworld/guest"
	"legato/rl/desktop/osworld/setup"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func steps(t *testing.T, js string) []desktop.SetupStep {
	t.Helper()
	var s []desktop.SetupStep
	if err := json.Unmarshal([]byte(js), &s); err != nil {
		t.Fatal(err)
	}
	return s
}

func TestCheck(t *testing.T) {
	task := desktop.Task{ID: "t-1"}
	tests := []struct {
		name        string
		steps       string
		wantErr     string // substring; "" means no error
		unsupported bool
	}{
		{"every type", `[
			{"type":"download","parameters":{"files":[{"url":"https://x/a.xlsx","path":"/home/user/a.xlsx"}]}},
			{"type":"upload_file","parameters":{"files":[{"local_path":"a","path":"/home/user/a"}]}},
			{"type":"launch","parameters":{"command":["google-chrome","--remote-debugging-port=1337"]}},
			{"type":"launch","parameters":{"command":"VLC_VERBOSE=-1 vlc","shell":true}},
			{"type":"open","parameters":{"path":"/home/user/a.xlsx"}},
			{"type":"execute","parameters":{"command":["python3","x.py"],"stdout":"out.csv","until":{"returncode":0}}},
			{"type":"command","parameters":{"command":"echo {CLIENT_PASSWORD} | sudo -S true","shell":"true"}},
			{"type":"execute_with_verification","parameters":{"command":["gedit"],"verification":{"window_exists":"gedit"},"max_wait_time":5,"check_interval":0.5}},
			{"type":"activate_window","parameters":{"window_name":"a.xlsx - LibreOffice Calc","strict":true}},
			{"type":"close_window","parameters":{"window_name":"gimp","by_class":true}},
			{"type":"change_wallpaper","parameters":{"path":"/home/user/w.png"}},
			{"type":"sleep","parameters":{"seconds":0.5}},
			{"type":"chrome_open_tabs","parameters":{"urls_to_open":["https://a.example"]}},
			{"type":"chrome_close_tabs","parameters":{"urls_to_close":["https://a.example"]}},
			{"type":"update_browse_history","parameters":{"history":[{"url":"https://a.example","title":"A","visit_time_from_now_in_seconds":60}]}}
		]`, "", false},
		{"googledrive refused", `[{"type":"sleep","parameters":{"seconds":1}},{"type":"googledrive","parameters":{"settings_file":"s.yml","operation":["delete"],"args":[{}]}}]`,
			"step 2 of task t-1 (googledrive): task t-1 cannot run here: it needs Google Drive credentials", true},
		{"login refused", `[{"type":"login","parameters":{"settings_file":"s.json","platform":"googledrive"}}]`,
			"step 1 of task t-1 (login): task t-1 cannot run here", true},
		{"proxy refused", `[{"type":"proxy","parameters":{}}]`, "step 1 of task t-1 (proxy)", true},
		{"unknown type", `[{"type":"tidy_desktop","parameters":{}}]`, `step 1 of task t-1 (tidy_desktop): unknown setup step type "tidy_desktop" (known: activate_window`, false},
		{"unknown parameter", `[{"type":"open","parameters":{"path":"/a","paht":"/b"}}]`, `step 1 of task t-1 (open): parameters: json: unknown field "paht"`, false},
		{"missing parameter", `[{"type":"launch","parameters":{}}]`, "step 1 of task t-1 (launch): parameters: empty command", false},
		{"download without path", `[{"type":"download","parameters":{"files":[{"url":"https://x/a"}]}}]`, "file 1: want both url and path", false},
		{"output file escapes", `[{"type":"execute","parameters":{"command":["true"],"stdout":"../x"}}]`, "must be a relative path", false},
		{"negative sleep", `[{"type":"sleep","parameters":{"seconds":-1}}]`, "want seconds >= 0", false},
		{"bad shell flag", `[{"type":"execute","parameters":{"command":["true"],"shell":[1]}}]`, "want a boolean", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := setup.Check(task, steps(t, tt.steps))
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("Check = %v, want nil", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("Check = %v, want an error containing %q", err, tt.wantErr)
			}
			var se *setup.StepError
			if !errors.As(err, &se) || se.Task != "t-1" {
				t.Errorf("error %v is not a *StepError of task t-1", err)
			}
			if got := errors.Is(err, desktop.ErrUnsupported); got != tt.unsupported {
				t.Errorf("errors.Is(err, ErrUnsupported) = %v, want %v", got, tt.unsupported)
			}
		})
	}
}

// osworldExamples finds OSWorld's real task files: the repository's
// testdata, or shared/ beside the repository.
func osworldExamples(t *testing.T) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..", "..", "..")
	for _, dir := range []string{
		filepath.Join(root, "testdata", "osworld", "evaluation_examples", "examples"),
		filepath.Join(root, "..", "shared", "testdata", "osworld", "evaluation_examples", "examples"),
	} {
		if st, err := os.Stat(dir); err == nil && st.IsDir() {
			return dir
		}
	}
	t.Fatalf("OSWorld task files not found in testdata/osworld or ../shared/testdata/osworld beside the repository %s", root)
	return ""
}

// TestCheckRealTasks decodes the setup and postconfig of every real OSWorld
// task we have: field names and value shapes must match OSWorld's.
func TestCheckRealTasks(t *testing.T) {
	files, _ := filepath.Glob(filepath.Join(osworldExamples(t), "*", "*.json"))
	if len(files) < 30 {
		t.Fatalf("found %d task files, want the 39+ of the small set", len(files))
	}
	refusedTasks := 0
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var task desktop.Task
		if err := json.Unmarshal(raw, &task); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		var ev struct {
			Postconfig []desktop.SetupStep `json:"postconfig"`
		}
		json.Unmarshal(task.Evaluator, &ev)
		for _, s := range [][]desktop.SetupStep{task.Setup, ev.Postconfig} {
			err := setup.Check(task, s)
			if errors.Is(err, desktop.ErrUnsupported) {
				refusedTasks++
				continue
			}
			if err != nil {
				t.Errorf("%s: %v", filepath.Base(f), err)
			}
		}
	}
	t.Logf("%d task files, %d setups refused (googledrive, login)", len(files), refusedTasks)
}

func TestSleepFollowsTheClock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, err := guest.New("http://127.0.0.1:9", guest.Options{})
		if err != nil {
			t.Fatal(err)
		}
		ctrl := &setup.Controller{Guest: c}
		start := time.Now()
		if err := ctrl.Run(context.Background(), desktop.Task{ID: "s"}, steps(t, `[{"type":"sleep","parameters":{"seconds":2.5}}]`)); err != nil {
			t.Fatal(err)
		}
		if got := time.Since(start); got != 2500*time.Millisecond {
			t.Errorf("slept %v, want 2.5s", got)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		err = ctrl.Run(ctx, desktop.Task{ID: "s"}, steps(t, `[{"type":"sleep","parameters":{"seconds":60}}]`))
		if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "step 1 of task s (sleep)") {
			t.Errorf("cancelled sleep: error = %v", err)
		}
	})
}
