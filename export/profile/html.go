package profile

import (
	"fmt"
	"html/template"
	"io"
	"math"
	"strconv"

	"legato/rl/export"
	"legato/rl/schema"
)

// phaseColor is the fill of a phase on the timeline and the share bars.
func phaseColor(phase string) string {
	switch phase {
	case export.PhaseReset:
		return "#8c6bb1"
	case export.PhaseWaitAfterReset:
		return "#cbb8e6"
	case export.PhaseQueue:
		return "#f28e2b"
	case export.PhaseModel:
		return "#4e79a7"
	case export.PhaseAct:
		return "#59a14f"
	case export.PhaseWait:
		return "#b5d99c"
	case export.PhaseObs:
		return "#76b7b2"
	case export.PhaseWaitBeforeEval:
		return "#edc948"
	case export.PhaseEval:
		return "#e15759"
	}
	return "#bab0ac"
}

// StatusColor is the color of a status: the strip under each rollout and
// the count chips here, and the pages of legato rl view.
func StatusColor(s schema.Status) string {
	switch s {
	case schema.StatusOK:
		return "#2e7d32"
	case schema.StatusTruncated:
		return "#9e9d24"
	case schema.StatusSurplus:
		return "#0277bd"
	case schema.StatusCancelled:
		return "#616161"
	case schema.StatusSkipped:
		return "#bdbdbd"
	case schema.StatusRetried:
		return "#ef6c00"
	case schema.StatusError:
		return "#c62828"
	}
	return "#000000"
}

// Timeline geometry, in CSS pixels.
const (
	labelW   = 96   // desktop labels
	chartW   = 1200 // the time axis
	axisH    = 26
	rowH     = 30
	barY     = 3  // phases bar, from the row's top
	barH     = 17 //
	stripY   = 22 // status strip
	stripH   = 5
	phaseRow = 22 // phase share bars
	histW    = 620
	histH    = 240
	histBins = 30
)

type (
	view struct {
		Dir, Model, Version, State, Wall string
		Records, Tasks, Groups, Closed   int
		Counts                           []countView
		Numbers                          []numberView
		CacheHit                         string
		CacheHitW                        string
		Timeline                         timelineView
		PhaseLegend, StatusLegend        []legendView
		Phases                           phasesView
		Latency                          histView
		Warnings                         []string
		// HostPhases and Hosts are the per-host breakdown.
		HostPhases []string
		Hosts      []hostRow
	}
	countView struct {
		Status schema.Status
		Color  string
		N      int
	}
	numberView   struct{ Label, Value string }
	legendView   struct{ Label, Color string }
	timelineView struct {
		Width, Height, ChartX, ChartW, AxisH int
		Ticks                                []tickView
		Rows                                 []rowView
	}
	tickView struct{ X, Label string }
	rowView  struct {
		Slot     int
		Y        int
		Label    string
		Rollouts []rolloutView
	}
	rolloutView struct {
		ID, Status, Title, Color string
		X, W                     string
		Segments                 []segmentView
	}
	segmentView struct{ X, W, Color string }
	phasesView  struct {
		Height int
		Bars   []phaseBarView
	}
	phaseBarView struct {
		Y, TextY            int
		Label, Color, Share string
		W                   string
		Idle                string
	}
	histView struct {
		Width, Height, PlotH int
		AxisEnd              int
		Bars                 []histBarView
		Marks                []markView
		Ticks                []tickView
		Count                int
	}
	histBarView struct{ X, Y, W, H, Title string }
	markView    struct {
		X, Label, Color, Anchor string
		LabelY, Dx              int
	}
)

func px(v float64) string { return strconv.FormatFloat(v, 'f', 2, 64) }

// WriteHTML writes the report as one self-contained HTML page: inline CSS
// and SVG, no script, nothing fetched from the network.
func WriteHTML(w io.Writer, r *Report) error {
	return pageTemplate().Execute(w, newView(r))
}

func newView(r *Report) *view {
	s := r.Summary
	v := &view{
		Dir: r.Dir, Model: orDash(s.Policy.Model), Version: orDash(s.Policy.Version),
		State: "not final", Wall: duration(s.WallS),
		Records: s.Records, Tasks: s.Tasks, Groups: s.Groups, Closed: s.GroupsClosed,
		CacheHit:  hitRate(s),
		CacheHitW: px(240 * math.Max(0, math.Min(1, s.PrefixCacheHitRate))),
	}
	if s.Final {
		v.State = "final"
	}
	phases, hosts := hostTable(s)
	for _, ph := range phases {
		v.HostPhases = append(v.HostPhases, shortPhase(ph))
	}
	v.Hosts = hosts
	for _, st := range statusOrder() {
		v.Counts = append(v.Counts, countView{st, StatusColor(st), s.Counts[st]})
		v.StatusLegend = append(v.StatusLegend, legendView{string(st), StatusColor(st)})
	}
	finished := s.Counts[schema.StatusOK] + s.Counts[schema.StatusTruncated]
	v.Numbers = []numberView{
		{"success rate", fmt.Sprintf("%.3f (mean reward of %d finished)", s.SuccessRate, finished)},
		{"solved", percent(s.SolvedShare)},
		{"finished rollouts per hour", fmt.Sprintf("%.1f", s.RolloutsPerHour)},
		{"groups with reward variance", fmt.Sprintf("%d of %d", s.GroupsWithVariance, s.Groups)},
		{"errors", fmt.Sprintf("policy %d, env %d", s.PolicyErrors, s.EnvErrors)},
		{"model calls", fmt.Sprintf("%d (%d retried)", s.ModelCalls, s.RetriedCalls)},
		{"model latency", fmt.Sprintf("p50 %s, p95 %s, p99 %s", duration(s.ModelLatency.P50), duration(s.ModelLatency.P95), duration(s.ModelLatency.P99))},
		{"steps with logprobs", percent(s.StepsWithLogprobs)},
		{"steps with token ids", percent(s.StepsWithTokenIDs)},
		{"steps with exact token ids", fmt.Sprintf("%s (from %s)", percent(s.StepsWithExactTokenIDs), orDash(string(s.TokenIDSource)))},
		{"steps with prompt token ids", percent(s.StepsWithPromptTokenIDs)},
	}
	if total, ok := s.ServerIdleS[export.IdleTotal]; ok && s.WallS > 0 {
		v.Numbers = append(v.Numbers, numberView{"model server idle", fmt.Sprintf("%s of %s wall (%s)", duration(total), duration(s.WallS), percent(total/s.WallS))})
	}
	for _, ph := range export.Phases() {
		v.PhaseLegend = append(v.PhaseLegend, legendView{phaseLabel(ph), phaseColor(ph)})
	}
	v.Timeline = newTimeline(r)
	v.Phases = newPhases(s)
	v.Latency = newHistogram(r.Latencies, s.ModelLatency)
	if r.Read.TornLines > 0 {
		v.Warnings = append(v.Warnings, fmt.Sprintf("%d unreadable line(s) of rollouts.jsonl were skipped; first: %v", r.Read.TornLines, r.Read.FirstTorn))
	}
	return v
}

func newTimeline(r *Report) timelineView {
	tl := timelineView{ChartX: labelW, ChartW: chartW, AxisH: axisH, Width: labelW + chartW + 16}
	tl.Height = axisH + rowH*len(r.Desktops) + 4
	wall := r.End.Sub(r.Start).Seconds()
	if wall <= 0 {
		return tl
	}
	x := func(sec float64) float64 { return labelW + sec/wall*chartW }
	step := tickStep(wall)
	for t := 0.0; t <= wall+1e-9; t += step {
		tl.Ticks = append(tl.Ticks, tickView{px(x(t)), tickLabel(t)})
	}
	for i, d := range r.Desktops {
		row := rowView{Slot: d.Slot, Y: axisH + i*rowH, Label: fmt.Sprintf("desktop %d", d.Slot)}
		for _, ro := range d.Rollouts {
			reward := "-"
			if ro.Reward != nil {
				reward = strconv.FormatFloat(*ro.Reward, 'g', 4, 64)
			}
			rv := rolloutView{
				ID: ro.ID, Status: string(ro.Status), Color: StatusColor(ro.Status),
				Title: fmt.Sprintf("%s · task %s attempt %d · %s · reward %s · %s from %s",
					ro.ID, ro.TaskID, ro.Attempt, ro.Status, reward, duration(ro.To-ro.From), duration(ro.From)),
				X: px(x(ro.From)), W: px(math.Max(0.5, x(ro.To)-x(ro.From))),
			}
			for _, sg := range ro.Segments {
				rv.Segments = append(rv.Segments, segmentView{px(x(sg.From)), px(math.Max(0.25, x(sg.To)-x(sg.From))), phaseColor(sg.Phase)})
			}
			row.Rollouts = append(row.Rollouts, rv)
		}
		tl.Rows = append(tl.Rows, row)
	}
	return tl
}

// tickLabel formats a round time-axis value: "0s", "1.5s", "30s", "2m",
// "2m30s", "1h", "1h30m".
func tickLabel(sec float64) string {
	switch {
	case sec < 60:
		return strconv.FormatFloat(math.Round(sec*10)/10, 'f', -1, 64) + "s"
	case sec < 3600:
		m, s := int(sec)/60, int(math.Round(sec))%60
		if s == 0 {
			return fmt.Sprintf("%dm", m)
		}
		return fmt.Sprintf("%dm%02ds", m, s)
	}
	h, m := int(sec)/3600, int(math.Round(sec/60))%60
	if m == 0 {
		return fmt.Sprintf("%dh", h)
	}
	return fmt.Sprintf("%dh%02dm", h, m)
}

// tickStep picks a round interval giving at most 12 ticks across wall
// seconds.
func tickStep(wall float64) float64 {
	for _, s := range []float64{0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200} {
		if wall/s <= 12 {
			return s
		}
	}
	return 86400 * math.Ceil(wall/86400/12)
}

func newPhases(s *schema.Summary) phasesView {
	var pv phasesView
	// The longest bar is full width; the percentages say the rest.
	top := 0.0
	for _, v := range s.PhaseShare {
		top = max(top, v)
	}
	for _, ph := range append(export.Phases(), export.PhaseOther) {
		share, ok := s.PhaseShare[ph]
		if !ok {
			continue
		}
		idle := ""
		if v, ok := s.ServerIdleS[ph]; ok {
			idle = "server idle " + duration(v)
		}
		y := len(pv.Bars) * phaseRow
		pv.Bars = append(pv.Bars, phaseBarView{
			Y: y + 4, TextY: y + 16, Label: phaseLabel(ph), Color: phaseColor(ph),
			Share: percent(share), W: px(math.Max(0, 300*share/top)), Idle: idle,
		})
	}
	pv.Height = len(pv.Bars)*phaseRow + 8
	return pv
}

func newHistogram(lat []float64, p schema.Percentiles) histView {
	const left, right, bottom, top = 44, 28, 28, 40
	h := histView{Width: histW, Height: histH, Count: len(lat)}
	plotW, plotH := float64(histW-left-right), float64(histH-bottom-top)
	h.PlotH = histH - bottom
	h.AxisEnd = histW - right
	if len(lat) == 0 {
		return h
	}
	hi := lat[len(lat)-1]
	if hi <= 0 {
		hi = 1
	}
	var counts [histBins]int
	for _, v := range lat {
		counts[min(histBins-1, int(v/hi*histBins))]++
	}
	peak := 0
	for _, c := range counts {
		peak = max(peak, c)
	}
	x := func(sec float64) float64 { return left + sec/hi*plotW }
	binW := plotW / histBins
	for i, c := range counts {
		bh := float64(c) / float64(peak) * plotH
		lo := hi * float64(i) / histBins
		h.Bars = append(h.Bars, histBarView{
			X: px(left + float64(i)*binW + 0.5), W: px(binW - 1),
			Y: px(float64(h.PlotH) - bh), H: px(bh),
			Title: fmt.Sprintf("%s–%s: %d calls", duration(lo), duration(lo+hi/histBins), c),
		})
	}
	for i := 0; i <= 4; i++ {
		t := hi * float64(i) / 4
		h.Ticks = append(h.Ticks, tickView{px(x(t)), duration(t)})
	}
	for i, m := range []struct {
		name string
		v    float64
	}{{"p50", p.P50}, {"p95", p.P95}, {"p99", p.P99}} {
		// Labels on three heights, on the side with more room, so close
		// percentiles stay readable.
		anchor, dx := "start", 4
		if m.v > hi/2 {
			anchor, dx = "end", -4
		}
		h.Marks = append(h.Marks, markView{
			X: px(x(m.v)), Label: m.name + " " + duration(m.v),
			Color: []string{"#1b5e20", "#e65100", "#b71c1c"}[i], Anchor: anchor, Dx: dx, LabelY: 12 + 12*i,
		})
	}
	return h
}

func pageTemplate() *template.Template {
	return template.Must(template.New("profile").Parse(pageHTML))
}

const pageHTML = `<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>legato profile: {{.Dir}}</title>
<style>
body { font: 14px/1.4 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 16px 20px; color: #222; background: #fff; }
h1 { font-size: 20px; margin: 0 0 4px; }
h2 { font-size: 15px; margin: 18px 0 6px; }
.meta { color: #555; }
.counts { display: flex; flex-wrap: wrap; gap: 8px; margin: 10px 0; }
.status-count { border-radius: 4px; padding: 3px 10px; color: #fff; font-weight: 600; }
.status-count .n { font-size: 16px; margin-left: 4px; }
.legend { display: flex; flex-wrap: wrap; gap: 14px; margin: 6px 0; font-size: 12px; }
.legend span::before { content: ""; display: inline-block; width: 12px; height: 12px; margin-right: 5px; vertical-align: -2px; background: var(--c); }
.panels { display: flex; flex-wrap: wrap; gap: 28px; align-items: flex-start; }
table.numbers td { padding: 1px 12px 1px 0; }
table.numbers td:first-child { color: #555; }
.warning { background: #fff3e0; border-left: 4px solid #ef6c00; padding: 6px 10px; }
svg text { font: 11px system-ui, sans-serif; }
svg text:not([fill]) { fill: #333; }
svg .row-bg { fill: #f4f4f4; }
svg .tick { stroke: #ddd; }
</style>
</head>
<body>
<h1>legato profile</h1>
<div class="meta">{{.Dir}} · policy {{.Model}}, version {{.Version}} · {{.State}} · {{.Tasks}} tasks, {{.Groups}} groups ({{.Closed}} closed), {{.Records}} records · wall {{.Wall}}</div>
{{range .Warnings}}<p class="warning">{{.}}</p>{{end}}
<div class="counts" id="counts">
{{- range .Counts}}
<span class="status-count" data-status="{{.Status}}" style="background: {{.Color}}">{{.Status}}<span class="n">{{.N}}</span></span>
{{- end}}
<span class="status-count" id="cache-hit" style="background: #4e79a7">prefix-cache hit rate<span class="n">{{.CacheHit}}</span></span>
</div>

<h2>Timeline: every attempt on its desktop</h2>
<div class="legend">{{range .PhaseLegend}}<span style="--c: {{.Color}}">{{.Label}}</span>{{end}}</div>
<div class="legend">status, the strip under each attempt: {{range .StatusLegend}}<span style="--c: {{.Color}}">{{.Label}}</span>{{end}}</div>
<svg id="timeline" width="{{.Timeline.Width}}" height="{{.Timeline.Height}}" viewBox="0 0 {{.Timeline.Width}} {{.Timeline.Height}}" role="img" aria-label="timeline of attempts per desktop">
{{- $tl := .Timeline}}
{{- range .Timeline.Ticks}}
<line class="tick" x1="{{.X}}" x2="{{.X}}" y1="16" y2="{{$tl.Height}}"/><text x="{{.X}}" y="12" text-anchor="middle">{{.Label}}</text>
{{- end}}
{{- range .Timeline.Rows}}
<g class="desktop-row" data-desktop="{{.Slot}}" transform="translate(0,{{.Y}})">
<rect class="row-bg" x="{{$tl.ChartX}}" y="0" width="{{$tl.ChartW}}" height="28"/>
<text x="4" y="17">{{.Label}}</text>
{{- range .Rollouts}}
<g class="rollout" data-rollout="{{.ID}}" data-status="{{.Status}}"><title>{{.Title}}</title>
<rect x="{{.X}}" y="3" width="{{.W}}" height="17" fill="#ffffff" stroke="#999" stroke-width="0.5"/>
{{- range .Segments}}<rect x="{{.X}}" y="3" width="{{.W}}" height="17" fill="{{.Color}}"/>{{end}}
<rect class="status" x="{{.X}}" y="22" width="{{.W}}" height="5" fill="{{.Color}}"/></g>
{{- end}}
</g>
{{- end}}
</svg>

<div class="panels">
<div>
<h2>Time by phase</h2>
<div class="meta">share of attempt time · server idle: wall time with no model call in flight while a desktop was in the phase</div>
<svg id="phases" width="640" height="{{.Phases.Height}}" viewBox="0 0 640 {{.Phases.Height}}">
{{- range .Phases.Bars}}
<g class="phase-bar"><text x="0" y="{{.TextY}}">{{.Label}}</text><rect x="150" y="{{.Y}}" width="{{.W}}" height="15" fill="{{.Color}}"/><text x="456" y="{{.TextY}}">{{.Share}}</text><text x="508" y="{{.TextY}}">{{.Idle}}</text></g>
{{- end}}
</svg>
</div>
<div>
<h2>Model-call latency ({{.Latency.Count}} calls)</h2>
<svg id="latency" width="{{.Latency.Width}}" height="{{.Latency.Height}}" viewBox="0 0 {{.Latency.Width}} {{.Latency.Height}}">
{{- $h := .Latency}}
<line x1="44" x2="{{$h.AxisEnd}}" y1="{{$h.PlotH}}" y2="{{$h.PlotH}}" stroke="#999"/>
{{- range .Latency.Bars}}
<rect class="bin" x="{{.X}}" y="{{.Y}}" width="{{.W}}" height="{{.H}}" fill="#4e79a7"><title>{{.Title}}</title></rect>
{{- end}}
{{- range .Latency.Ticks}}
<text x="{{.X}}" y="{{$h.Height}}" dy="-10" text-anchor="middle">{{.Label}}</text>
{{- end}}
{{- range .Latency.Marks}}
<g class="mark"><line x1="{{.X}}" x2="{{.X}}" y1="2" y2="{{$h.PlotH}}" stroke="{{.Color}}" stroke-width="2" stroke-dasharray="4 2"/><text x="{{.X}}" y="{{.LabelY}}" dx="{{.Dx}}" text-anchor="{{.Anchor}}" fill="{{.Color}}">{{.Label}}</text></g>
{{- end}}
</svg>
</div>
<div>
<h2>Numbers</h2>
<table class="numbers">
{{- range .Numbers}}
<tr><td>{{.Label}}</td><td>{{.Value}}</td></tr>
{{- end}}
<tr><td>prefix-cache hit rate</td><td>{{.CacheHit}} <svg width="244" height="12"><rect x="0" y="1" width="240" height="10" fill="#e0e0e0"/><rect x="0" y="1" width="{{.CacheHitW}}" height="10" fill="#4e79a7"/></svg></td></tr>
</table>
</div>
{{- if .Hosts}}
<div>
<h2>Hosts</h2>
<div class="meta">time: mean seconds per try</div>
<table class="numbers" id="hosts">
<tr><th>host</th><th>desktops</th><th>tries</th><th>finished</th><th>failures</th>{{range .HostPhases}}<th>{{.}}</th>{{end}}</tr>
{{- range .Hosts}}
<tr><td>{{.Name}}</td><td>{{.Desktops}}</td><td>{{.Attempts}}</td><td>{{.Finished}}</td><td>{{.Failures}}</td>{{range .Mean}}<td>{{.}}</td>{{end}}</tr>
{{- end}}
</table>
</div>
{{- end}}
</div>
</body>
</html>
`

// WriteHTMLFile writes the page of r to path through a synced temp file and
// a rename, so a browser never opens half a page, with mode 0666 less the
// umask. It refuses (an error wrapping schema.ErrRunFile) a path that is
// one of the files of the run r describes, such as its batch.json; a new
// file inside the run directory is fine.
func WriteHTMLFile(path string, r *Report) error {
	if err := schema.CheckOutput(r.Dir, path); err != nil {
		return fmt.Errorf("write profile: %w", err)
	}
	_, err := schema.WriteFileAtomic(path, func(w io.Writer) error {
		if err := WriteHTML(w, r); err != nil {
			return fmt.Errorf("write %s: %w", path, err)
		}
		return nil
	})
	return err
}
