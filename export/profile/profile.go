// Package profile shows where a batch spent its time: a text report of the
// run's summary, and a self-contained HTML page with a timeline of every
// attempt per desktop, the phase shares, the model-latency histogram and
// the status counts. `legato rl profile` is Main.
package profile

import (
	"errors"
	"fmt"
	"io/fs"
	"math"
	"slices"
	"time"

	"legato/rl/export"
	"legato/rl/schema"
)

// Report is what profile shows about a run directory.
type Report struct {
	// Dir is the run directory as given.
	Dir     string
	Summary *schema.Summary
	// Read describes the pass over rollouts.jsonl (torn lines).
	Read schema.ReadStats
	// Start and End bound the records in wall time; zero when no record
	// has timestamps.
	Start, End time.Time
	// Latencies are the model-call latencies in seconds, ascending.
	Latencies []float64
	// Desktops are the desktops that ran attempts, by slot.
	Desktops []Desktop
	// Steps breaks an average step down into its phases.
	Steps StepBreakdown
}

// StepBreakdown is where an average step's time went: the model call, and
// per action the action, the wait for the screen and the screenshot (split
// into capture, encoding and the round trip where the desktop took it in
// the guest with the wait).
type StepBreakdown struct {
	// Steps counts the model calls; Actions the actions after which the
	// screen was waited for (not DONE, FAIL); Split those whose
	// screenshot was split into capture, encoding and transfer.
	Steps, Actions, Split int
	// Per step, mean seconds.
	QueueS, ModelS float64
	// Per action, mean seconds; the capture, encoding and transfer means
	// are over Split actions.
	ActS, WaitS, ObsS, CaptureS, EncodeS, TransferS float64
	// NonModelS is the attempt time besides queueing and model calls,
	// per step: resets, waits and grading spread over the steps.
	NonModelS float64
}

// add counts rec's steps into b (as sums; mean divides).
func (b *StepBreakdown) add(rec *schema.Record) {
	b.Steps += len(rec.Steps)
	b.NonModelS += max(0, rec.Timing.TotalS-rec.Timing.QueueS-rec.Timing.ModelS-rec.Timing.ServerDownS)
	for i := range rec.Steps {
		st := &rec.Steps[i]
		b.QueueS += st.Model.QueueS
		b.ModelS += st.Model.Seconds
		for _, a := range st.Actions {
			if a.ActS == 0 && a.WaitS == 0 && a.ObsS == 0 {
				continue // a terminal action: nothing ran
			}
			b.Actions++
			b.ActS += a.ActS
			b.WaitS += a.WaitS
			b.ObsS += a.ObsS
			if a.CaptureS > 0 || a.EncodeS > 0 {
				b.Split++
				b.CaptureS += a.CaptureS
				b.EncodeS += a.EncodeS
				b.TransferS += a.TransferS
			}
		}
	}
}

// mean turns the sums into means.
func (b *StepBreakdown) mean() {
	div := func(v *float64, n int) {
		if n > 0 {
			*v /= float64(n)
		} else {
			*v = 0
		}
	}
	for _, v := range []*float64{&b.QueueS, &b.ModelS, &b.NonModelS} {
		div(v, b.Steps)
	}
	for _, v := range []*float64{&b.ActS, &b.WaitS, &b.ObsS} {
		div(v, b.Actions)
	}
	for _, v := range []*float64{&b.CaptureS, &b.EncodeS, &b.TransferS} {
		div(v, b.Split)
	}
}

// Desktop is one desktop's row of the timeline.
type Desktop struct {
	Slot int
	// Rollouts are the desktop's attempts with a duration, by start.
	Rollouts []Rollout
	// BusyS is the summed duration of its attempts.
	BusyS float64
}

// Rollout is one attempt (one record) on the timeline.
type Rollout struct {
	ID      string
	TaskID  string
	Attempt int
	Status  schema.Status
	Reward  *float64
	// From and To are seconds since Report.Start.
	From, To float64
	// Segments are its phases at the timeline's resolution.
	Segments []Segment
}

// Segment is a stretch of a rollout spent in one phase, in seconds since
// Report.Start.
type Segment struct {
	Phase    string
	From, To float64
}

// timelineBuckets is how many time buckets the timeline has across the
// batch's wall time. A rollout's phases are drawn per bucket, each bucket
// showing the phase that filled most of it, so the page stays the same
// size for a 15-minute batch and a 10-hour one and a phase too short to
// see is not drawn as a hairline.
const timelineBuckets = 4800

// Build reads the run directory dir and computes its report, in one pass
// over rollouts.jsonl. If dir has a summary.json written by collect, its
// Final and GroupsClosed are used (they are collect's to know).
func Build(dir string) (*Report, error) {
	type span struct {
		phase      string
		start, end int64
	}
	type raw struct {
		r          Rollout
		desktop    int
		start, end int64
		spans      []span
	}
	var rows []raw
	var steps StepBreakdown
	b, st, err := export.SummarizeEach(dir, func(rec *schema.Record) {
		steps.add(rec)
		if rec.StartedAt.IsZero() || !rec.EndedAt.After(rec.StartedAt.Time) {
			return // never ran (skipped): nothing to draw
		}
		x := raw{
			r:       Rollout{ID: rec.RolloutID, TaskID: rec.TaskID, Attempt: rec.Attempt, Status: rec.Status, Reward: rec.Reward},
			desktop: rec.Desktop,
			start:   rec.StartedAt.UnixNano(),
			end:     rec.EndedAt.UnixNano(),
		}
		for _, s := range export.Timeline(rec) {
			x.spans = append(x.spans, span{s.Phase, s.Start.UnixNano(), s.End.UnixNano()})
		}
		rows = append(rows, x)
	})
	if err != nil {
		return nil, err
	}
	steps.mean()
	rep := &Report{Dir: dir, Summary: b.Summary(), Read: st, Latencies: b.ModelLatencies(), Steps: steps}
	if prev, err := schema.ReadSummary(dir); err == nil {
		rep.Summary.Final, rep.Summary.GroupsClosed = prev.Final, prev.GroupsClosed
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("profile %s: %w", dir, err)
	}
	first, last, ok := b.Window()
	if !ok {
		return rep, nil
	}
	rep.Start, rep.End = first, last
	t0 := first.UnixNano()
	sec := func(ns int64) float64 { return float64(ns-t0) / 1e9 }
	wall := sec(last.UnixNano())
	bucket := max(wall/timelineBuckets, 1e-3)

	byDesk := map[int]*Desktop{}
	for _, x := range rows {
		d := byDesk[x.desktop]
		if d == nil {
			d = &Desktop{Slot: x.desktop}
			byDesk[x.desktop] = d
		}
		r := x.r
		r.From, r.To = sec(x.start), sec(x.end)
		segs := make([]Segment, 0, len(x.spans))
		for _, s := range x.spans {
			segs = append(segs, Segment{s.phase, sec(s.start), sec(s.end)})
		}
		r.Segments = quantize(segs, bucket)
		d.Rollouts = append(d.Rollouts, r)
		d.BusyS += r.To - r.From
	}
	for _, d := range byDesk {
		slices.SortStableFunc(d.Rollouts, func(a, b Rollout) int { return cmpFloat(a.From, b.From) })
		rep.Desktops = append(rep.Desktops, *d)
	}
	slices.SortFunc(rep.Desktops, func(a, b Desktop) int { return a.Slot - b.Slot })
	return rep, nil
}

func cmpFloat(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// quantize draws segs (in order, possibly overlapping a little) on buckets
// of width bucket: each bucket gets the phase that covers most of it, and
// runs of buckets with one phase become one segment. Ends snap to bucket
// edges, except the rollout's own first and last.
func quantize(segs []Segment, bucket float64) []Segment {
	if len(segs) == 0 {
		return nil
	}
	lo := math.Floor(segs[0].From / bucket)
	var hi float64
	for _, s := range segs {
		lo = min(lo, math.Floor(s.From/bucket))
		hi = max(hi, math.Ceil(s.To/bucket))
	}
	n := int(hi - lo)
	// cover[i] maps a phase to how much of bucket i it covers.
	type share struct {
		phase string
		sec   float64
	}
	cover := make([][]share, n)
	for _, s := range segs {
		for i := int(math.Floor(s.From/bucket) - lo); i < n && float64(i)+lo < s.To/bucket; i++ {
			b0, b1 := (float64(i)+lo)*bucket, (float64(i)+lo+1)*bucket
			c := min(b1, s.To) - max(b0, s.From)
			if c <= 0 {
				continue
			}
			j := slices.IndexFunc(cover[i], func(x share) bool { return x.phase == s.Phase })
			if j < 0 {
				cover[i] = append(cover[i], share{s.Phase, c})
			} else {
				cover[i][j].sec += c
			}
		}
	}
	var out []Segment
	for i, c := range cover {
		if len(c) == 0 {
			continue
		}
		best := c[0]
		for _, x := range c[1:] {
			if x.sec > best.sec {
				best = x
			}
		}
		from, to := (float64(i)+lo)*bucket, (float64(i)+lo+1)*bucket
		if n := len(out); n > 0 && out[n-1].Phase == best.phase && out[n-1].To >= from-1e-9 {
			out[n-1].To = to
			continue
		}
		out = append(out, Segment{best.phase, from, to})
	}
	// Exact ends where a bucket edge would overshoot the attempt.
	if len(out) > 0 {
		out[0].From = max(out[0].From, segs[0].From)
		last := segs[len(segs)-1].To
		for _, s := range segs {
			last = max(last, s.To)
		}
		out[len(out)-1].To = min(out[len(out)-1].To, last)
	}
	return out
}
