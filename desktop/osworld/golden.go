package osworld

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	"legato/rl/desktop"
	"legato/rl/desktop/osworld/vm"
)

// Reset kinds of golden states (see GoldenConfig).
const (
	// ResetGolden loaded the task's golden state in place: the state its
	// setup left, taken on this desktop the first time it ran the task.
	ResetGolden = "golden"
	// ResetGoldenBuild reset the desktop as without golden states
	// (ResetReport.Why says how), ran the task's setup, waited until the
	// screen settled and took the task's golden state; the attempt goes
	// on from it.
	ResetGoldenBuild = "golden-build"
)

// goldenPrefix starts the name of every golden snapshot.
const goldenPrefix = "legato-golden-"

// goldenSeedBytes is the entropy the host gives a guest after it loaded a
// golden state.
const goldenSeedBytes = 64

// goldenState is a golden state a desktop took.
type goldenState struct {
	task string
	// name is the snapshot's; key what it was taken for (goldenKey).
	name, key string
	built     time.Time
	// setup is the time the task's setup took when it was built: what
	// each load saves besides the reset.
	setup time.Duration
	loads int
	// execDir is the directory of the action executor that ran when it
	// was taken ("" for none): loading the state brings it back.
	execDir string
	// forkOnly says the desktop has no snapshot of the state: another
	// desktop of the pool took it, and this one forks its template.
	forkOnly bool
	// used is the desktop's golden count when it was last built or
	// loaded: the least recently used state goes first.
	used int
}

// goldenSet is a desktop's golden states.
type goldenSet struct {
	byTask map[string]*goldenState
	// broken maps a task to why its golden state does not work on this
	// desktop (a snapshot or a load that failed): it resets as without.
	broken map[string]string
	uses   int
}

func (g *goldenSet) get(task string) *goldenState {
	if g.byTask == nil {
		return nil
	}
	return g.byTask[task]
}

func (g *goldenSet) put(s *goldenState) {
	if g.byTask == nil {
		g.byTask = map[string]*goldenState{}
	}
	g.uses++
	s.used = g.uses
	g.byTask[s.task] = s
}

func (g *goldenSet) touch(s *goldenState) {
	g.uses++
	s.used = g.uses
	s.loads++
}

func (g *goldenSet) drop(task string) {
	delete(g.byTask, task)
}

func (g *goldenSet) markBroken(task, why string) {
	if g.broken == nil {
		g.broken = map[string]string{}
	}
	g.broken[task] = why
}

// evict returns the states to delete so that at most max are kept, the
// least recently used first; keep is never among them.
func (g *goldenSet) evict(max int, keep string) []*goldenState {
	var all []*goldenState
	for _, s := range g.byTask {
		if s.task != keep {
			all = append(all, s)
		}
	}
	n := len(all) + 1 - max
	if n <= 0 {
		return nil
	}
	slices.SortFunc(all, func(a, b *goldenState) int { return a.used - b.used })
	return all[:min(n, len(all))]
}

// goldenPlan is what Reset does about the task's golden state: load
// state, build one after the setup (key and id say for what), or neither
// (why says why, for the report).
type goldenPlan struct {
	state *goldenState
	build bool
	key   string
	id    vm.Identity
	why   string
	// loadFailed says the state's loadvm failed: the guest may be
	// anywhere, and only the clean snapshot brings it back.
	loadFailed bool
	// execDir is the action executor the loaded state holds (set by
	// resetGolden: a fork's is its template's).
	execDir string
}

// goldenPlan decides what Reset does about the task's golden state.
func (d *Desktop) goldenPlan(ctx context.Context, task desktop.Task) goldenPlan {
	if d.vm == nil {
		return goldenPlan{}
	}
	if why := goldenRefusal(task, d.cfg.Golden); why != "" {
		if d.cfg.Golden.Off || len(task.Setup) == 0 {
			return goldenPlan{}
		}
		return goldenPlan{why: "no golden state: " + why}
	}
	if why, ok := d.golden.broken[task.ID]; ok {
		return goldenPlan{why: "no golden state on this desktop: " + clip(why)}
	}
	t0 := time.Now()
	id, err := d.vm.Identity(ctx)
	d.log.Debug("vm identity", "took", time.Since(t0), "identity", id)
	if err == nil {
		var key string
		key, err = goldenKey(task, d.cfg, id)
		if err == nil {
			if g := d.golden.get(task.ID); g != nil {
				return goldenPlan{state: g, key: key, id: id}
			}
			if d.forking(key) {
				return goldenPlan{state: &goldenState{task: task.ID, key: key, forkOnly: true}, key: key, id: id}
			}
			return goldenPlan{build: true, key: key, id: id, why: "first attempt of the task on this desktop: taking its golden state"}
		}
	}
	if ctx.Err() == nil {
		d.log.Warn("cannot key the task's golden state; resetting as without", "task", task.ID, "err", err)
	}
	return goldenPlan{why: "no golden state: " + clip(err.Error())}
}

// resetGolden loads the task's golden state, gp.state. It returns the
// reset's report, or nil and gp rewritten for the reset that takes over:
// a state taken for another key is deleted and taken again after that
// reset's setup (it never loads); a state that fails to load is deleted,
// the task resets without golden states on this desktop from then on,
// and the clean snapshot is loaded first. An error only when ctx ended.
func (d *Desktop) resetGolden(ctx context.Context, task desktop.Task, gp *goldenPlan) (*ResetReport, error) {
	g := gp.state
	t0 := time.Now()
	kind, fr, forkErr, err := d.loadGolden(ctx, g, gp.key)
	if err == nil {
		d.golden.touch(g)
		why := fmt.Sprintf("loaded the task's golden state, taken on this desktop at %s (load %d; its setup took %s)", g.built.Format(time.TimeOnly), g.loads, secs(g.setup))
		gp.execDir = g.execDir
		switch {
		case kind == ResetGoldenFork:
			ft := fr.ft // by, built, setup and execDir never change
			gp.execDir = ft.execDir
			why = fmt.Sprintf("forked a clone of the task's golden state, taken by %s at %s (fork %d; its setup took %s)", ft.by, ft.built.Format(time.TimeOnly), fr.n, secs(ft.setup))
		case forkErr != nil:
			why += "; its fork failed: " + clip(forkErr.Error())
		}
		return &ResetReport{TaskID: task.ID, Kind: kind, Why: why, Restore: time.Since(t0)}, nil
	}
	if ctx.Err() != nil || errors.Is(err, errUnpark) {
		return nil, err
	}
	if errors.Is(err, errForkOnly) {
		// Another desktop's template did not fork, and this desktop has
		// no snapshot of the state: it takes its own.
		d.log.Warn("the fork of another desktop's golden state failed; taking the task's golden state on this desktop", "task", task.ID, "err", forkErr)
		*gp = goldenPlan{build: true, key: gp.key, id: gp.id, why: "the fork of the task's golden state failed (" + clip(forkErr.Error()) + "): taking it on this desktop"}
		return nil, nil
	}
	d.forgetGolden(ctx, g)
	if errors.Is(err, errGoldenStale) {
		// Taken for another setup or machine; the guest is untouched.
		d.log.Info("the task's golden state is out of date; taking it again", "task", task.ID, "err", err)
		*gp = goldenPlan{build: true, key: gp.key, id: gp.id, why: "its golden state was out of date (" + clip(err.Error()) + "): taking it again"}
		return nil, nil
	}
	d.log.Warn("the task's golden state did not load; loading the clean snapshot and setting it up instead", "task", task.ID, "err", err)
	d.golden.markBroken(task.ID, "its golden state did not load: "+err.Error())
	*gp = goldenPlan{loadFailed: true, why: "the task's golden state did not load (" + clip(err.Error()) + ")"}
	return nil, nil
}

// forgetGolden deletes a golden state's snapshot, which frees its space in
// the overlay, and forgets it.
func (d *Desktop) forgetGolden(ctx context.Context, g *goldenState) {
	d.golden.drop(g.task)
	if err := d.vm.DeleteSnapshot(ctx, g.name); err != nil {
		// It stays in the overlay until Close removes the overlay.
		d.log.Warn("could not delete a golden state", "task", g.task, "snapshot", g.name, "err", err)
	}
}

// goldenKey is what a golden state depends on: the task's setup, the
// guest tools that run in it, and the VM's identity (QEMU's version, the
// machine, the base image). A state taken under another key is never
// loaded.
func goldenKey(task desktop.Task, cfg Config, id vm.Identity) (string, error) {
	b, err := json.Marshal(struct {
		Version  int                 `json:"v"`
		Task     string              `json:"task"`
		Snapshot string              `json:"snapshot"`
		Setup    []desktop.SetupStep `json:"setup"`
		Tool     string              `json:"tool"`
		Home     string              `json:"home"`
		VM       string              `json:"vm"`
	}{1, task.ID, task.Snapshot, task.Setup, guestToolModule, cfg.Home, id.String()})
	if err != nil {
		return "", fmt.Errorf("golden key of task %s: %w", task.ID, err)
	}
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:]), nil
}

// goldenDescription is the snapshot description that carries its key.
func goldenDescription(task, key string, id vm.Identity) string {
	return fmt.Sprintf("legato golden state of task %s; key %s; %s", task, key, id)
}

// goldenKeyOf returns the key a golden snapshot's description carries.
func goldenKeyOf(description string) string {
	_, rest, ok := strings.Cut(description, "; key ")
	if !ok {
		return ""
	}
	key, _, _ := strings.Cut(rest, ";")
	return key
}

// goldenRefusal says why task gets no golden state, or "" when it may
// have one.
func goldenRefusal(task desktop.Task, cfg GoldenConfig) string {
	switch {
	case cfg.Off:
		return "golden states are off (Golden.Off)"
	case slices.Contains(cfg.Refuse, task.ID):
		return "Golden.Refuse names the task"
	case len(task.Setup) == 0:
		return "the task has no setup steps: the clean state is its start"
	}
	for i, s := range task.Setup {
		if why := stepDependence(s); why != "" {
			return fmt.Sprintf("setup step %d (%s) %s: its state would differ between a golden state and a fresh setup", i+1, s.Type, why)
		}
	}
	return ""
}

var (
	// urlRE finds network addresses in a command.
	urlRE = regexp.MustCompile(`(?i)\b(?:https?|ftp)://[^\s"']+`)
	// wordRE splits a command into the words checked against
	// networkTools and clockTools.
	wordRE = regexp.MustCompile(`[A-Za-z0-9_][A-Za-z0-9_.+-]*`)
)

// Programs whose effect depends on the network, or on the wall clock, when
// a setup command runs them.
var (
	networkTools = []string{"curl", "wget", "apt", "apt-get", "pip", "pip3", "git", "ssh", "scp", "rsync", "nc", "ping", "snap", "flatpak"}
	clockTools   = []string{"date", "datetime", "timedatectl", "hwclock", "faketime"}
)

// stepDependence says how a setup step depends on the wall clock or the
// network, or "" when legato sees no such dependence. A download step
// does not count: the host fetches its file once into its cache, and
// every attempt gets that file.
func stepDependence(s desktop.SetupStep) string {
	switch s.Type {
	case "update_browse_history":
		return "dates the visits it writes from the wall clock"
	case "chrome_open_tabs":
		if u := urlRE.FindString(string(s.Parameters)); u != "" {
			return "loads a web page (" + clip(u) + ")"
		}
		return ""
	case "execute", "command", "execute_with_verification", "launch":
	default:
		return ""
	}
	var v any
	if err := json.Unmarshal(s.Parameters, &v); err != nil {
		return ""
	}
	var texts []string
	var walk func(any)
	walk = func(v any) {
		switch x := v.(type) {
		case string:
			texts = append(texts, x)
		case []any:
			for _, e := range x {
				walk(e)
			}
		case map[string]any:
			for _, e := range x {
				walk(e)
			}
		}
	}
	walk(v)
	for _, t := range texts {
		if u := urlRE.FindString(t); u != "" {
			return "names a network address (" + clip(u) + ")"
		}
		for _, w := range wordRE.FindAllString(t, -1) {
			w = strings.ToLower(w)
			switch {
			case slices.Contains(networkTools, w):
				return "runs " + w + ", which may use the network"
			case slices.Contains(clockTools, w):
				return "reads or sets the clock (" + w + ")"
			}
		}
	}
	return ""
}

// newSeed draws the entropy a restored guest gets.
func newSeed() []byte {
	b := make([]byte, goldenSeedBytes)
	rand.Read(b)
	return b
}

// goldenName names the snapshot of a key.
func goldenName(key string) string { return goldenPrefix + key[:16] }

// loadGolden starts the attempt from the task's golden state and thaws
// the guest (clock, entropy): in a clone of the pool's template of its key
// when there is one (ft), else (or when the fork fails: forkErr says why)
// by loading the desktop's snapshot of it in place. A template that fails
// to fork is dropped. It checks the state's key first: a state taken for
// another key is deleted, and errGoldenStale returned; errForkOnly means
// the fork failed and the desktop has no snapshot to load. kind is
// ResetGoldenFork or ResetGolden.
func (d *Desktop) loadGolden(ctx context.Context, g *goldenState, key string) (kind string, fr forkResult, forkErr, err error) {
	if g.key != key {
		// The reset that takes over runs on the VM.
		if err := d.endClone(ctx, false); err != nil {
			return "", fr, nil, fmt.Errorf("%w: %w", errUnpark, err)
		}
		return "", fr, nil, fmt.Errorf("%w: it was taken for key %s…, the task and VM now give %s…", errGoldenStale, g.key[:12], key[:12])
	}
	if d.forking(key) {
		fr, forkErr = d.forkGolden(ctx, key)
		if forkErr == nil || ctx.Err() != nil || d.closeCtx.Err() != nil {
			return ResetGoldenFork, fr, forkErr, forkErr
		}
		if fr.templateFault {
			d.forks.drop(fr.ft, "its fork failed: "+clip(forkErr.Error()))
		}
		d.log.Warn("the fork of the task's golden state failed", "task", g.task, "template_fault", fr.templateFault, "err", forkErr)
	} else if g.forkOnly {
		// The pool's template went between the plan and now.
		forkErr = errors.New("the task's fork template went before this desktop forked it")
	}
	// The VM holds the attempt (again).
	if err := d.endClone(ctx, false); err != nil {
		return "", fr, forkErr, fmt.Errorf("%w: %w", errUnpark, err)
	}
	if g.forkOnly {
		return "", fr, forkErr, errForkOnly
	}
	t0 := time.Now()
	desc, err := d.vm.SnapshotDescription(ctx, g.name)
	if err != nil {
		return "", fr, forkErr, err
	}
	d.log.Debug("golden snapshot description", "took", time.Since(t0))
	if got := goldenKeyOf(desc); got != key {
		return "", fr, forkErr, fmt.Errorf("%w: snapshot %s carries key %q, want %s…", errGoldenStale, g.name, clip(got), key[:12])
	}
	_, err = d.restore(ctx, func(ctx context.Context) (string, error) {
		return ResetGolden, d.vm.LoadSnapshot(ctx, g.name)
	}, newSeed())
	return ResetGolden, fr, forkErr, err
}

// errForkOnly means a fork of another desktop's golden state failed, and
// this desktop has no snapshot of it to load instead.
var errForkOnly = errors.New("no golden snapshot on this desktop")

// errUnpark means the desktop's VM could not take its ports back from its
// clones: the reset fails (the next one tries again), and the golden
// state, which did nothing wrong, stays.
var errUnpark = errors.New("the VM did not come back from parking")

// errGoldenStale means a golden state was taken for another key: it is
// taken again, never loaded.
var errGoldenStale = errors.New("golden state out of date")

// buildGolden takes the task's golden state from the running guest, which
// was just reset and set up: it waits until the screen settled, drops the
// guest's page cache, takes the snapshot and sets the guest clock, then
// deletes the least recently used golden states beyond Golden.Max.
func (d *Desktop) buildGolden(ctx context.Context, task desktop.Task, key string, id vm.Identity, setup time.Duration) (*goldenState, error) {
	r, err := d.readySignal(ctx, d.cfg.Ready.AfterResetMax)
	if err != nil {
		return nil, fmt.Errorf("wait for a settled screen: %w", err)
	}
	if !r.Settled {
		d.log.Warn("the screen did not settle after the task's setup; taking its golden state as it is", "task", task.ID, "waited", d.cfg.Ready.AfterResetMax)
	}
	if d.exec.dir != "" && d.exec.down {
		// An executor that stopped answering may still run: the state
		// would hold it, next to the one each load starts.
		if _, err := d.sh.run(ctx, executorStop, d.exec.dir); err != nil {
			return nil, fmt.Errorf("end the action executor that stopped answering: %w", err)
		}
	}
	if err := d.sh.dropCaches(ctx); err != nil {
		return nil, err
	}
	name := goldenName(key)
	// A snapshot of that name is left from an earlier build that failed
	// half way: it is taken again.
	if err := d.vm.DeleteSnapshot(ctx, name); err != nil {
		return nil, err
	}
	t0 := time.Now()
	if err := d.vm.Snapshot(ctx, name, goldenDescription(task.ID, key, id)); err != nil {
		return nil, err
	}
	took := time.Since(t0)
	g := &goldenState{task: task.ID, name: name, key: key, built: time.Now(), setup: setup, execDir: d.exec.running()}
	if d.cfg.Golden.Fork && d.vm.Forkable() && !d.forks.has(key) {
		// The same settled screen, captured for clones right after
		// the snapshot.
		d.takeTemplate(ctx, g)
	}
	// The guest stood still while its memory was written: its clock is
	// that much behind for the attempt that goes on from here.
	if err := d.sh.setClock(ctx); err != nil {
		return nil, fmt.Errorf("set the guest clock after the snapshot: %w", err)
	}
	d.golden.put(g)
	d.log.Info("took the task's golden state", "task", task.ID, "snapshot", name, "settled", r.Settled,
		"settle_wait", r.After, "snapshot_s", took.Seconds())
	// Only now that the new state exists do older ones make room; one that
	// cannot be deleted stays (it costs disk, not correctness).
	for _, old := range d.golden.evict(d.cfg.Golden.Max, task.ID) {
		if err := d.vm.DeleteSnapshot(ctx, old.name); err != nil {
			d.log.Warn("could not delete a golden state to keep Golden.Max; it stays", "task", old.task, "max", d.cfg.Golden.Max, "err", err)
			continue
		}
		d.golden.drop(old.task)
		d.log.Info("deleted a golden state (least recently used)", "task", old.task, "loads", old.loads)
	}
	return g, nil
}
