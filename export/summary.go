package export

import (
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"strings"
	"time"

	"legato/rl/schema"
)

// SummaryBuilder computes a batch's summary from its records. Feed it every
// record of rollouts.jsonl, in file order, with Add; Summary may be called
// at any time, as often as wanted. It keeps a few numbers per attempt and
// per model call, and the merged intervals of each phase, never a record.
// A SummaryBuilder is not safe for concurrent use.
type SummaryBuilder struct {
	policy        schema.Policy
	tasks, groups int
	taskIDs       map[string]struct{}
	groupIDs      map[string]struct{}

	records   int
	counts    map[schema.Status]int
	finished  int
	rewardSum float64
	solved    int
	// rewards tracks whether each group's finished rewards vary.
	rewards map[string]*rewardSpread

	first, last  int64 // Unix ns; valid when timed
	timed        bool
	phaseS       [numPhases]float64
	attemptTimeS float64 // Σ max(total_s, Σ phases)

	latencies    sortedFloats
	retriedCalls int
	policyErrors int
	envErrors    int
	// lastError holds, per attempt whose last record is an error, that
	// error's kind: a later record of the attempt (a resume ran it again)
	// replaces it.
	lastError   map[attemptKey]string
	errorsRerun int
	// grading and resets count the env blocks' metric runs and resets.
	grading map[string]map[string]int
	resets  map[string]int
	// hosts accumulates the per-host breakdown (records' env.host).
	hosts        map[string]*hostTally
	promptTokens int64
	cachedTokens int64
	// cacheReported: some step's answer gave a cached-token count, so the
	// server reports them and an answer without one means none.
	cacheReported bool
	steps         int
	withLogprobs  int
	// nonFinite and mismatch count steps by their Step.LogprobDefect.
	nonFinite, mismatch int
	withTokenIDs        int
	withExactIDs        int
	withPromptIDs       int
	// unsettled counts the post-action waits that ran out before the
	// screen settled.
	unsettled int
	// unsettledStarts counts the attempts whose wait after the reset ran
	// out before the screen settled.
	unsettledStarts int
	// gradedTwice counts records with a second grade; disagreements, per
	// task, those whose second grade gave another reward.
	gradedTwice   int
	disagreements map[string]int
	sources       map[schema.TokenIDSource]int

	busy    intervalSet // model calls in flight
	inPhase [numPhases]intervalSet

	tornLines int
}

// hostTally is one host's running part of the summary.
type hostTally struct {
	vms                          map[string]struct{}
	attempts, finished, failures int
	phaseS                       [numPhases]float64
	attemptS                     float64
}

type attemptKey struct {
	group   string
	attempt int
}

type rewardSpread struct {
	first  float64
	varies bool
}

// NewSummaryBuilder returns a builder for a batch of tasks tasks and groups
// groups run with policy. A zero tasks or groups is replaced by the number
// of distinct task or group ids seen; a zero policy by the first record's.
func NewSummaryBuilder(policy schema.Policy, tasks, groups int) *SummaryBuilder {
	return &SummaryBuilder{
		policy:    policy,
		tasks:     tasks,
		groups:    groups,
		taskIDs:   make(map[string]struct{}),
		groupIDs:  make(map[string]struct{}),
		counts:    make(map[schema.Status]int),
		rewards:   make(map[string]*rewardSpread),
		lastError: make(map[attemptKey]string),
		sources:   make(map[schema.TokenIDSource]int),
	}
}

// statuses lists every status, so a summary's counts show the zeros too.
func statuses() []schema.Status {
	return []schema.Status{schema.StatusOK, schema.StatusTruncated, schema.StatusCancelled,
		schema.StatusSkipped, schema.StatusSurplus, schema.StatusRetried, schema.StatusError}
}

// Add accounts for one record. Retried records count as records, and their
// time and model calls count (the desktop and the server spent them), but
// they have no reward.
func (b *SummaryBuilder) Add(rec *schema.Record) {
	if b.policy == (schema.Policy{}) {
		b.policy = rec.Policy
	}
	b.taskIDs[rec.TaskID] = struct{}{}
	b.groupIDs[rec.GroupID] = struct{}{}
	b.records++
	b.counts[rec.Status]++

	if rec.Status.Finished() && rec.Reward != nil {
		r := *rec.Reward
		b.finished++
		b.rewardSum += r
		if r >= 1 {
			b.solved++
		}
		if g := b.rewards[rec.GroupID]; g == nil {
			b.rewards[rec.GroupID] = &rewardSpread{first: r}
		} else if r != g.first {
			g.varies = true
		}
	}
	if rec.Status != schema.StatusRetried {
		key := attemptKey{rec.GroupID, rec.Attempt}
		if kind, ok := b.lastError[key]; ok {
			b.countError(kind, -1)
			b.errorsRerun++
			delete(b.lastError, key)
		}
		if rec.Status == schema.StatusError && rec.Error != nil {
			b.countError(rec.Error.Kind, 1)
			b.lastError[key] = rec.Error.Kind
		}
	}

	if !rec.StartedAt.IsZero() && !rec.EndedAt.IsZero() {
		s, e := rec.StartedAt.UnixNano(), rec.EndedAt.UnixNano()
		if !b.timed {
			b.first, b.last, b.timed = s, e, true
		}
		b.first, b.last = min(b.first, s), max(b.last, e)
	}
	t := rec.Timing
	durations := [numPhases]float64{t.ResetS, t.WaitAfterResetS, t.QueueS, t.ModelS, t.ActS,
		t.WaitS, t.ObsS, t.WaitBeforeEvalS, t.EvalS}
	var sum float64
	for p, d := range durations {
		if d > 0 {
			b.phaseS[p] += d
			sum += d
		}
	}
	b.attemptTimeS += max(t.TotalS, sum)
	if rec.Env != nil && rec.Env.Host != "" {
		b.addHost(rec, durations, max(t.TotalS, sum))
	}

	for i := range rec.Steps {
		st := &rec.Steps[i]
		b.steps++
		b.latencies.add(st.Model.Seconds)
		if st.Model.Attempts > 1 {
			b.retriedCalls++
		}
		b.promptTokens += int64(st.Model.PromptTokens)
		if c := st.Model.CachedTokens; c != nil {
			b.cachedTokens += int64(*c)
			b.cacheReported = true
		}
		switch st.LogprobDefect() {
		case schema.WarnNonFiniteLogprobs:
			b.nonFinite++
		case schema.WarnLogprobsMismatch:
			b.mismatch++
		}
		if len(st.Response.Logprobs) > 0 {
			b.withLogprobs++
		}
		if len(st.Response.TokenIDs) > 0 {
			b.withTokenIDs++
		}
		if src := st.Response.TokenIDsSource; src != "" {
			b.sources[src]++
			if src.Exact() {
				b.withExactIDs++
			}
		}
		if len(st.PromptTokenChunks) > 0 {
			b.withPromptIDs++
		}
		for _, a := range st.Actions {
			if a.Unsettled {
				b.unsettled++
			}
		}
	}
	if g := rec.SecondGrade; g != nil {
		b.gradedTwice++
		if !g.Agrees && g.Reward != nil {
			if b.disagreements == nil {
				b.disagreements = make(map[string]int)
			}
			b.disagreements[rec.TaskID]++
		}
	}
	if env := rec.Env; env != nil {
		if env.UnsettledStart {
			b.unsettledStarts++
		}
		if env.Reset != "" {
			if b.resets == nil {
				b.resets = make(map[string]int)
			}
			b.resets[env.Reset]++
		}
		for _, m := range env.Grading {
			if b.grading == nil {
				b.grading = make(map[string]map[string]int)
			}
			if b.grading[m.Metric] == nil {
				b.grading[m.Metric] = make(map[string]int)
			}
			b.grading[m.Metric][m.Via]++
		}
	}
	layout(rec, func(p phase, start, end int64) {
		if p == phModel {
			b.busy.add(start, end)
		}
		b.inPhase[p].add(start, end)
	})
}

// addHost counts a record in its host's breakdown.
func (b *SummaryBuilder) addHost(rec *schema.Record, durations [numPhases]float64, total float64) {
	if b.hosts == nil {
		b.hosts = make(map[string]*hostTally)
	}
	h := b.hosts[rec.Env.Host]
	if h == nil {
		h = &hostTally{vms: make(map[string]struct{})}
		b.hosts[rec.Env.Host] = h
	}
	if rec.Env.VM != "" {
		h.vms[rec.Env.VM] = struct{}{}
	}
	h.attempts++
	if rec.Status.Finished() {
		h.finished++
	}
	if (rec.Status == schema.StatusRetried && (rec.Error == nil || rec.Error.Kind != schema.ErrorStale)) ||
		(rec.Status == schema.StatusError && rec.Error != nil && rec.Error.Kind == schema.ErrorEnv) {
		h.failures++
	}
	for p, d := range durations {
		if d > 0 {
			h.phaseS[p] += d
		}
	}
	h.attemptS += total
}

func (b *SummaryBuilder) countError(kind string, n int) {
	switch kind {
	case schema.ErrorPolicy:
		b.policyErrors += n
	case schema.ErrorEnv:
		b.envErrors += n
	}
}

// setTornLines records how many unreadable lines the reader skipped.
func (b *SummaryBuilder) setTornLines(n int) { b.tornLines = n }

// Summary returns the summary of the records added so far, a new value on
// each call. Final and GroupsClosed are left for the caller, which knows
// whether the batch is over and which groups it closed.
func (b *SummaryBuilder) Summary() *schema.Summary {
	s := &schema.Summary{
		Schema:      schema.SummaryVersion,
		Policy:      b.policy,
		Tasks:       b.tasks,
		Groups:      b.groups,
		Records:     b.records,
		Counts:      make(map[schema.Status]int),
		PhaseShare:  make(map[string]float64),
		ServerIdleS: make(map[string]float64),
		ModelCalls:  b.steps,
		TornLines:   b.tornLines,
	}
	if s.Tasks == 0 {
		s.Tasks = len(b.taskIDs)
	}
	if s.Groups == 0 {
		s.Groups = len(b.groupIDs)
	}
	for _, st := range statuses() {
		s.Counts[st] = 0
	}
	for st, n := range b.counts {
		s.Counts[st] = n
	}
	if b.finished > 0 {
		s.SuccessRate = b.rewardSum / float64(b.finished)
		s.SolvedShare = float64(b.solved) / float64(b.finished)
	}
	for _, g := range b.rewards {
		if g.varies {
			s.GroupsWithVariance++
		}
	}
	if b.timed {
		s.WallS = seconds(b.last - b.first)
		if s.WallS > 0 {
			s.RolloutsPerHour = float64(b.finished) / (s.WallS / 3600)
		}
	}
	if b.attemptTimeS > 0 {
		var phases float64
		for p := range numPhases {
			s.PhaseShare[p.String()] = b.phaseS[p] / b.attemptTimeS
			phases += b.phaseS[p]
		}
		if other := b.attemptTimeS - phases; other > 0 {
			s.PhaseShare[PhaseOther] = other / b.attemptTimeS
		}
	}
	for p := range numPhases {
		if p == phModel {
			continue // a desktop in its model call keeps the server busy
		}
		s.ServerIdleS[p.String()] = seconds(b.inPhase[p].minus(&b.busy))
	}
	if b.timed {
		wall := intervalSet{union: []interval{{b.first, b.last}}}
		s.ServerIdleS[IdleTotal] = seconds(wall.minus(&b.busy))
	}
	s.RetriedCalls = b.retriedCalls
	lat := b.latencies.sorted()
	s.ModelLatency = schema.Percentiles{
		P50: percentile(lat, 0.50),
		P95: percentile(lat, 0.95),
		P99: percentile(lat, 0.99),
	}
	s.PolicyErrors = b.policyErrors
	s.EnvErrors = b.envErrors
	s.ErrorsRerun = b.errorsRerun
	s.Resets = maps.Clone(b.resets)
	for name, h := range b.hosts {
		if s.Hosts == nil {
			s.Hosts = make(map[string]schema.HostSummary, len(b.hosts))
		}
		hs := schema.HostSummary{Desktops: len(h.vms), Attempts: h.attempts, Finished: h.finished,
			Failures: h.failures, PhaseS: make(map[string]float64), AttemptS: h.attemptS}
		for p := range numPhases {
			hs.PhaseS[p.String()] = h.phaseS[p]
		}
		s.Hosts[name] = hs
	}
	for metric, via := range b.grading {
		if s.Grading == nil {
			s.Grading = make(map[string]map[string]int, len(b.grading))
		}
		s.Grading[metric] = maps.Clone(via)
	}
	s.PrefixCacheReported = b.cacheReported
	if b.promptTokens > 0 && b.cacheReported {
		s.PrefixCacheHitRate = float64(b.cachedTokens) / float64(b.promptTokens)
	}
	if b.steps > 0 {
		s.StepsWithLogprobs = float64(b.withLogprobs) / float64(b.steps)
		s.StepsWithTokenIDs = float64(b.withTokenIDs) / float64(b.steps)
		s.StepsWithExactTokenIDs = float64(b.withExactIDs) / float64(b.steps)
		s.StepsWithPromptTokenIDs = float64(b.withPromptIDs) / float64(b.steps)
	}
	s.StepsNonFiniteLogprobs, s.StepsLogprobsMismatch = b.nonFinite, b.mismatch
	s.UnsettledWaits = b.unsettled
	s.UnsettledStarts = b.unsettledStarts
	s.GradedTwice = b.gradedTwice
	s.GraderDisagreements = maps.Clone(b.disagreements)
	s.TokenIDSources = maps.Clone(b.sources)
	s.TokenIDSource = mostSteps(b.sources)
	s.Warnings = b.warnings()
	return s
}

// mostSteps returns the source of the most steps; on a tie the exact one,
// then the first by name, so the answer does not depend on map order.
func mostSteps(sources map[schema.TokenIDSource]int) schema.TokenIDSource {
	var best schema.TokenIDSource
	for src, n := range sources {
		m := sources[best]
		switch {
		case best == "", n > m,
			n == m && src.Exact() && !best.Exact(),
			n == m && src.Exact() == best.Exact() && src < best:
			best = src
		}
	}
	return best
}

// warnings says what a trainer must know before training on the steps.
func (b *SummaryBuilder) warnings() []string {
	var w []string
	// A step whose null logprobs were dropped is counted as such, not as
	// one the server sent none for.
	if n := b.steps - b.withLogprobs - b.nonFinite; n > 0 {
		w = append(w, fmt.Sprintf("%d of %d steps have no logprobs: the model server did not return them (start it with logprobs enabled); export refuses such samples unless --allow-missing-logprobs", n, b.steps))
	}
	if b.nonFinite > 0 {
		w = append(w, fmt.Sprintf("%d of %d steps have null, NaN or infinite logprobs (%s in their warnings): the model server sent them so, and they were not recorded; export refuses such samples unless --allow-bad-logprobs", b.nonFinite, b.steps, schema.WarnNonFiniteLogprobs))
	}
	if b.mismatch > 0 {
		w = append(w, fmt.Sprintf("%d of %d steps have a number of logprobs other than of generated token ids (%s in their warnings): no logprob can be matched to its token; export refuses such samples unless --allow-bad-logprobs", b.mismatch, b.steps, schema.WarnLogprobsMismatch))
	}
	if n := b.steps - b.withTokenIDs; n > 0 && b.withTokenIDs > 0 {
		w = append(w, fmt.Sprintf("%d of %d steps have no generated token ids although others have: the server returned them only sometimes", n, b.steps))
	} else if n > 0 {
		w = append(w, fmt.Sprintf("no step has generated token ids (%d steps): a trainer must re-tokenize the text, which is not exact; run legato rl probe against the server", b.steps))
	}
	if b.unsettled > 0 {
		w = append(w, fmt.Sprintf("%d post-action waits reached their bound before the screen settled: the screenshots after them may show the screen mid-change (those actions say unsettled in rollouts.jsonl)", b.unsettled))
	}
	if b.unsettledStarts > 0 {
		w = append(w, fmt.Sprintf("%d attempts started before the screen settled: the wait after the reset reached its bound, and their first screenshot may show the screen mid-change (a program that never stops animating, or one still starting; env.unsettled_start in rollouts.jsonl)", b.unsettledStarts))
	}
	if len(b.disagreements) > 0 {
		n := 0
		for _, c := range b.disagreements {
			n += c
		}
		w = append(w, fmt.Sprintf("the grader gave another reward on a second grade of the same end state %d times, on %d tasks (%s): those rewards are not reproducible; the tasks are quarantined and export leaves them out unless --include-quarantined",
			n, len(b.disagreements), strings.Join(slices.Sorted(maps.Keys(b.disagreements)), ", ")))
	}
	if b.tornLines > 0 {
		w = append(w, fmt.Sprintf("%d unreadable lines skipped in rollouts.jsonl", b.tornLines))
	}
	return w
}

// ModelLatencies returns the model-call latencies in seconds, sorted
// ascending, in a new slice.
func (b *SummaryBuilder) ModelLatencies() []float64 {
	return slices.Clone(b.latencies.sorted())
}

// Window returns the wall-time window of the records added so far: the
// first start and the last end; ok is false before a record with both.
func (b *SummaryBuilder) Window() (first, last time.Time, ok bool) {
	if !b.timed {
		return time.Time{}, time.Time{}, false
	}
	return time.Unix(0, b.first).UTC(), time.Unix(0, b.last).UTC(), true
}

func seconds(ns int64) float64 { return float64(ns) / 1e9 }

// percentile returns the p-quantile of sorted values, interpolating
// linearly between the two nearest ranks (numpy's default); 0 for none.
func percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	rank := p * float64(len(sorted)-1)
	lo := int(math.Floor(rank))
	hi := min(lo+1, len(sorted)-1)
	return sorted[lo] + (sorted[hi]-sorted[lo])*(rank-float64(lo))
}

// sortedFloats accumulates values and sorts them lazily, merging new values
// into the sorted ones, so repeated summaries do not re-sort everything.
type sortedFloats struct {
	done    []float64
	pending []float64
	spare   []float64 // the previous done, reused by the next merge
}

func (f *sortedFloats) add(v float64) { f.pending = append(f.pending, v) }

func (f *sortedFloats) sorted() []float64 {
	if len(f.pending) == 0 {
		return f.done
	}
	slices.Sort(f.pending)
	merged := slices.Grow(f.spare[:0], len(f.done)+len(f.pending))
	i, j := 0, 0
	for i < len(f.done) && j < len(f.pending) {
		if f.done[i] <= f.pending[j] {
			merged = append(merged, f.done[i])
			i++
		} else {
			merged = append(merged, f.pending[j])
			j++
		}
	}
	merged = append(merged, f.done[i:]...)
	merged = append(merged, f.pending[j:]...)
	f.done, f.spare, f.pending = merged, f.done, f.pending[:0]
	return f.done
}

// BatchFile is the name of the batch description collect writes into a run
// directory: the batch's task ids, so a summary knows how many tasks and
// groups the batch has even before every one has a record.
const BatchFile = schema.BatchFile

// readBatch returns the number of tasks in runDir/batch.json, or 0 when
// there is no such file.
func readBatch(runDir string) (int, error) {
	b, err := schema.ReadBatch(runDir)
	if err != nil || b == nil {
		return 0, err
	}
	return len(b.TaskIDs), nil
}

// Summarize computes the summary of the run directory runDir from its
// records, with the same SummaryBuilder collect uses. The number of tasks
// and groups (one group per task) comes from runDir/batch.json when it
// exists, else from the distinct ids in the records. Unreadable lines are
// skipped and counted in the summary's TornLines and in the ReadStats.
func Summarize(runDir string) (*schema.Summary, schema.ReadStats, error) {
	b, st, err := SummarizeEach(runDir, nil)
	if err != nil {
		return nil, st, err
	}
	return b.Summary(), st, nil
}

// SummarizeEach is Summarize for callers that need more than the summary
// from the same pass over the records: it passes each record to fn (when
// fn is not nil) after adding it, and returns the builder.
func SummarizeEach(runDir string, fn func(*schema.Record)) (*SummaryBuilder, schema.ReadStats, error) {
	tasks, err := readBatch(runDir)
	if err != nil {
		return nil, schema.ReadStats{}, err
	}
	b := NewSummaryBuilder(schema.Policy{}, tasks, tasks)
	st, err := readRun(runDir, func(f *io.SectionReader) (schema.ReadStats, error) {
		return schema.ReadRecords(f, func(rec schema.Record) error {
			b.Add(&rec)
			if fn != nil {
				fn(&rec)
			}
			return nil
		})
	})
	if err != nil {
		return nil, st, fmt.Errorf("summarize %s: %w", runDir, err)
	}
	b.setTornLines(st.TornLines)
	return b, st, nil
}

// PhaseSeconds returns the seconds the tries added so far spent per timing
// phase ("reset_s", ...).
func (b *SummaryBuilder) PhaseSeconds() map[string]float64 {
	out := make(map[string]float64, numPhases)
	for p := range numPhases {
		out[p.String()] = b.phaseS[p]
	}
	return out
}
