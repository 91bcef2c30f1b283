package osworld

import (
	"path/filepath"
	"testing"

	"legato/rl"
	"legato/rl/desktop/osworld/grade"
	"legato/rl/desktop/osworld/setup"
)

// TestAppsTasks keeps the real-apps tasks (testdata/apps-tasks, run on the
// real-apps guest by the integration tests) sound where no VM runs: every
// task loads, its setup steps check, it grades natively (CI has no OSWorld
// checkout), and every task with a setup that does not read the clock
// gets a golden state. Between them they cover the setup steps and getters of
// OSWorld's offline tasks.
func TestAppsTasks(t *testing.T) {
	tasks, err := rl.LoadTasks(filepath.Join("testdata", "apps-tasks", "tasks.json"), rl.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	steps, getters := map[string]bool{}, map[string]bool{}
	for _, tk := range tasks {
		if err := setup.Check(tk, tk.Setup); err != nil {
			t.Errorf("task %s: %v", tk.ID, err)
		}
		if err := grade.NativeCatalog().Check(tk); err != nil {
			t.Errorf("task %s: %v", tk.ID, err)
		}
		clock := false
		for _, s := range tk.Setup {
			steps[s.Type] = true
			clock = clock || s.Type == "update_browse_history"
		}
		ev, err := grade.ParseEvaluator(tk.Evaluator)
		if err != nil {
			t.Fatalf("task %s: %v", tk.ID, err)
		}
		for _, s := range ev.PostConfig {
			steps[s.Type] = true
		}
		for _, m := range ev.Metrics {
			getters[m.Result.Type] = true
			if m.Expected != nil {
				getters[m.Expected.Type] = true
			}
		}
		why := goldenRefusal(tk, GoldenConfig{})
		if refuse := clock || len(tk.Setup) == 0; refuse != (why != "") {
			t.Errorf("task %s: golden state refused: %q; want refused only for a setup that reads the clock, or none", tk.ID, why)
		}
	}
	for _, want := range []string{"launch", "open", "execute", "execute_with_verification", "activate_window",
		"chrome_open_tabs", "chrome_close_tabs", "update_browse_history"} {
		if !steps[want] {
			t.Errorf("no task has a %s step", want)
		}
	}
	for _, want := range []string{"vm_file", "vm_command_line", "open_tabs_info", "vlc_config", "vlc_playing_info",
		"gimp_config_file", "accessibility_tree", "cache_file", "default_video_player", "rule"} {
		if !getters[want] {
			t.Errorf("no task has a %s getter", want)
		}
	}
	programs := map[string]bool{}
	for _, tk := range tasks {
		programs[tk.Domain] = true
	}
	for _, want := range []string{"chrome", "gimp", "libreoffice_calc", "libreoffice_impress", "libreoffice_writer", "os", "thunderbird", "vlc"} {
		if !programs[want] {
			t.Errorf("no task of domain %s", want)
		}
	}
}
