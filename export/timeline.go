package export

import (
	"time"

	"legato/rl/schema"
)

// Phase names are the names of the schema.Timing fields, so a summary's
// PhaseShare and ServerIdleS keys match the records.
const (
	PhaseReset          = "reset_s"
	PhaseWaitAfterReset = "wait_after_reset_s"
	PhaseQueue          = "queue_s"
	PhaseModel          = "model_s"
	PhaseAct            = "act_s"
	PhaseWait           = "wait_s"
	PhaseObs            = "obs_s"
	PhaseWaitBeforeEval = "wait_before_eval_s"
	PhaseEval           = "eval_s"
)

// PhaseOther is the PhaseShare key of attempt time outside every phase
// (total_s minus the phases): scheduling and harness work.
const PhaseOther = "other_s"

// IdleTotal is the ServerIdleS key of the wall time, from the first
// attempt's start to the last one's end, with no model call in flight.
const IdleTotal = "total"

// phase indexes the phases in the order an attempt goes through them.
type phase int

const (
	phReset phase = iota
	phWaitAfterReset
	phQueue
	phModel
	phAct
	phWait
	phObs
	phWaitBeforeEval
	phEval
	numPhases
)

func (p phase) String() string {
	return [numPhases]string{PhaseReset, PhaseWaitAfterReset, PhaseQueue, PhaseModel, PhaseAct,
		PhaseWait, PhaseObs, PhaseWaitBeforeEval, PhaseEval}[p]
}

// Phases returns the phase names in the order an attempt goes through them.
func Phases() []string {
	out := make([]string, numPhases)
	for p := range numPhases {
		out[p] = p.String()
	}
	return out
}

// Span is one phase of an attempt in wall time.
type Span struct {
	Phase      string // one of the Phase constants
	Start, End time.Time
}

// Timeline lays out the phases of rec in wall time, in order. It returns
// nil when rec has no start time.
//
// A record stores durations, plus the start of the attempt and of each
// model call, so the layout is: reset and the wait after it from the
// attempt's start; the first observation (obs_s not spent after actions)
// next; for each step, its queueing ending where its model call starts and
// the call itself, both at their recorded times, then per action act, wait
// and observe back to back; then the wait before grading and grading. A gap
// before a step's queueing is time no phase accounts for. A step without a
// start time is placed right after what precedes it.
func Timeline(rec *schema.Record) []Span {
	var spans []Span
	layout(rec, func(p phase, start, end int64) {
		spans = append(spans, Span{Phase: p.String(), Start: time.Unix(0, start).UTC(), End: time.Unix(0, end).UTC()})
	})
	return spans
}

// layout calls emit for each phase of rec with its start and end in Unix
// nanoseconds, in order; zero-length phases are left out. See Timeline.
func layout(rec *schema.Record, emit func(p phase, start, end int64)) {
	if rec.StartedAt.IsZero() {
		return
	}
	cur := rec.StartedAt.UnixNano()
	put := func(p phase, seconds float64) {
		if d := nanos(seconds); d > 0 {
			emit(p, cur, cur+d)
			cur += d
		}
	}
	put(phReset, rec.Timing.ResetS)
	put(phWaitAfterReset, rec.Timing.WaitAfterResetS)

	var obsAfterActions float64
	for i := range rec.Steps {
		for _, a := range rec.Steps[i].Actions {
			obsAfterActions += a.ObsS
		}
	}
	firstObs := rec.Timing.ObsS - obsAfterActions
	if len(rec.Steps) == 0 {
		put(phObs, firstObs)
	}
	for i := range rec.Steps {
		st := &rec.Steps[i]
		if i == 0 {
			put(phObs, firstObs)
		}
		if st.StartedAt.IsZero() {
			put(phQueue, st.Model.QueueS)
			put(phModel, st.Model.Seconds)
		} else {
			callStart := st.StartedAt.UnixNano()
			queueStart := max(cur, callStart-nanos(st.Model.QueueS))
			if callStart > queueStart {
				emit(phQueue, queueStart, callStart)
			}
			// The call is placed at its recorded time even when the
			// phases laid before it ran past it (rounded durations), so
			// the server's busy time is exact.
			callEnd := callStart + nanos(st.Model.Seconds)
			if callEnd > callStart {
				emit(phModel, callStart, callEnd)
			}
			cur = max(cur, callEnd)
		}
		for _, a := range st.Actions {
			put(phAct, a.ActS)
			put(phWait, a.WaitS)
			put(phObs, a.ObsS)
		}
	}
	put(phWaitBeforeEval, rec.Timing.WaitBeforeEvalS)
	put(phEval, rec.Timing.EvalS)
}

// nanos converts seconds to nanoseconds; negative durations (damaged
// records) count as 0.
func nanos(seconds float64) int64 {
	if !(seconds > 0) {
		return 0
	}
	return int64(seconds*1e9 + 0.5)
}
