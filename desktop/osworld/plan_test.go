package osworld

import (
	"context"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"legato/rl/desktop"
	"legato/rl/desktop/osworld/vm"
)

// TestPlanReset is the table of how a desktop resets: for each set of
// facts, the resets tried in order (a step ending in "+setup" runs the
// task's setup after it, "+build" takes the golden state too), and words
// each step's reason or the plan's note must hold.
func TestPlanReset(t *testing.T) {
	ms := time.Millisecond
	tk := func(id, domain string) prevAttempt { return prevAttempt{id: id, domain: domain} }
	// used is a VM desktop after some attempts, both resets measured with
	// the fast reset cheaper, golden states refused quietly.
	used := func() resetFacts {
		return resetFacts{
			task: tk("a", "chrome"), prev: tk("b", "gimp"), vm: true,
			fast: resetCost{mean: 400 * ms, n: 3, at: 5}, loadvm: resetCost{mean: 1100 * ms, n: 1, at: 4}, resets: 5,
			golden: goldenFacts{refused: "golden states are off (Golden.Off)", quiet: true},
		}
	}
	with := func(change func(*resetFacts)) resetFacts {
		f := used()
		change(&f)
		return f
	}
	golden := func(g goldenFacts) func(*resetFacts) {
		return func(f *resetFacts) { f.golden = g }
	}
	const key, old = "k0123456789abcdef", "o0123456789abcdef"
	snapshot := []string{"loadvm+setup", "revert+setup"}
	build := []string{"loadvm+setup+build", "revert+setup+build"}
	tests := []struct {
		name  string
		facts resetFacts
		want  []string
		why   []string // words the steps' reasons hold, one per step (or fewer)
		note  string
		warn  bool
	}{
		{name: "guest given by URL", facts: resetFacts{task: tk("a", "chrome")},
			want: []string{"fast+setup"}, why: []string{"no snapshot"}},
		{name: "guest given by URL, os task warns", facts: resetFacts{task: tk("a", "os"), revertTask: true},
			want: []string{"fast+setup"}, warn: true},
		{name: "guest given by URL, NoFastReset warns", facts: resetFacts{task: tk("a", "gimp"), noFastReset: true},
			want: []string{"fast+setup"}, warn: true},
		{name: "guest given by URL warns once", facts: resetFacts{task: tk("a", "os"), revertTask: true, warned: true},
			want: []string{"fast+setup"}},
		{name: "guest given by URL, fresh is not trusted", facts: resetFacts{task: tk("a", "gimp"), fresh: true},
			want: []string{"fast+setup"}},
		{name: "fresh VM", facts: with(func(f *resetFacts) { f.fresh = true }),
			want: []string{"none+setup"}, why: []string{"just made"}},
		{name: "fresh VM, os task", facts: with(func(f *resetFacts) { f.fresh, f.revertTask = true, true }),
			want: []string{"none+setup"}},
		{name: "no fast reset", facts: with(func(f *resetFacts) { f.noFastReset = true }),
			want: snapshot, why: []string{"NoFastReset", "loadvm failed"}},
		{name: "os task", facts: with(func(f *resetFacts) { f.task, f.revertTask = tk("a", "os"), true }),
			want: snapshot, why: []string{"domain os"}},
		{name: "after an os task", facts: with(func(f *resetFacts) { f.prev, f.revertPrev = tk("b", "multi_apps"), true }),
			want: snapshot, why: []string{"task b of domain multi_apps"}},
		{name: "fell back after this task before", facts: with(func(f *resetFacts) { f.fellBack = "changed outside what a fast reset restores: /etc/hosts" }),
			want: snapshot, why: []string{"after task b fell back to the snapshot before (changed outside"}},
		{name: "parked VM", facts: with(func(f *resetFacts) { f.parked = true }),
			want: snapshot, why: []string{"while clones ran"}},
		{name: "parked beats fresh", facts: with(func(f *resetFacts) { f.parked, f.fresh = true, true }),
			want: snapshot, why: []string{"while clones ran"}},
		{name: "unmeasured", facts: with(func(f *resetFacts) { f.fast, f.loadvm, f.resets = resetCost{}, resetCost{}, 0 }),
			want: []string{"fast+setup", "loadvm+setup", "revert+setup"}, why: []string{"not measured", "could not undo"}},
		{name: "loadvm unmeasured", facts: with(func(f *resetFacts) { f.loadvm = resetCost{} }),
			want: snapshot, why: []string{"loadvm not measured"}},
		{name: "fast cheaper", facts: used(),
			want: []string{"fast+setup", "loadvm+setup", "revert+setup"}, why: []string{"fast 0.40s vs loadvm 1.10s"}},
		{name: "loadvm cheaper", facts: with(func(f *resetFacts) { f.fast = resetCost{mean: 1300 * ms, n: 3, at: 3} }),
			want: snapshot, why: []string{"loadvm 1.10s vs fast 1.30s"}},
		{name: "refresh", facts: with(func(f *resetFacts) { f.fast.n, f.fast.at, f.loadvm.at, f.resets = 30, 25, 2, 25 }),
			want: snapshot, why: []string{"measuring loadvm again"}},
		{name: "golden refused, said", facts: with(golden(goldenFacts{refused: "Golden.Refuse names the task"})),
			want: []string{"fast+setup", "loadvm+setup", "revert+setup"}, note: "no golden state: Golden.Refuse"},
		{name: "golden broken here", facts: with(golden(goldenFacts{broken: "its golden state did not load: boom"})),
			want: []string{"fast+setup", "loadvm+setup", "revert+setup"}, note: "no golden state on this desktop: its golden state did not load"},
		{name: "golden key unknown", facts: with(golden(goldenFacts{keyErr: "vm identity: no answer"})),
			want: []string{"fast+setup", "loadvm+setup", "revert+setup"}, note: "no golden state: vm identity"},
		{name: "golden first attempt", facts: with(golden(goldenFacts{key: key})),
			want: build, why: []string{"taken from the clean snapshot"}, note: "first attempt of the task"},
		{name: "golden first attempt on a fresh VM", facts: with(func(f *resetFacts) { f.fresh, f.golden = true, goldenFacts{key: key} }),
			want: []string{"none+setup+build"}, note: "first attempt"},
		{name: "golden first attempt on a parked VM", facts: with(func(f *resetFacts) { f.parked, f.golden = true, goldenFacts{key: key} }),
			want: build, why: []string{"while clones ran"}},
		{name: "golden load", facts: with(golden(goldenFacts{key: key, have: key})),
			want: append([]string{"golden"}, snapshot...), why: []string{"holds the task's golden state", "did not load"}},
		{name: "golden load on a fresh VM", facts: with(func(f *resetFacts) { f.fresh, f.golden = true, goldenFacts{key: key, have: key} }),
			want: append([]string{"golden"}, snapshot...)},
		{name: "golden out of date", facts: with(golden(goldenFacts{key: key, have: old})),
			want: build, note: "out of date (taken for key o0123456789a…, the task and VM now give k0123456789a…)"},
		{name: "golden fork, own state behind it", facts: with(golden(goldenFacts{key: key, have: key, template: true})),
			want: append([]string{"golden-fork", "golden"}, snapshot...), why: []string{"fork template"}},
		{name: "golden fork of another desktop's state", facts: with(golden(goldenFacts{key: key, template: true})),
			want: append([]string{"golden-fork"}, build...), why: []string{"fork template", "while clones ran"}, note: "if the fork fails"},
		{name: "golden fork of another desktop's state on a fresh VM", facts: with(func(f *resetFacts) { f.fresh, f.golden = true, goldenFacts{key: key, template: true} }),
			want: append([]string{"golden-fork"}, build...)},
		{name: "golden fork, own state out of date", facts: with(golden(goldenFacts{key: key, have: old, template: true})),
			want: append([]string{"golden-fork"}, build...), note: "out of date"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := planReset(tt.facts)
			var got []string
			for _, s := range p.steps {
				k := string(s.kind)
				if s.setup {
					k += "+setup"
				}
				if s.build {
					k += "+build"
				}
				got = append(got, k)
				if s.why == "" {
					t.Errorf("step %s has no reason", s.kind)
				}
				if s.acceptLeft != !tt.facts.vm {
					t.Errorf("step %s: acceptLeft %v; only a guest given by URL goes on from what a fast reset left", s.kind, s.acceptLeft)
				}
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("steps (-want +got):\n%s", diff)
			}
			for i, w := range tt.why {
				if i < len(p.steps) && !strings.Contains(p.steps[i].why, w) {
					t.Errorf("step %d (%s): why %q; want it to hold %q", i, p.steps[i].kind, p.steps[i].why, w)
				}
			}
			if !strings.Contains(p.note, tt.note) || (tt.note == "" && p.note != "" && !tt.facts.vm) {
				t.Errorf("note %q; want it to hold %q", p.note, tt.note)
			}
			if p.warn != tt.warn {
				t.Errorf("warn %v; want %v", p.warn, tt.warn)
			}
			if wantForget := tt.facts.golden.have != "" && tt.facts.golden.have != tt.facts.golden.key && tt.facts.golden.key != ""; p.forget != wantForget {
				t.Errorf("forget %v; want %v", p.forget, wantForget)
			}
		})
	}
	t.Run("a quiet refusal says nothing", func(t *testing.T) {
		if p := planReset(used()); p.note != "" {
			t.Errorf("note %q; want none when golden states are off", p.note)
		}
	})
}

// TestFallsBack: which failures of a step hand over to the plan's next.
func TestFallsBack(t *testing.T) {
	other := errors.New("boom")
	left := fmt.Errorf("%w: %w: x", ErrFastReset, errLeft)
	tests := []struct {
		kind ResetKind
		err  error
		want bool
	}{
		{ResetFast, left, true},
		{ResetFast, fmt.Errorf("%w: no baseline", ErrFastReset), true},
		{ResetFast, other, false}, // the guest did not answer: nothing says what it holds
		{ResetLoadvm, other, true},
		{ResetLoadvm, fmt.Errorf("loadvm: %w", context.Canceled), false},
		{ResetLoadvm, fmt.Errorf("%w: revert", vm.ErrClosed), false},
		{ResetRevert, other, false},
		{ResetNone, other, false},
		{ResetGolden, fmt.Errorf("%w: key", errGoldenStale), true},
		{ResetGolden, other, true},
		{ResetGolden, fmt.Errorf("%w: no unpark", errUnpark), false},
		{ResetGoldenFork, other, true},
		{ResetGoldenFork, fmt.Errorf("%w: fork", desktop.ErrClosed), false},
		{ResetGoldenFork, fmt.Errorf("fork: %w", context.DeadlineExceeded), false},
		{ResetGoldenFork, nil, false},
	}
	for _, tt := range tests {
		if got := fallsBack(tt.kind, tt.err); got != tt.want {
			t.Errorf("fallsBack(%s, %v) = %v; want %v", tt.kind, tt.err, got, tt.want)
		}
	}
}

// TestReportKind: what a reset reports from the steps it tried.
func TestReportKind(t *testing.T) {
	tests := []struct {
		tried []ResetKind
		want  ResetKind
	}{
		{[]ResetKind{ResetFast}, ResetFast},
		{[]ResetKind{ResetFast, ResetLoadvm}, ResetFastThenLoadvm},
		{[]ResetKind{ResetFast, ResetLoadvm, ResetRevert}, ResetFastThenRevert},
		{[]ResetKind{ResetLoadvm, ResetRevert}, ResetRevert},
		{[]ResetKind{ResetGoldenFork, ResetGolden}, ResetGolden},
		{[]ResetKind{ResetGoldenFork, ResetGolden, ResetLoadvm}, ResetLoadvm},
		{[]ResetKind{ResetNone}, ResetNone},
	}
	for _, tt := range tests {
		if got := reportKind(tt.tried); got != tt.want {
			t.Errorf("reportKind(%v) = %s; want %s", tt.tried, got, tt.want)
		}
	}
}

// TestResetsLearn: measured costs steer the next plan; a fast reset that
// fell back after a task sends the next reset after that task straight to
// the snapshot, naming why, and counts against the fast reset; golden
// loads and a fresh VM's reset teach nothing.
func TestResetsLearn(t *testing.T) {
	d := &Desktop{}
	prev := prevAttempt{id: "b", domain: "gimp"}
	facts := func() resetFacts {
		h := d.history
		f := resetFacts{task: prevAttempt{id: "c", domain: "gimp"}, prev: prev, vm: true,
			fast: h.chooser.fast, loadvm: h.chooser.loadvm, resets: h.chooser.resets,
			golden: goldenFacts{refused: "off", quiet: true}}
		f.fellBack = h.chooser.fellBack[prev.id]
		return f
	}
	d.history.chooser.learn(facts(), []ResetKind{ResetFast}, 300*time.Millisecond, "")
	d.history.chooser.learn(facts(), []ResetKind{ResetLoadvm}, time.Second, "")
	if p := planReset(facts()); p.steps[0].kind != ResetFast {
		t.Fatalf("after fast 0.3s and loadvm 1s: %+v; want fast", p.steps[0])
	}
	d.history.chooser.learn(facts(), []ResetKind{ResetFast, ResetLoadvm}, 4*time.Second, "processes still running after SIGKILL: x")
	if p := planReset(facts()); p.steps[0].kind != ResetLoadvm || !strings.Contains(p.steps[0].why, "processes still running") {
		t.Errorf("after a fallback after task b: %+v; want loadvm naming the reason", p.steps[0])
	}
	d.history.chooser.learn(facts(), []ResetKind{ResetLoadvm, ResetRevert}, 20*time.Second, "")
	if d.history.chooser.loadvm.n != 2 {
		t.Errorf("a loadvm that failed over to libvirt's revert was not counted as loadvm: %+v", d.history.chooser.loadvm)
	}
	n := d.history.chooser.resets
	d.history.chooser.learn(facts(), []ResetKind{ResetGolden}, time.Second, "")
	d.history.chooser.learn(facts(), []ResetKind{ResetNone}, time.Second, "")
	d.history.chooser.learn(resetFacts{}, []ResetKind{ResetFast}, time.Second, "") // a guest given by URL
	if d.history.chooser.resets != n {
		t.Errorf("golden loads, a fresh VM or a guest given by URL counted as measured resets")
	}
	d.history.chooser.loadvm = resetCost{mean: time.Second, n: 2, at: d.history.chooser.resets}
	prev = prevAttempt{id: "d", domain: "gimp"}
	if p := planReset(facts()); p.steps[0].kind != ResetLoadvm || !strings.Contains(p.steps[0].why, "cheaper here: loadvm") {
		t.Errorf("after task d, with fast now %v on average: %+v; want loadvm, the cheaper", d.history.chooser.fast.mean, p.steps[0])
	}
}

// TestResetDecidedInPlan keeps the reset decided in one place: outside
// plan.go, no code of the package compares or switches on reset kinds,
// except where the desktop runs a step (reset.go) and where the report
// names it.
func TestResetDecidedInPlan(t *testing.T) {
	allowed := map[string]bool{"plan.go": true, "reset.go": true}
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]bool{}
	fset := token.NewFileSet()
	for _, name := range []string{"plan.go"} {
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, decl := range f.Decls {
			if g, ok := decl.(*ast.GenDecl); ok && g.Tok == token.CONST {
				for _, s := range g.Specs {
					for _, n := range s.(*ast.ValueSpec).Names {
						kinds[n.Name] = true
					}
				}
			}
		}
	}
	if len(kinds) < 10 {
		t.Fatalf("found %d reset kinds in plan.go; want the ten", len(kinds))
	}
	isKind := func(e ast.Expr) bool {
		id, ok := e.(*ast.Ident)
		return ok && kinds[id.Name]
	}
	for _, name := range files {
		if allowed[name] || strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch x := n.(type) {
			case *ast.BinaryExpr:
				if (x.Op == token.EQL || x.Op == token.NEQ) && (isKind(x.X) || isKind(x.Y)) {
					t.Errorf("%s: compares a reset kind: decide it in planReset", fset.Position(x.Pos()))
				}
			case *ast.CaseClause:
				for _, e := range x.List {
					if isKind(e) {
						t.Errorf("%s: switches on a reset kind: decide it in planReset", fset.Position(e.Pos()))
					}
				}
			}
			return true
		})
	}
}

// An attempt starts from the golden state of the task's key only after a
// reset that loaded, forked or took it.
func TestStartKey(t *testing.T) {
	for kind, want := range map[ResetKind]string{
		ResetGolden: "k", ResetGoldenFork: "k", ResetGoldenBuild: "k",
		ResetFast: "", ResetLoadvm: "", ResetNone: "",
	} {
		if got := startKey(kind, "k"); got != want {
			t.Errorf("startKey(%s) = %q, want %q", kind, got, want)
		}
	}
}
