package rl

import (
	"bytes"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"path/filepath"
	"strings"
	"testing"
	"testing/synctest"

	"legato/rl/desktop/fake"
	"legato/rl/schema"
)

// TestProbeTasks tries tasks on fake desktops: steady ones are fit, a task
// whose setup fails is unfit for it, and flaky graders (a second grade
// draws anew, so about half of them disagree on their one start state) are
// found; with a quarantine file the unfit tasks go into it.
func TestProbeTasks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tasks := testTasks(11)
		cfg := fake.Config{Width: testWidth, Height: testHeight, Seed: 9, DefaultReward: fake.Reward{P: 0.5},
			Rewards: map[string]fake.Reward{},
			Faults:  []fake.Fault{{Phase: fake.PhaseReset, Kind: fake.FaultError, Prob: 1, Task: "t2"}}}
		flaky := map[string]bool{}
		for i := 3; i < 11; i++ {
			id := fmt.Sprintf("t%d", i)
			flaky[id] = true
			cfg.Rewards[id] = fake.Reward{P: 0.5, Flaky: true}
		}
		fleet := fake.NewFleet(cfg)
		qfile := filepath.Join(t.TempDir(), "q.json")
		probes, err := ProbeTasks(t.Context(), tasks, ProbeTasksOptions{NewDesktop: fleet.New, Desktops: 3, Quarantine: qfile})
		if err != nil {
			t.Fatal(err)
		}
		checkClosed(t, fleet)
		flagged := 0
		for _, p := range probes {
			switch {
			case p.TaskID == "t2":
				if p.Reason != schema.QuarantineSetupFails || !p.Runs[0].ResetFailed {
					t.Errorf("t2 (its reset fails): %+v, want %s", p, schema.QuarantineSetupFails)
				}
			case flaky[p.TaskID]:
				if p.Reason != "" {
					flagged++
					if p.Reason != schema.QuarantineGraderDisagrees {
						t.Errorf("%s: %s (%s), want %s", p.TaskID, p.Reason, p.Evidence, schema.QuarantineGraderDisagrees)
					}
				}
			case p.Reason != "":
				t.Errorf("%s (steady): unfit for %s: %s", p.TaskID, p.Reason, p.Evidence)
			}
			if p.TaskID != "t2" && (p.Runs[0].Screen == "" || p.Runs[0].Screen != p.Runs[1].Screen || p.Runs[0].Reward == nil || p.Runs[0].Again == nil) {
				t.Errorf("%s: runs %+v, want two equal first screens, graded twice", p.TaskID, p.Runs)
			}
		}
		// Binomial(8, 0.5): none or all in 1 of 128 seeds.
		if flagged == 0 || flagged == 8 {
			t.Errorf("%d of 8 flaky graders disagreed on their start state, want about half", flagged)
		}
		q, err := schema.ReadQuarantine(qfile)
		if err != nil {
			t.Fatal(err)
		}
		if len(q.Tasks) != flagged+1 {
			t.Errorf("the quarantine holds %v, want the %d unfit tasks", q.IDs(), flagged+1)
		}
	})
}

// TestProbeTasksSolvedAtStart: a task whose untouched start state already
// scores, all of it or part, is unfit, with the desktop's explanation of the
// grade as evidence, and goes into the quarantine; one that scores only
// after an action is fit.
func TestProbeTasksSolvedAtStart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tasks := testTasks(3)
		fleet := fake.NewFleet(fake.Config{Width: testWidth, Height: testHeight, Seed: 9, Rewards: map[string]fake.Reward{
			"t0": {P: 1}, "t1": {P: 1, AtStart: 1}, "t2": {AtStart: 0.5}}})
		qfile := filepath.Join(t.TempDir(), "q.json")
		probes, err := ProbeTasks(t.Context(), tasks, ProbeTasksOptions{NewDesktop: fleet.New, Desktops: 2, Quarantine: qfile})
		if err != nil {
			t.Fatal(err)
		}
		checkClosed(t, fleet)
		want := map[string]string{
			"t0": "",
			"t1": `the untouched start state scores 1 without an action: fake: task "t1" is set to score 1 untouched (Reward.AtStart)`,
			"t2": `the untouched start state scores 0.5 without an action: fake: task "t2" is set to score 0.5 untouched (Reward.AtStart)`,
		}
		for _, p := range probes {
			wantReason := ""
			if want[p.TaskID] != "" {
				wantReason = schema.QuarantineSolvedAtStart
			}
			if p.Reason != wantReason || p.Evidence != want[p.TaskID] {
				t.Errorf("%s: %q (%s), want %q (%s)", p.TaskID, p.Reason, p.Evidence, wantReason, want[p.TaskID])
			}
		}
		q, err := schema.ReadQuarantine(qfile)
		if err != nil {
			t.Fatal(err)
		}
		if ids := q.IDs(); len(ids) != 2 || ids[0] != "t1" || ids[1] != "t2" {
			t.Fatalf("the quarantine holds %v, want t1 and t2", ids)
		}
		if e := q.Tasks["t1"]; e.Reason != schema.QuarantineSolvedAtStart || e.Evidence != want["t1"] || e.TaskSHA != TaskSHA(tasks[1]) {
			t.Errorf("t1's entry %+v, want reason %s, its evidence and its config's hash", e, schema.QuarantineSolvedAtStart)
		}
	})
}

// TestJudgeProbe: which reason, if any, two tries of a task give, first
// match winning: a failed setup, a failed grader, a reward out of range,
// two grades that disagree, two first screens that differ, then an
// untouched start state that already scores (partial credit too).
func TestJudgeProbe(t *testing.T) {
	f := func(v float64) *float64 { return &v }
	run := func(r float64) TaskProbeRun { return TaskProbeRun{Screen: "s", Reward: f(r), Again: f(r)} }
	pair := func(a, b TaskProbeRun) [2]TaskProbeRun { return [2]TaskProbeRun{a, b} }
	explained := run(1)
	explained.Explain = "exact_match: result getter default_video_player returned 'vlc.desktop\\n'"
	otherScreen := run(1)
	otherScreen.Screen = "t"
	stillChanging := run(1)
	stillChanging.Screen, stillChanging.UnsettledStart = "u", true
	again := run(1)
	again.Again = f(0)
	for _, tc := range []struct {
		name             string
		runs             [2]TaskProbeRun
		reason, evidence string
	}{
		{"fit", pair(run(0), run(0)), "", ""},
		{"no regrader, fit", pair(TaskProbeRun{Screen: "s", Reward: f(0)}, TaskProbeRun{Screen: "s", Reward: f(0)}), "", ""},
		{"setup fails", pair(run(0), TaskProbeRun{ResetFailed: true, Error: "reset: boom"}), schema.QuarantineSetupFails, "try 2: reset: boom"},
		{"grader fails", pair(TaskProbeRun{Error: "evaluate: boom"}, run(0)), schema.QuarantineGraderFails, "try 1: evaluate: boom"},
		{"out of range", pair(run(2), run(2)), schema.QuarantineRewardOutOfRange, "try 1: the grader returned 2"},
		{"grades disagree before solved", pair(again, run(1)), schema.QuarantineGraderDisagrees, "try 1: the start state graded 1, then 0"},
		{"fresh states disagree", pair(run(1), run(0)), schema.QuarantineGraderDisagrees, "two fresh start states graded 1 and 0"},
		{"screens differ before solved", pair(run(1), otherScreen), schema.QuarantineReplayDiverges, "two resets showed different first screens: the start state is not reproducible"},
		{"screens differ, one unsettled", pair(run(1), stillChanging), schema.QuarantineReplayDiverges,
			"two resets showed different first screens: the start state is not reproducible; try 2's screen had not settled when the wait after the reset reached its bound (a program that keeps animating, or one still starting)"},
		{"solved at start", pair(run(1), run(1)), schema.QuarantineSolvedAtStart, "the untouched start state scores 1 without an action"},
		{"partly solved at start", pair(run(0.5), run(0.5)), schema.QuarantineSolvedAtStart, "the untouched start state scores 0.5 without an action"},
		{"barely solved at start", pair(run(0.01), run(0.01)), schema.QuarantineSolvedAtStart, "the untouched start state scores 0.01 without an action"},
		{"solved at start, explained", pair(explained, explained), schema.QuarantineSolvedAtStart,
			"the untouched start state scores 1 without an action: exact_match: result getter default_video_player returned 'vlc.desktop\\n'"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reason, evidence := judgeProbe(tc.runs)
			if reason != tc.reason || evidence != tc.evidence {
				t.Errorf("judgeProbe = %q, %q; want %q, %q", reason, evidence, tc.reason, tc.evidence)
			}
		})
	}
}

// TestScreenHash: one screen encoded three ways (8-bit RGB, a palette,
// 16-bit RGB: as different servers write it) hashes alike; one pixel
// changed, or another size, hashes apart; bytes that are no PNG still hash.
func TestScreenHash(t *testing.T) {
	const w, h = 40, 30
	colours := []color.RGBA{{0, 0, 0, 255}, {200, 30, 60, 255}, {250, 250, 250, 255}}
	at := func(x, y int) color.RGBA { return colours[(x/7+y/5)%len(colours)] }
	encode := func(img image.Image) []byte {
		var b bytes.Buffer
		if err := png.Encode(&b, img); err != nil {
			t.Fatal(err)
		}
		return b.Bytes()
	}
	rgba := image.NewRGBA(image.Rect(0, 0, w, h))
	pal := image.NewPaletted(image.Rect(0, 0, w, h), color.Palette{colours[0], colours[1], colours[2]})
	deep := image.NewRGBA64(image.Rect(0, 0, w, h))
	for y := 0; y < h; y++ {
		for x := 0; x < w; x++ {
			rgba.Set(x, y, at(x, y))
			pal.Set(x, y, at(x, y))
			deep.Set(x, y, at(x, y))
		}
	}
	ways := map[string][]byte{"rgb": encode(rgba), "palette": encode(pal), "rgb16": encode(deep)}
	want := screenHash(ways["rgb"])
	for name, b := range ways {
		if bytes.Equal(b, ways["rgb"]) && name != "rgb" {
			t.Fatalf("%s: the same bytes as rgb; the test needs another encoding", name)
		}
		if got := screenHash(b); got != want {
			t.Errorf("%s: hash %s, want %s (the same pixels)", name, got, want)
		}
	}
	rgba.Set(3, 4, color.RGBA{0, 0, 1, 255})
	if screenHash(encode(rgba)) == want {
		t.Error("one pixel changed: the same hash")
	}
	if screenHash(encode(rgba.SubImage(image.Rect(0, 0, w, h-1)))) == screenHash(encode(rgba)) {
		t.Error("a row fewer: the same hash")
	}
	if got := screenHash([]byte("not a png")); !strings.HasPrefix(got, "bytes:") || got == screenHash([]byte("not a png either")) {
		t.Errorf("bytes that are no PNG: %q", got)
	}
}
