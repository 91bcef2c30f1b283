package osworld

import (
	"fmt"
	"strings"

	"legato/rl/desktop/osworld/vm"
)

// ResetKind names a reset: a step of a reset plan, and what ResetReport.Kind
// and the attempt report say ran.
type ResetKind string

// Reset kinds. Each is a step planReset may plan, except the combined kinds,
// which only report what ran.
const (
	// ResetNone: the desktop had just been made from its clean snapshot,
	// so there was nothing to undo.
	ResetNone ResetKind = "none"
	// ResetFast ended the attempt's processes and windows, restored the
	// home and the restored directories, and found nothing else changed.
	ResetFast ResetKind = "fast"
	// ResetLoadvm loaded the VM's clean snapshot into its running QEMU.
	ResetLoadvm ResetKind = "loadvm"
	// ResetRevert reverted the VM's clean snapshot through libvirt (a new
	// QEMU), because loadvm failed.
	ResetRevert ResetKind = "revert"
	// ResetFastThenLoadvm and ResetFastThenRevert: the fast reset could
	// not bring the guest back (ResetReport.Why says what was left), so
	// the snapshot was restored instead.
	ResetFastThenLoadvm ResetKind = "fast+loadvm"
	ResetFastThenRevert ResetKind = "fast+revert"
	// ResetFastIncomplete: a guest given by URL, which has no snapshot to
	// fall back to, was fast-reset, but something of the earlier attempt
	// is left (ResetReport.Why says what); a warning says so too.
	ResetFastIncomplete ResetKind = "fast-incomplete"
	// ResetGolden loaded the task's golden state in place: the state its
	// setup left, taken on this desktop the first time it ran the task.
	ResetGolden ResetKind = "golden"
	// ResetGoldenFork started the attempt in a clone of the task's golden
	// state (GoldenConfig.Fork): a QEMU of its own that maps the state's
	// guest RAM copy-on-write and loads its device state, on the
	// desktop's ports while the desktop's VM waits paused.
	ResetGoldenFork ResetKind = "golden-fork"
	// ResetGoldenBuild reset the desktop as without golden states
	// (ResetReport.Why says how), ran the task's setup, waited until the
	// screen settled and took the task's golden state; the attempt goes
	// on from it.
	ResetGoldenBuild ResetKind = "golden-build"
)

// resetFacts is everything that decides a desktop's reset before a task.
// Desktop.resetFacts gathers them; planReset turns them into a plan.
type resetFacts struct {
	// task is the task about to run; prev the one whose attempt ran since
	// the last reset (id "" for none).
	task, prev prevAttempt
	// vm is false for a guest given by URL: it has no snapshot, so it can
	// only fast-reset.
	vm bool
	// fresh: the VM was just made from its clean snapshot.
	fresh bool
	// parked: the VM was parked while clones ran its attempts; it holds
	// what it held before them, which no attempt describes.
	parked bool
	// noFastReset is Config.NoFastReset; revertTask and revertPrev say
	// that RevertDomains names task's or prev's domain.
	noFastReset, revertTask, revertPrev bool
	// fellBack says why the fast reset after prev's attempt fell back to
	// the snapshot before ("" when it did not).
	fellBack string
	// fast and loadvm are the measured costs of the two resets on this
	// desktop, resets the number of resets so far.
	fast, loadvm resetCost
	resets       int
	// warned: the guest given by URL warned already that tasks of task's
	// domain need a revert it cannot do.
	warned bool
	golden goldenFacts
}

// goldenFacts is what the desktop knows of the task's golden state.
type goldenFacts struct {
	// refused says why the task gets no golden state ("" when it may
	// have one); quiet when that needs no word in the report (golden
	// states off, a task without setup).
	refused string
	quiet   bool
	// broken says why the task's golden state does not work on this
	// desktop; keyErr why its key could not be worked out.
	broken, keyErr string
	// key is what the state depends on now, id the VM's identity in it.
	key string
	id  vm.Identity
	// have is the key of the desktop's own golden state of the task, ""
	// for none.
	have string
	// template: this desktop forks, and the pool holds a template of key.
	template bool
}

// resetStep is one reset of a plan.
type resetStep struct {
	kind ResetKind
	why  string
	// setup: the task's setup runs after it (a golden state holds it).
	setup bool
	// build: the task's golden state is taken after the setup.
	build bool
	// acceptLeft: what a fast reset could not undo is reported (the
	// attempt starts from it), not a reason to go on to the next step.
	acceptLeft bool
}

// resetPlan is the resets to try before a task, in order: the first that
// succeeds is the reset; one that fails in a way that a later step can
// repair (see fallsBack) hands over to the next.
type resetPlan struct {
	steps []resetStep
	// note says what became of the task's golden state when no step
	// loads it ("" when there is nothing to say); it starts the report's
	// Why.
	note string
	// forget: the desktop's golden state of the task was taken for
	// another key; it is deleted before the steps run.
	forget bool
	// warn: the guest given by URL fast-resets a task that needs a
	// revert; say so once per domain.
	warn bool
}

// planReset decides how a desktop resets before a task: which resets to
// try, in order, and why each. It is the one place that decides it; the
// desktop runs the plan (runPlan) and reports what ran.
func planReset(f resetFacts) resetPlan {
	if !f.vm {
		return resetPlan{
			steps: []resetStep{{kind: ResetFast, why: "a guest given by URL has no snapshot", setup: true, acceptLeft: true}},
			warn:  (f.noFastReset || f.revertTask) && !f.warned,
		}
	}
	g := f.golden
	switch {
	case g.refused != "" && g.quiet:
		return resetPlan{steps: cleanSteps(f, false)}
	case g.refused != "":
		return resetPlan{steps: cleanSteps(f, false), note: "no golden state: " + g.refused}
	case g.broken != "":
		return resetPlan{steps: cleanSteps(f, false), note: "no golden state on this desktop: " + clip(g.broken)}
	case g.keyErr != "":
		return resetPlan{steps: cleanSteps(f, false), note: "no golden state: " + clip(g.keyErr)}
	}
	var p resetPlan
	own := g.have != "" && g.have == g.key
	if g.have != "" && !own {
		// Taken for another setup or machine: it never loads.
		p.forget = true
		p.note = fmt.Sprintf("its golden state was out of date (taken for key %s…, the task and VM now give %s…): taking it again", short(g.have), short(g.key))
	}
	if g.template {
		p.steps = append(p.steps, resetStep{kind: ResetGoldenFork, why: "the pool holds the task's fork template"})
		// The fork parked the VM: after it, the VM holds what it held
		// before.
		f.parked = true
	}
	if own {
		p.steps = append(p.steps, resetStep{kind: ResetGolden, why: "the desktop holds the task's golden state"})
		// A load that failed leaves the guest anywhere: only the clean
		// snapshot brings it back; the task resets without its golden
		// state on this desktop from then on.
		p.steps = append(p.steps, snapshotSteps("a golden state that did not load leaves the guest anywhere: the clean snapshot brings it back", true, false)...)
		return p
	}
	if p.note == "" {
		p.note = "first attempt of the task on this desktop: taking its golden state"
		if g.template {
			p.note = "if the fork fails: taking the task's golden state on this desktop"
		}
	}
	p.steps = append(p.steps, cleanSteps(f, true)...)
	return p
}

// cleanSteps are the resets to the clean state, each followed by the
// task's setup; build says the golden state is taken after it.
func cleanSteps(f resetFacts, build bool) []resetStep {
	switch {
	case f.parked:
		return snapshotSteps("the VM held an earlier attempt while clones ran: the clean snapshot brings it back", true, build)
	case f.fresh:
		return []resetStep{{kind: ResetNone, why: "the VM was just made from its clean snapshot", setup: true, build: build}}
	case build:
		// A fast reset restores files, not what running programs hold
		// (clipboard, window manager, caches): every attempt from the
		// golden state would inherit that.
		return snapshotSteps("a golden state is taken from the clean snapshot", true, true)
	case f.noFastReset:
		return snapshotSteps("NoFastReset (--no-fast-reset): every attempt starts from the snapshot", true, false)
	case f.revertTask:
		return snapshotSteps(fmt.Sprintf("tasks of domain %s change state a fast reset cannot undo (RevertDomains)", f.task.domain), true, false)
	case f.revertPrev:
		return snapshotSteps(fmt.Sprintf("the attempt before ran task %s of domain %s, which changes state a fast reset cannot undo (RevertDomains)", f.prev.id, f.prev.domain), true, false)
	case f.fellBack != "":
		return snapshotSteps(fmt.Sprintf("the fast reset after task %s fell back to the snapshot before (%s)", f.prev.id, clip(f.fellBack)), true, false)
	}
	kind, why := cheaper(f.fast, f.loadvm, f.resets)
	if kind == ResetFast {
		fast := resetStep{kind: ResetFast, why: why, setup: true}
		return append([]resetStep{fast}, snapshotSteps("the fast reset could not undo the last attempt", true, false)...)
	}
	return snapshotSteps(why, true, false)
}

// snapshotSteps restore the clean snapshot: loadvm, and libvirt's revert
// (a new QEMU) when loadvm fails.
func snapshotSteps(why string, setup, build bool) []resetStep {
	return []resetStep{
		{kind: ResetLoadvm, why: why, setup: setup, build: build},
		{kind: ResetRevert, why: "loadvm failed: libvirt's revert starts a new QEMU", setup: setup, build: build},
	}
}

// cheaper picks whichever of the fast reset and loadvm measured cheaper on
// the desktop, measuring each first and each again refreshAfter resets
// after it last ran: the costs drift with the tasks' mix.
func cheaper(f, l resetCost, resets int) (ResetKind, string) {
	switch {
	case f.n == 0:
		return ResetFast, "fast reset not measured on this desktop yet"
	case l.n == 0:
		return ResetLoadvm, fmt.Sprintf("loadvm not measured on this desktop yet (fast reset: %s)", secs(f.mean))
	}
	cheap, other, cheapName, otherName := ResetFast, ResetLoadvm, "fast", "loadvm"
	cm, om, oat := f.mean, l.mean, l.at
	if l.mean < f.mean {
		cheap, other, cheapName, otherName = ResetLoadvm, ResetFast, "loadvm", "fast"
		cm, om, oat = l.mean, f.mean, f.at
	}
	if resets-oat >= refreshAfter {
		return other, fmt.Sprintf("measuring %s again (%s, %d resets ago; %s: %s)", otherName, secs(om), resets-oat, cheapName, secs(cm))
	}
	return cheap, fmt.Sprintf("cheaper here: %s %s vs %s %s (measured)", cheapName, secs(cm), otherName, secs(om))
}

// startKey is the golden key an attempt starts from after a reset of kind,
// key being the task's key now: a golden state of another key is never
// loaded (it is taken again), and the other resets start from none.
func startKey(kind ResetKind, key string) string {
	switch kind {
	case ResetGolden, ResetGoldenFork, ResetGoldenBuild:
		return key
	}
	return ""
}

// reportKind is the kind a reset reports, from the steps it tried, the
// last of which succeeded: a fast reset that fell back to the snapshot
// says so; otherwise the step that succeeded names it.
func reportKind(tried []ResetKind) ResetKind {
	last := tried[len(tried)-1]
	if tried[0] == ResetFast && len(tried) > 1 {
		return ResetFast + "+" + last
	}
	return last
}

// short is the start of a golden key, enough to tell two apart in a
// message.
func short(key string) string {
	if len(key) > 12 {
		return key[:12]
	}
	return key
}

// describe lists a plan's steps, for the debug log.
func (p resetPlan) describe() string {
	var b strings.Builder
	for i, s := range p.steps {
		if i > 0 {
			b.WriteString(" → ")
		}
		b.WriteString(string(s.kind))
		if s.build {
			b.WriteString("+build")
		}
	}
	return b.String()
}
