package export

import (
	"fmt"
	"math"
	"slices"

	"legato/rl/schema"
)

// Advantages returns the GRPO advantage of each reward within its group:
// (reward − mean) / std, where std is the population standard deviation
// (squared deviations divided by n) or, with SampleStd, the sample one
// (divided by n − 1, as slime and SkyRL compute it), as kind says; "" is
// PopulationStd.
// It is the one place legato computes advantages: export, a batch's
// OnGroup, a service's results and the run's pages all call it.
//
// They are all 0 when the rewards are all equal, so one reward (whose
// sample std is 0/0), or a group every attempt solved, gives 0 rather
// than a division by zero. The result has the length of rewards. A kind
// other than the two panics: callers take it from ParseAdvantageStd, a
// validated option or a batch.json schema.ReadBatch checked.
func Advantages(rewards []float64, kind schema.AdvantageStd) []float64 {
	var ddof float64 // as numpy's: the squared deviations are divided by n − ddof
	switch kind.OrDefault() {
	case schema.PopulationStd:
	case schema.SampleStd:
		ddof = 1
	default:
		panic(fmt.Sprintf("export.Advantages: advantage std %q: want %s or %s", kind, schema.PopulationStd, schema.SampleStd))
	}
	adv := make([]float64, len(rewards))
	if constant(rewards) {
		return adv
	}
	n := float64(len(rewards))
	var sum float64
	for _, r := range rewards {
		sum += r
	}
	mean := sum / n
	// Two passes over the rewards: summing squared deviations from the mean
	// loses no precision the way E[x²] − E[x]² does.
	var ss float64
	for _, r := range rewards {
		ss += (r - mean) * (r - mean)
	}
	std := math.Sqrt(ss / (n - ddof))
	if std == 0 { // unequal rewards whose deviations underflow
		return adv
	}
	for i, r := range rewards {
		adv[i] = (r - mean) / std
	}
	return adv
}

// constant reports whether all rewards are equal (true for none or one).
// Equality is tested directly, not through std == 0: the mean of equal
// rewards such as 0.1 may differ from them in the last bit, and dividing
// by that tiny std would turn rounding noise into advantages of ±1.
func constant(rewards []float64) bool {
	for _, r := range rewards[min(1, len(rewards)):] {
		if r != rewards[0] {
			return false
		}
	}
	return true
}

// groupTable collects the rewards of finished attempts per group and gives
// each its advantage. It keeps a few words per finished attempt.
type groupTable struct {
	groups map[string]*groupRewards
	// order lists group ids in order of first appearance, so reports are
	// deterministic.
	order []string
	added int // finished attempts added, over all groups
	// bad and missing count the steps with broken logprobs and without
	// logprobs, over all groups.
	bad, missing int
	// leftOut holds the groups whose samples are not written because
	// they never ended (Options.PartialGroups); set by check.
	leftOut map[string]bool
}

type groupRewards struct {
	ids     []string
	rewards []float64
	adv     []float64 // filled by finish

	// steps counts the steps of the group's finished attempts, and
	// noLogprobs those without logprobs; the first of them is step
	// firstStep of firstRollout, the firstAt-th attempt added.
	steps, noLogprobs int
	// nonFinite and mismatch count the steps by their LogprobDefect, and
	// nBad the rollouts with one; badRollouts names the first few of them,
	// badAt the order in which they were added.
	nonFinite, mismatch, nBad int
	badRollouts               []string
	badAt                     []int
	firstRollout              string
	firstStep                 int
	firstAt                   int
}

func newGroupTable() *groupTable {
	return &groupTable{groups: make(map[string]*groupRewards), leftOut: make(map[string]bool)}
}

// add records rec if it is a finished attempt with a reward, and reports
// whether it did.
func (t *groupTable) add(rec *schema.Record) bool {
	if !rec.Status.Finished() || rec.Reward == nil {
		return false
	}
	g := t.groups[rec.GroupID]
	if g == nil {
		g = &groupRewards{}
		t.groups[rec.GroupID] = g
		t.order = append(t.order, rec.GroupID)
	}
	g.ids = append(g.ids, rec.RolloutID)
	g.rewards = append(g.rewards, *rec.Reward)
	t.added++
	g.steps += len(rec.Steps)
	bad := false
	for i := range rec.Steps {
		switch rec.Steps[i].LogprobDefect() {
		case schema.WarnNonFiniteLogprobs:
			g.nonFinite++
			t.bad++
			bad = true
			continue // its logprobs were dropped, not missing
		case schema.WarnLogprobsMismatch:
			g.mismatch++
			t.bad++
			bad = true
		}
		if len(rec.Steps[i].Response.Logprobs) > 0 {
			continue
		}
		t.missing++
		if g.noLogprobs == 0 {
			g.firstRollout, g.firstStep, g.firstAt = rec.RolloutID, i, t.added
		}
		g.noLogprobs++
	}
	if bad {
		g.nBad++
	}
	if bad && len(g.badRollouts) < maxNamedRollouts {
		g.badRollouts = append(g.badRollouts, rec.RolloutID)
		g.badAt = append(g.badAt, t.added)
	}
	return true
}

// badLogprobs counts the samples an export writes and those of them with
// broken logprobs, leaving out the constant groups when dropConstant.
func (t *groupTable) badLogprobs(dropConstant bool) BadLogprobsError {
	var e BadLogprobsError
	type named struct {
		id string
		at int
	}
	var first []named
	for _, id := range t.order {
		g := t.groups[id]
		if !t.writes(id, dropConstant) {
			continue
		}
		e.Total += g.steps
		e.NonFinite += g.nonFinite
		e.Mismatch += g.mismatch
		e.RolloutCount += g.nBad
		for i, r := range g.badRollouts {
			first = append(first, named{r, g.badAt[i]})
		}
	}
	e.Samples = e.NonFinite + e.Mismatch
	// The first rollouts in the file, whatever their groups.
	slices.SortFunc(first, func(a, b named) int { return a.at - b.at })
	for _, n := range first[:min(len(first), maxNamedRollouts)] {
		e.Rollouts = append(e.Rollouts, n.id)
	}
	return e
}

// missingLogprobs counts the samples an export writes and those of them
// without logprobs, leaving out the constant groups when dropConstant.
func (t *groupTable) missingLogprobs(dropConstant bool) MissingLogprobsError {
	var e MissingLogprobsError
	firstAt := 0
	for _, id := range t.order {
		g := t.groups[id]
		if !t.writes(id, dropConstant) {
			continue
		}
		e.Total += g.steps
		e.Samples += g.noLogprobs
		if g.noLogprobs > 0 && (firstAt == 0 || g.firstAt < firstAt) {
			e.FirstRollout, e.FirstStep, firstAt = g.firstRollout, g.firstStep, g.firstAt
		}
	}
	return e
}

// writes reports whether an export writes the samples of group id: not
// when it is left out, nor when dropConstant and its rewards are equal.
func (t *groupTable) writes(id string, dropConstant bool) bool {
	return !t.leftOut[id] && !(dropConstant && constant(t.groups[id].rewards))
}

// finish computes every group's advantages with the std kind says.
func (t *groupTable) finish(kind schema.AdvantageStd) {
	for _, g := range t.groups {
		g.adv = Advantages(g.rewards, kind)
	}
}

// advantage returns the advantage of the finished attempt rolloutID of
// group, after finish; ok is false when add never took it.
func (t *groupTable) advantage(group, rolloutID string) (adv float64, ok bool) {
	g := t.groups[group]
	if g == nil {
		return 0, false
	}
	for i, id := range g.ids {
		if id == rolloutID {
			return g.adv[i], true
		}
	}
	return 0, false
}

// constant reports whether group's finished rewards are all equal.
func (t *groupTable) constant(group string) bool {
	g := t.groups[group]
	return g == nil || constant(g.rewards)
}
