package osworld

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"time"

	"legato/rl/desktop"
	"legato/rl/desktop/osworld/vm"
	"legato/rl/desktop/osworld/vm/hostagent"
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

// goldenPath is a desktop's golden states and its side of the fork path.
type goldenPath struct {
	goldenSet
	fork forkState
	// forks are the pool's fork templates; nil when this desktop does not
	// fork (the pool decides that once, when it makes the desktop).
	forks *forkTemplates
	// agent takes the desktop's templates and forks its clones on its
	// remote host; nil on this machine (package vm does it here).
	agent *hostagent.Client
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
		for _, u := range urlRE.FindAllString(string(s.Parameters), -1) {
			if !loopbackURL(u) {
				return "loads a web page (" + clip(u) + ")"
			}
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
		// A text whose addresses are all the guest's own (a command that
		// asks VLC's HTTP interface whether it is up) names no network.
		urls := urlRE.FindAllString(t, -1)
		for _, u := range urls {
			if !loopbackURL(u) {
				return "names a network address (" + clip(u) + ")"
			}
		}
		for _, w := range wordRE.FindAllString(t, -1) {
			w = strings.ToLower(w)
			switch {
			case slices.Contains(networkTools, w) && len(urls) == 0:
				return "runs " + w + ", which may use the network"
			case slices.Contains(clockTools, w):
				return "reads or sets the clock (" + w + ")"
			}
		}
	}
	return ""
}

// loopbackURL reports whether a URL's host is the guest itself.
func loopbackURL(s string) bool {
	u, err := url.Parse(s)
	if err != nil {
		return false
	}
	h := u.Hostname()
	if ip := net.ParseIP(h); ip != nil {
		return ip.IsLoopback()
	}
	return strings.EqualFold(h, "localhost")
}

// newSeed draws the entropy a restored guest gets.
func newSeed() []byte {
	b := make([]byte, goldenSeedBytes)
	rand.Read(b)
	return b
}

// goldenName names the snapshot of a key.
func goldenName(key string) string { return goldenPrefix + key[:16] }

// loadGolden loads the golden state g in place and thaws the guest
// (clock, entropy), which the snapshot turned back.
func (d *Desktop) loadGolden(ctx context.Context, g *goldenState) error {
	return d.restore(ctx, ResetGolden, func(ctx context.Context) error {
		return d.vm.LoadSnapshot(ctx, g.name)
	}, newSeed())
}

// goldenQuiet is the least quiet interval before a golden state is taken.
const goldenQuiet = 1500 * time.Millisecond

// buildGolden takes the task's golden state from the running guest, which
// was just reset and set up: it waits until the screen settled, drops the
// guest's page cache, takes the snapshot and sets the guest clock, then
// deletes the least recently used golden states beyond Golden.Max.
func (d *Desktop) buildGolden(ctx context.Context, task desktop.Task, key string, id vm.Identity, setup time.Duration) (*goldenState, error) {
	// A state loaded for every attempt must be taken on a screen that is
	// still, not in a pause of an animation (VLC's seek bar while it
	// opens a file under a loaded host was caught in one: each load then
	// showed another frame): the quiet interval is longer than an
	// action's. Nor in the quiet before a launched program's window
	// shows: the setup's steps that start one waited for its window
	// (setup.Controller.Windows).
	r, err := d.readySignal(ctx, d.cfg.Ready.AfterResetMax, waitFor{quiet: goldenQuiet})
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
	if d.golden.forks != nil && !d.golden.forks.has(templateKey(d.host, key)) {
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
