package grade

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"legato/rl/desktop"
	"legato/rl/desktop/osworld/guest"
	"legato/rl/desktop/osworld/setup"
)

// scriptedMetric is a native metric for semantics tests: rules
// {"name": ..., "score": s} or {"name": ..., "raise": true}. It records the
// names of the metrics that ran.
type scriptedMetric struct {
	mu  sync.Mutex
	ran []string
}

func (s *scriptedMetric) metric() nativeMetric {
	return nativeMetric{params: []string{"result", "rules"}, run: func(args []any, _ *pyDict) (float64, error) {
		rules := args[1].(*pyDict)
		name, _ := rules.get("name")
		s.mu.Lock()
		s.ran = append(s.ran, fmt.Sprint(name))
		s.mu.Unlock()
		if v, _ := rules.get("raise"); pyTruthy(v) {
			return 0, raise("RuntimeError", "scripted failure")
		}
		switch v := rules.vals["score"].(type) {
		case float64:
			return v, nil
		case *big.Int:
			return float64(v.Int64()), nil
		}
		return 0, fmt.Errorf("no score")
	}}
}

// scriptedSlot is one metric of a scripted evaluator: its score, or "raise",
// or "nofile" for a result getter that finds no file.
func scriptedSlot(name string, outcome any) (result, expected string) {
	result = `{"type":"rule","rules":null}`
	rules := map[string]any{"name": name}
	switch outcome {
	case "raise":
		rules["raise"] = true
	case "nofile":
		result = `{"type":"cache_file","path":"never-written.txt"}`
		rules["score"] = 1
	default:
		rules["score"] = outcome
	}
	b, _ := json.Marshal(map[string]any{"type": "rule", "rules": rules})
	return result, string(b)
}

// scriptedEvaluator builds an evaluator of scripted metrics; conj "" means a
// single metric.
func scriptedEvaluator(conj string, outcomes ...any) json.RawMessage {
	var funcs, results, expected []string
	for i, o := range outcomes {
		r, e := scriptedSlot(fmt.Sprintf("m%d", i), o)
		funcs = append(funcs, `"scripted"`)
		results = append(results, r)
		expected = append(expected, e)
	}
	if conj == "" {
		return json.RawMessage(fmt.Sprintf(`{"func":"scripted","result":%s,"expected":%s}`, results[0], expected[0]))
	}
	conjField := ""
	if conj != "default" {
		conjField = fmt.Sprintf(`"conj":%q,`, conj)
	}
	return json.RawMessage(fmt.Sprintf(`{"func":[%s],%s"result":[%s],"expected":[%s]}`,
		strings.Join(funcs, ","), conjField, strings.Join(results, ","), strings.Join(expected, ",")))
}

func newNativeGrader(t testing.TB, cfg GraderConfig) *Grader {
	t.Helper()
	if cfg.CacheDir == "" {
		cfg.CacheDir = t.TempDir()
	}
	if cfg.BytecodeDir == "" {
		cfg.BytecodeDir = filepath.Join(cfg.CacheDir, "pycache")
	}
	g, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	return g
}

func TestGradeCombinesLikeOSWorld(t *testing.T) {
	tests := []struct {
		name      string
		evaluator json.RawMessage
		last      desktop.Action
		want      float64
		wantRan   []string
	}{
		{"single metric", scriptedEvaluator("", 0.5), desktop.DoneAction, 0.5, []string{"m0"}},
		{"single metric, no actions at all", scriptedEvaluator("", 1.0), desktop.Action{}, 1, []string{"m0"}},
		{"FAIL on a feasible task scores 0 without grading", scriptedEvaluator("", 1.0), desktop.FailAction, 0, nil},
		{"FAIL on a feasible list scores 0 without grading", scriptedEvaluator("and", 1.0, 1.0), desktop.FailAction, 0, nil},
		{"and: mean of non-zero scores", scriptedEvaluator("and", 1.0, 0.5), desktop.DoneAction, 0.75, []string{"m0", "m1"}},
		{"and is the default conj", scriptedEvaluator("default", 0.5, 0.25), desktop.DoneAction, 0.375, []string{"m0", "m1"}},
		{"and: stops at the first zero", scriptedEvaluator("and", 0.5, 0.0, "raise"), desktop.DoneAction, 0, []string{"m0", "m1"}},
		{"or: stops at the first one", scriptedEvaluator("or", 0.2, 1.0, "raise"), desktop.DoneAction, 1, []string{"m0", "m1"}},
		{"or: else the maximum", scriptedEvaluator("or", 0.2, 0.6, 0.4), desktop.DoneAction, 0.6, []string{"m0", "m1", "m2"}},
		{"or: zeros stay zero", scriptedEvaluator("or", 0.0, 0.0), desktop.DoneAction, 0, []string{"m0", "m1"}},
		{"missing file: single metric scores 0", scriptedEvaluator("", "nofile"), desktop.DoneAction, 0, nil},
		{"missing file: and scores 0 at once", scriptedEvaluator("and", "nofile", "raise"), desktop.DoneAction, 0, nil},
		{"missing file: or goes on with 0 for that metric", scriptedEvaluator("or", "nofile", 0.4), desktop.DoneAction, 0.4, []string{"m1"}},
		{"list of one metric", scriptedEvaluator("and", 0.3), desktop.DoneAction, 0.3, []string{"m0"}},
		{"code action is not FAIL", scriptedEvaluator("", 0.7), desktop.Action{Kind: desktop.Code, Code: "pyautogui.click(1, 2)"}, 0.7, []string{"m0"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := newNativeGrader(t, GraderConfig{})
			sm := &scriptedMetric{}
			g.extraMetrics = map[string]nativeMetric{"scripted": sm.metric()}
			got, err := g.Grade(context.Background(), desktop.Task{ID: "t1", Evaluator: tt.evaluator}, tt.last)
			if err != nil {
				t.Fatalf("Grade: %v", err)
			}
			if got != tt.want {
				t.Errorf("Grade = %v, want %v", got, tt.want)
			}
			if diff := cmp.Diff(tt.wantRan, sm.ran); diff != "" {
				t.Errorf("metrics run (-want +got):\n%s", diff)
			}
		})
	}
}

func TestGradeNamesTheFailingMetric(t *testing.T) {
	g := newNativeGrader(t, GraderConfig{})
	sm := &scriptedMetric{}
	g.extraMetrics = map[string]nativeMetric{"scripted": sm.metric()}
	_, err := g.Grade(context.Background(), desktop.Task{ID: "t-err", Evaluator: scriptedEvaluator("and", 1.0, "raise")}, desktop.DoneAction)
	var ge *Error
	if !errors.As(err, &ge) {
		t.Fatalf("Grade error = %v, want an *Error", err)
	}
	var pe *PythonError
	if !errors.As(err, &pe) || pe.Type != "RuntimeError" {
		t.Errorf("Grade error = %v, want a RuntimeError raised by the metric", err)
	}
	got := struct {
		Task, Metric, Op string
		Index            int
	}{ge.TaskID, ge.Metric, ge.Op, ge.Index}
	want := struct {
		Task, Metric, Op string
		Index            int
	}{"t-err", "scripted", "metric", 1}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Error fields (-want +got):\n%s", diff)
	}
	if !desktop.IsFailure(context.Background(), err) {
		t.Errorf("IsFailure(%v) = false, want true: a failed grade is an env failure", err)
	}
}

func TestGradeInfeasible(t *testing.T) {
	task := loadTask(t, "3720f614-37fd-4d04-8a6b-76f54f8c222d")
	withPost := desktop.Task{ID: "inf-post", Evaluator: json.RawMessage(`{"func":"infeasible","postconfig":[{"type":"sleep","parameters":{"seconds":0}}]}`)}
	tests := []struct {
		name     string
		task     desktop.Task
		last     desktop.Action
		want     float64
		wantPost int
	}{
		{"FAIL scores 1", task, desktop.FailAction, 1, 0},
		{"DONE scores 0", task, desktop.DoneAction, 0, 0},
		{"no action scores 0", task, desktop.Action{}, 0, 0},
		{"a code action scores 0", task, desktop.Action{Kind: desktop.Code, Code: "pass"}, 0, 0},
		{"WAIT scores 0", task, desktop.WaitAction, 0, 0},
		{"postconfig runs first, FAIL scores 1", withPost, desktop.FailAction, 1, 1},
		{"postconfig runs first, DONE scores 0", withPost, desktop.DoneAction, 0, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			posts := 0
			g := newNativeGrader(t, GraderConfig{PostConfig: func(ctx context.Context, _ desktop.Task, steps []desktop.SetupStep, cacheDir string) error {
				posts++
				return nil
			}})
			got, err := g.Grade(context.Background(), tt.task, tt.last)
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want || posts != tt.wantPost {
				t.Errorf("Grade = %v with %d postconfig runs, want %v with %d", got, posts, tt.want, tt.wantPost)
			}
		})
	}
}

func TestGradeRunsPostConfigBeforeGetters(t *testing.T) {
	// thunderbird/dfac9ee8 writes its result file into the cache directory
	// from postconfig; the cache_file getter must find it there.
	task := loadTask(t, "dfac9ee8-9bc4-4cdc-b465-4a4bfcd2f397")
	task.Evaluator = json.RawMessage(`{
		"postconfig": [{"type": "execute", "parameters": {"command": ["true"], "stdout": "out.txt"}}],
		"func": "compare_text_file",
		"result": {"type": "cache_file", "path": "out.txt"},
		"expected": {"type": "cache_file", "path": "out.txt"}}`)
	var steps []desktop.SetupStep
	g := newNativeGrader(t, GraderConfig{PostConfig: func(ctx context.Context, _ desktop.Task, s []desktop.SetupStep, cacheDir string) error {
		steps = s
		return os.WriteFile(filepath.Join(cacheDir, "out.txt"), []byte("accounts"), 0o644)
	}})
	got, err := g.Grade(context.Background(), task, desktop.DoneAction)
	if err != nil {
		t.Fatal(err)
	}
	if got != 1 || len(steps) != 1 || steps[0].Type != "execute" {
		t.Errorf("Grade = %v after postconfig steps %+v, want 1 after the execute step", got, steps)
	}

	// The next attempt's postconfig produces nothing: the file from the
	// first attempt must not be graded again.
	g.cfg.PostConfig = func(context.Context, desktop.Task, []desktop.SetupStep, string) error { return nil }
	got, err = g.Grade(context.Background(), task, desktop.DoneAction)
	if err != nil || got != 0 {
		t.Errorf("second Grade = %v, %v; want 0 (no stale cache file)", got, err)
	}
}

func TestGradePostConfigFailureIsAnError(t *testing.T) {
	task := loadTask(t, "0ed39f63-6049-43d4-ba4d-5fa2fe04a951")
	boom := errors.New("activate_window: no such window")
	g := newNativeGrader(t, GraderConfig{
		Guest:      newFakeGuest(t).client(t),
		PostConfig: func(context.Context, desktop.Task, []desktop.SetupStep, string) error { return boom },
	})
	_, err := g.Grade(context.Background(), task, desktop.DoneAction)
	var ge *Error
	if !errors.As(err, &ge) || ge.Op != "postconfig" || !errors.Is(err, boom) {
		t.Errorf("Grade error = %v, want a postconfig *Error wrapping %v", err, boom)
	}
}

func TestGradeRefusesWhatItCannotRun(t *testing.T) {
	guest := clientFor(t, "http://127.0.0.1:1")
	tests := []struct {
		name   string
		cfg    GraderConfig
		task   desktop.Task
		substr []string
	}{
		{"metric neither native nor in a checkout", GraderConfig{Guest: guest},
			loadTask(t, "3680a5ee-6870-426a-a997-eba929a0d25c"),
			[]string{"3680a5ee-6870-426a-a997-eba929a0d25c", `metric "compare_csv"`, "not implemented natively", "no OSWorld checkout"}},
		{"getter not native", GraderConfig{Guest: guest},
			desktop.Task{ID: "tabs", Evaluator: json.RawMessage(`{"func":"exact_match","result":{"type":"default_search_engine"},"expected":{"type":"rule","rules":{"expected":1}}}`)},
			[]string{"tabs", `metric "exact_match"`, `getter "default_search_engine"`}},
		{"port getter without the port", GraderConfig{Guest: guest},
			desktop.Task{ID: "vlc", Evaluator: json.RawMessage(`{"func":"is_vlc_playing","result":{"type":"vlc_playing_info","dest":"s.xml"},"expected":{"type":"rule","rules":{"type":"file_name","file_name":"a.wav"}}}`)},
			[]string{"vlc", `getter "vlc_playing_info"`, "vlc=PORT"}},
		{"postconfig without a runner", GraderConfig{Guest: guest},
			loadTask(t, "0ed39f63-6049-43d4-ba4d-5fa2fe04a951"),
			[]string{"0ed39f63-6049-43d4-ba4d-5fa2fe04a951", "postconfig"}},
		{"guest getter without a guest", GraderConfig{},
			loadTask(t, "28cc3b7e-b194-4bc9-8353-d04c0f4d56d2"),
			[]string{"28cc3b7e", `getter "vm_command_line"`, "no Guest"}},
		{"malformed evaluator", GraderConfig{},
			desktop.Task{ID: "bad", Evaluator: json.RawMessage(`{"func":["a"],"result":{"type":"rule"}}`)},
			[]string{"bad", "must be a list too"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := newNativeGrader(t, tt.cfg)
			_, err := g.Grade(context.Background(), tt.task, desktop.DoneAction)
			if !errors.Is(err, desktop.ErrUnsupported) {
				t.Fatalf("Grade error = %v, want one wrapping desktop.ErrUnsupported", err)
			}
			if desktop.IsFailure(context.Background(), err) {
				t.Errorf("IsFailure(%v) = true; an unsupported task is not a desktop failure", err)
			}
			for _, s := range tt.substr {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not mention %q", err, s)
				}
			}
		})
	}
}

func TestCatalogChecksBeforeTheBatch(t *testing.T) {
	tasks := []desktop.Task{
		loadTask(t, "3720f614-37fd-4d04-8a6b-76f54f8c222d"), // infeasible
		loadTask(t, "28cc3b7e-b194-4bc9-8353-d04c0f4d56d2"), // exact_match
		loadTask(t, "2b9493d7-49b8-493a-a71b-56cd1f4d6908"), // check_include_exclude
		loadTask(t, "3680a5ee-6870-426a-a997-eba929a0d25c"), // compare_csv: not native
		loadTask(t, "550ce7e7-747b-495f-b122-acdc4d0b8e54"), // compare_pptx_files: not native
	}
	err := NativeCatalog().CheckTasks(tasks)
	var refused []string
	for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
		var ue *UnsupportedError
		if !errors.As(e, &ue) {
			t.Fatalf("CheckTasks error %v is not an *UnsupportedError", e)
		}
		refused = append(refused, ue.TaskID+" "+ue.Metric)
	}
	want := []string{
		"3680a5ee-6870-426a-a997-eba929a0d25c compare_csv",
		"550ce7e7-747b-495f-b122-acdc4d0b8e54 compare_pptx_files",
	}
	if diff := cmp.Diff(want, refused); diff != "" {
		t.Errorf("refused tasks (-want +got):\n%s", diff)
	}
}

func TestGradeRealTasksNatively(t *testing.T) {
	cloud := newFileServer(t, map[string]string{
		"/vscode_replace_text_gold.txt": "hello legato\n",
		"/output.csv":                   "a,b\n",
		"/output_gold2.csv":             "a,b\n",
		"/output_gold3.csv":             "b,a\n",
	})
	osTask := loadTask(t, "28cc3b7e-b194-4bc9-8353-d04c0f4d56d2")
	var osEval struct {
		Result struct{ Command string } `json:"result"`
	}
	json.Unmarshal(osTask.Evaluator, &osEval)

	// Point the tasks' cloud files at the loopback server.
	vscode := loadTask(t, "0ed39f63-6049-43d4-ba4d-5fa2fe04a951")
	vscode.Evaluator = json.RawMessage(strings.ReplaceAll(string(vscode.Evaluator),
		"https://huggingface.co/datasets/xlangai/ubuntu_osworld_file_cache/resolve/main/vs_code/0ed39f63-6049-43d4-ba4d-5fa2fe04a951",
		cloud.srv.URL))
	andTask := loadTask(t, "3680a5ee-6870-426a-a997-eba929a0d25c")
	andTask.Evaluator = json.RawMessage(strings.ReplaceAll(string(andTask.Evaluator),
		"https://huggingface.co/datasets/xlangai/ubuntu_osworld_file_cache/resolve/main/multi_apps/3680a5ee-6870-426a-a997-eba929a0d25c",
		cloud.srv.URL))
	var andEval struct {
		Result []struct{ Command []any } `json:"result"`
	}
	json.Unmarshal(andTask.Evaluator, &andEval)

	// compare_csv is not native; this stand-in scores 0.5 when it receives
	// the result file and the three gold files of the multi cloud_file.
	compareCSV := nativeMetric{params: []string{"result", "expected"}, varKW: true,
		run: func(args []any, _ *pyDict) (float64, error) {
			gold, _ := args[1].([]any)
			if len(gold) != 3 {
				return 0, fmt.Errorf("got %d gold files, want 3", len(gold))
			}
			for _, p := range append([]any{args[0]}, gold...) {
				if _, err := readText(p); err != nil {
					return 0, err
				}
			}
			return 0.5, nil
		}}

	tests := []struct {
		name  string
		task  desktop.Task
		setup func(*fakeGuest)
		want  float64
	}{
		{"os exact_match: volume is 100", osTask, func(g *fakeGuest) { g.setCommand(osEval.Result.Command, true, "100\n") }, 1},
		{"os exact_match: volume is 50", osTask, func(g *fakeGuest) { g.setCommand(osEval.Result.Command, true, "50\n") }, 0},
		{"os exact_match: command refused gives None", osTask, func(g *fakeGuest) {}, 0},
		{"vs_code compare_text_file: same text", vscode, func(g *fakeGuest) { g.setFile("/home/user/Desktop/vscode_replace_text.txt", "hello legato\n") }, 1},
		{"vs_code compare_text_file: other text", vscode, func(g *fakeGuest) { g.setFile("/home/user/Desktop/vscode_replace_text.txt", "hello world\n") }, 0},
		{"vs_code compare_text_file: no result file", vscode, func(g *fakeGuest) {}, 0},
		{"and list: mean of 1 and 0.5", andTask, func(g *fakeGuest) {
			g.setCommand(andEval.Result[0].Command, false, "use terminal\n")
			g.setFile("/home/user/Desktop/output.csv", "a,b\n")
		}, 0.75},
		{"and list: first metric 0 stops", andTask, func(g *fakeGuest) {
			g.setCommand(andEval.Result[0].Command, false, "use no terminal\n")
		}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			guest := newFakeGuest(t)
			tt.setup(guest)
			g := newNativeGrader(t, GraderConfig{
				Guest:      guest.client(t),
				PostConfig: func(context.Context, desktop.Task, []desktop.SetupStep, string) error { return nil },
			})
			g.extraMetrics = map[string]nativeMetric{"compare_csv": compareCSV}
			got, err := g.Grade(context.Background(), tt.task, desktop.DoneAction)
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Errorf("Grade = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestCloudFilesAreDownloadedOnce(t *testing.T) {
	cloud := newFileServer(t, map[string]string{"/gold.txt": "x\n"})
	task := desktop.Task{ID: "cloud", Evaluator: json.RawMessage(fmt.Sprintf(
		`{"func":"compare_text_file","result":{"type":"cloud_file","path":%q,"dest":"a.txt"},"expected":{"type":"cloud_file","path":%q,"dest":"b.txt"}}`,
		cloud.url("/gold.txt"), cloud.url("/gold.txt")))}
	downloads := t.TempDir()
	for i := range 3 {
		// Graders of different desktops may share the download cache.
		g := newNativeGrader(t, GraderConfig{DownloadDir: downloads})
		got, err := g.Grade(context.Background(), task, desktop.DoneAction)
		if err != nil || got != 1 {
			t.Fatalf("Grade #%d = %v, %v; want 1", i, got, err)
		}
	}
	if n := cloud.hitCount("/gold.txt"); n != 1 {
		t.Errorf("gold file downloaded %d times, want 1", n)
	}

	missing := desktop.Task{ID: "cloud404", Evaluator: json.RawMessage(fmt.Sprintf(
		`{"func":"compare_text_file","result":{"type":"rule","rules":"x"},"expected":{"type":"cloud_file","path":%q,"dest":"c.txt"}}`,
		cloud.url("/nope.txt")))}
	g := newNativeGrader(t, GraderConfig{})
	_, err := g.Grade(context.Background(), missing, desktop.DoneAction)
	var ge *Error
	if !errors.As(err, &ge) || ge.Op != "expected getter cloud_file" || !strings.Contains(err.Error(), "404") {
		t.Errorf("Grade with a missing cloud file: %v, want an expected getter error naming 404", err)
	}
}

func TestPostConfigThroughTheSetupController(t *testing.T) {
	fg := newFakeGuest(t)
	fg.setCommand([]string{"python3", "/home/user/Desktop/firefox_decrypt.py", "/home/user/.thunderbird"}, false, "url,user\nimap://x,anonym\n")
	client, err := guest.New(fg.srv.URL, guest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer client.CloseIdleConnections()
	ctrl := &setup.Controller{Guest: client}
	gold := writeTemp(t, "gold.csv", "url,user\nimap://x,anonym\n")
	task := desktop.Task{ID: "dfac9ee8", Evaluator: json.RawMessage(fmt.Sprintf(`{
		"postconfig": [{"type": "execute", "parameters": {
			"command": ["python3", "/home/user/Desktop/firefox_decrypt.py", "/home/user/.thunderbird"],
			"stdout": "thunderbird-accounts.csv"}}],
		"func": "compare_text_file",
		"result": {"type": "cache_file", "path": "thunderbird-accounts.csv"},
		"expected": {"type": "rule", "rules": %q}}`, gold))}
	g := newNativeGrader(t, GraderConfig{
		Guest: fg.client(t),
		PostConfig: func(ctx context.Context, task desktop.Task, steps []desktop.SetupStep, cacheDir string) error {
			c := *ctrl
			c.OutputDir = cacheDir
			return c.Run(ctx, task, steps)
		},
	})
	got, err := g.Grade(context.Background(), task, desktop.DoneAction)
	if err != nil || got != 1 {
		t.Errorf("Grade = %v, %v; want 1 from the file the postconfig step saved", got, err)
	}
}

// EvaluateAgain runs the getters and metric again, not the postconfig: a
// guest whose answer changed between the two grades gives another reward.
func TestEvaluateAgainSkipsPostConfig(t *testing.T) {
	task := loadTask(t, "0ed39f63-6049-43d4-ba4d-5fa2fe04a951")
	task.Evaluator = json.RawMessage(`{
		"postconfig": [{"type": "execute", "parameters": {"command": ["true"]}}],
		"func": "check_include_exclude",
		"result": {"type": "vm_command_line", "command": "cat /tmp/answer", "shell": true},
		"expected": {"type": "rule", "rules": {"include": ["yes"], "exclude": []}}}`)
	guest := newFakeGuest(t)
	posts := 0
	g := newNativeGrader(t, GraderConfig{
		Guest: guest.client(t),
		PostConfig: func(context.Context, desktop.Task, []desktop.SetupStep, string) error {
			posts++
			return nil
		},
	})
	guest.setCommand("cat /tmp/answer", true, "yes\n")
	first, err := g.Evaluate(context.Background(), task, desktop.DoneAction)
	if err != nil {
		t.Fatal(err)
	}
	guest.setCommand("cat /tmp/answer", true, "no\n")
	again, err := g.EvaluateAgain(context.Background(), task, desktop.DoneAction)
	if err != nil {
		t.Fatal(err)
	}
	if first.Score != 1 || again.Score != 0 || posts != 1 {
		t.Errorf("Evaluate %v, EvaluateAgain %v after %d postconfig runs; want 1, then 0 (the getter ran again), after 1", first.Score, again.Score, posts)
	}
}

// EvaluateAgain grades what the last Evaluate's postconfig steps wrote on
// the host as they left it (no getter fetches it again), and refuses a
// task whose postconfig output it does not hold.
func TestEvaluateAgainKeepsPostConfigOutput(t *testing.T) {
	gold := writeTemp(t, "gold.txt", "accounts")
	task := desktop.Task{ID: "dfac9ee8", Evaluator: json.RawMessage(fmt.Sprintf(`{
		"postconfig": [{"type": "execute", "parameters": {"command": ["true"], "stdout": "out/accounts.txt"}}],
		"func": "compare_text_file",
		"result": {"type": "cache_file", "path": "out/accounts.txt"},
		"expected": {"type": "rule", "rules": %q}}`, gold))}
	// Each postconfig run does what the next of these says: write the
	// output, write nothing, or fail.
	var runs []string
	g := newNativeGrader(t, GraderConfig{PostConfig: func(_ context.Context, _ desktop.Task, _ []desktop.SetupStep, cacheDir string) error {
		if len(runs) == 0 {
			t.Error("a postconfig run no grade asked for (EvaluateAgain ran it?)")
			return nil
		}
		run := runs[0]
		runs = runs[1:]
		switch run {
		case "write":
			if err := os.MkdirAll(filepath.Join(cacheDir, "out"), 0o755); err != nil {
				return err
			}
			return os.WriteFile(filepath.Join(cacheDir, "out", "accounts.txt"), []byte("accounts"), 0o644)
		case "fail":
			return errors.New("the guest did not answer")
		}
		return nil
	}})
	ctx := context.Background()
	grade := func(again bool) (float64, error) {
		if again {
			r, err := g.EvaluateAgain(ctx, task, desktop.DoneAction)
			return r.Score, err
		}
		r, err := g.Evaluate(ctx, task, desktop.DoneAction)
		return r.Score, err
	}
	for _, tc := range []struct {
		name    string
		again   bool
		runs    []string // the postconfig runs the grade makes
		want    float64
		wantErr string
	}{
		{"again before any Evaluate", true, nil, 0, "Evaluate before EvaluateAgain"},
		{"Evaluate, its postconfig writing the file", false, []string{"write"}, 1, ""},
		{"again: the file is still there", true, nil, 1, ""},
		{"again, twice", true, nil, 1, ""},
		{"Evaluate, its postconfig writing nothing", false, []string{"nothing"}, 0, ""},
		{"again: not the first Evaluate's file", true, nil, 0, ""},
		{"Evaluate, its postconfig failing", false, []string{"fail"}, 0, "the guest did not answer"},
		{"again after a failed postconfig", true, nil, 0, "Evaluate before EvaluateAgain"},
	} {
		runs = slices.Clone(tc.runs)
		got, err := grade(tc.again)
		if len(runs) != 0 {
			t.Errorf("%s: postconfig runs %v left undone", tc.name, runs)
		}
		switch {
		case tc.wantErr == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Errorf("%s: error %v; want one saying %q", tc.name, err, tc.wantErr)
		case got != tc.want:
			t.Errorf("%s: score %v; want %v", tc.name, got, tc.want)
		}
	}
}
