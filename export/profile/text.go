package profile

import (
	"bufio"
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"strings"
	"time"

	"legato/rl/export"
	"legato/rl/schema"
)

// phaseLabel names a phase for people.
func phaseLabel(phase string) string {
	switch phase {
	case export.PhaseReset:
		return "reset"
	case export.PhaseWaitAfterReset:
		return "wait after reset"
	case export.PhaseQueue:
		return "queue (max-inflight)"
	case export.PhaseModel:
		return "model call"
	case export.PhaseAct:
		return "act"
	case export.PhaseWait:
		return "wait after action"
	case export.PhaseObs:
		return "observe"
	case export.PhaseWaitBeforeEval:
		return "wait before grading"
	case export.PhaseEval:
		return "grade"
	case export.PhaseOther:
		return "other"
	}
	return phase
}

// statusOrder is the order statuses are listed in.
func statusOrder() []schema.Status {
	return []schema.Status{schema.StatusOK, schema.StatusTruncated, schema.StatusSurplus,
		schema.StatusCancelled, schema.StatusSkipped, schema.StatusRetried, schema.StatusError}
}

// WriteText writes the report as text for a terminal.
func WriteText(w io.Writer, r *Report) error {
	bw := bufio.NewWriter(w)
	s := r.Summary
	p := func(format string, args ...any) { fmt.Fprintf(bw, format, args...) }

	state := "not final"
	if s.Final {
		state = "final"
	}
	p("run %s (%s)\n", r.Dir, state)
	p("policy %s, version %s\n", orDash(s.Policy.Model), orDash(s.Policy.Version))
	p("%d tasks, %d groups (%d closed), %d records, wall %s\n\n", s.Tasks, s.Groups, s.GroupsClosed, s.Records, duration(s.WallS))

	p("Attempts\n")
	var counts []string
	for _, st := range statusOrder() {
		counts = append(counts, fmt.Sprintf("%s %d", st, s.Counts[st]))
	}
	p("  %s\n", strings.Join(counts, "  "))
	p("  errors: policy %d, env %d\n", s.PolicyErrors, s.EnvErrors)
	finished := s.Counts[schema.StatusOK] + s.Counts[schema.StatusTruncated]
	p("  success rate %.3f (mean reward of %d finished), solved %s\n", s.SuccessRate, finished, percent(s.SolvedShare))
	p("  %.1f finished rollouts per hour\n", s.RolloutsPerHour)
	p("  groups with reward variance: %d of %d\n\n", s.GroupsWithVariance, s.Groups)

	p("Time by phase (share of attempt time; server idle: wall time with no model\n")
	p("call in flight while a desktop was in the phase)\n")
	p("  %-22s %6s  %-24s %s\n", "phase", "share", "", "server idle")
	for _, ph := range append(export.Phases(), export.PhaseOther) {
		share, ok := s.PhaseShare[ph]
		if !ok {
			continue
		}
		idle := "-"
		if v, ok := s.ServerIdleS[ph]; ok {
			idle = duration(v)
		}
		p("  %-22s %6s  %-24s %s\n", phaseLabel(ph), percent(share), bar(share, 24), idle)
	}
	if total, ok := s.ServerIdleS[export.IdleTotal]; ok && s.WallS > 0 {
		p("  server idle overall: %s of %s wall (%s)\n", duration(total), duration(s.WallS), percent(total/s.WallS))
	}
	p("\n")

	if st := r.Steps; st.Steps > 0 {
		p("Per step (mean seconds over %d steps; per action over %d actions)\n", st.Steps, st.Actions)
		p("  queue %.3f  model %.3f  not the model %.3f (resets, waits and grading spread over the steps)\n", st.QueueS, st.ModelS, st.NonModelS)
		if st.Actions > 0 {
			p("  action: act %.3f  wait %.3f  screenshot %.3f\n", st.ActS, st.WaitS, st.ObsS)
		}
		if st.Split > 0 {
			p("  screenshot taken with the wait (%d actions): capture %.3f  encode %.3f  transfer %.3f\n", st.Split, st.CaptureS, st.EncodeS, st.TransferS)
		}
		p("\n")
	}

	p("Model calls\n")
	p("  %d calls, %d retried\n", s.ModelCalls, s.RetriedCalls)
	p("  latency p50 %s  p95 %s  p99 %s\n", duration(s.ModelLatency.P50), duration(s.ModelLatency.P95), duration(s.ModelLatency.P99))
	p("  prefix-cache hit rate %s\n", hitRate(s))
	p("  steps with logprobs %s, with token ids %s (exact %s, from %s), with prompt token ids %s\n\n",
		percent(s.StepsWithLogprobs), percent(s.StepsWithTokenIDs), percent(s.StepsWithExactTokenIDs),
		orDash(string(s.TokenIDSource)), percent(s.StepsWithPromptTokenIDs))

	if phases, rows := hostTable(s); len(rows) > 0 {
		p("Hosts (time: mean seconds per try)\n")
		p("  %-16s %8s %6s %8s %8s", "host", "desktops", "tries", "finished", "failures")
		for _, ph := range phases {
			p(" %9s", shortPhase(ph))
		}
		p("\n")
		for _, r := range rows {
			p("  %-16s %8d %6d %8d %8d", r.Name, r.Desktops, r.Attempts, r.Finished, r.Failures)
			for _, m := range r.Mean {
				p(" %9s", m)
			}
			p("\n")
		}
		p("\n")
	}
	if len(r.Desktops) > 0 {
		p("Desktops (busy: share of the wall time spent in attempts)\n")
		for _, d := range r.Desktops {
			busy := 0.0
			if s.WallS > 0 {
				busy = d.BusyS / s.WallS
			}
			p("  desktop %-3d %3d attempts  busy %6s  %s\n", d.Slot, len(d.Rollouts), percent(busy), bar(busy, 24))
		}
		p("\n")
	}
	if r.Read.TornLines > 0 {
		p("warning: %d unreadable line(s) of rollouts.jsonl were skipped; first: %v\n", r.Read.TornLines, r.Read.FirstTorn)
	}
	return bw.Flush()
}

// hostRow is one host's line of the per-host breakdown.
type hostRow struct {
	Name                                   string
	Desktops, Attempts, Finished, Failures int
	// Mean is the mean seconds per try of each phase the table shows.
	Mean []string
}

// hostTable returns the phases any host spent time in, in attempt order,
// and a row per host, sorted by name.
func hostTable(s *schema.Summary) ([]string, []hostRow) {
	var phases []string
	for _, ph := range export.Phases() {
		for _, h := range s.Hosts {
			if h.PhaseS[ph] > 0 {
				phases = append(phases, ph)
				break
			}
		}
	}
	var rows []hostRow
	for _, name := range slices.Sorted(maps.Keys(s.Hosts)) {
		h := s.Hosts[name]
		r := hostRow{Name: name, Desktops: h.Desktops, Attempts: h.Attempts, Finished: h.Finished, Failures: h.Failures}
		for _, ph := range phases {
			mean := 0.0
			if h.Attempts > 0 {
				mean = h.PhaseS[ph] / float64(h.Attempts)
			}
			r.Mean = append(r.Mean, duration(mean))
		}
		rows = append(rows, r)
	}
	return phases, rows
}

// shortPhase names a phase in a table heading.
func shortPhase(phase string) string {
	switch phase {
	case export.PhaseWaitAfterReset:
		return "settle"
	case export.PhaseQueue:
		return "queue"
	case export.PhaseWait:
		return "wait"
	case export.PhaseWaitBeforeEval:
		return "pre-grade"
	}
	return phaseLabel(phase)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func percent(v float64) string { return fmt.Sprintf("%.1f%%", 100*v) }

// hitRate is the prefix-cache hit rate, which is unknown when the server
// never reported cached tokens.
func hitRate(s *schema.Summary) string {
	if !s.PrefixCacheReported {
		return "unknown (the server did not report cached tokens)"
	}
	return percent(s.PrefixCacheHitRate)
}

// duration formats seconds for people: "850ms", "12.3s", "4m05s", "2h03m".
func duration(sec float64) string {
	switch {
	case sec == 0:
		return "0s"
	case sec < 1:
		return fmt.Sprintf("%.0fms", sec*1000)
	case sec < 60:
		return fmt.Sprintf("%.2fs", sec)
	case sec < 3600:
		d := time.Duration(math.Round(sec)) * time.Second
		return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	}
	d := time.Duration(math.Round(sec/60)) * time.Minute
	return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
}

// bar draws share (0..1) as a bar of up to width cells, in eighths.
func bar(share float64, width int) string {
	eighths := int(math.Round(math.Max(0, math.Min(1, share)) * float64(width) * 8))
	s := strings.Repeat("█", eighths/8)
	if rest := eighths % 8; rest > 0 {
		s += string([]rune("▏▎▍▌▋▊▉")[rest-1])
	}
	return s
}
