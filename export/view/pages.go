package view

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"image/png"
	"math"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"legato/rl/export"
	"legato/rl/export/profile"
	"legato/rl/schema"
)

// links is how a page names the others: URLs of the server, or the file
// names of a static export. Every link is relative, so that the pages work
// under any path the server is mounted at, and from file://.
type links interface {
	run(f filter, page int) string
	attempt(id string) string
	group(id string) string
	image(sha string) string
	static() bool
}

type serverLinks struct{}

func (serverLinks) run(f filter, page int) string {
	q := f.values()
	if page > 1 {
		q.Set("page", strconv.Itoa(page))
	}
	if len(q) == 0 {
		return "./"
	}
	return "./?" + q.Encode()
}
func (serverLinks) attempt(id string) string { return "attempt?id=" + url.QueryEscape(id) }
func (serverLinks) group(id string) string   { return "group?id=" + url.QueryEscape(id) }
func (serverLinks) image(sha string) string  { return "img/" + sha + ".png" }
func (serverLinks) static() bool             { return false }

type fileLinks struct{}

func (fileLinks) run(_ filter, page int) string {
	if page <= 1 {
		return "index.html"
	}
	return fmt.Sprintf("page-%d.html", page)
}
func (fileLinks) attempt(id string) string { return "a-" + fileName(id) + ".html" }
func (fileLinks) group(id string) string   { return "g-" + fileName(id) + ".html" }
func (fileLinks) image(sha string) string  { return "img/" + sha + ".png" }
func (fileLinks) static() bool             { return true }

// fileName turns an id into a file name: letters, digits, '.', '-' and
// '_' are kept, anything else becomes '_' and the name gets a digest of
// the id, so that two ids never share a file.
func fileName(id string) string {
	safe := true
	b := []byte(id)
	for i, c := range b {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_' || c == '.' && i > 0) {
			b[i], safe = '_', false
		}
	}
	if safe && len(b) > 0 && len(b) <= 100 {
		return string(b)
	}
	sum := sha256.Sum256([]byte(id))
	return string(b[:min(len(b), 80)]) + "-" + hex.EncodeToString(sum[:6])
}

// filter is what the run page's attempts are narrowed to; empty fields
// take every value.
type filter struct {
	Task, Domain, Status, Version string
	// Quarantined is "yes", "no" or "".
	Quarantined string
	// RewardMin and RewardMax bound the reward, as typed; an attempt
	// without a reward is left out when either is set.
	RewardMin, RewardMax string
	rmin, rmax           *float64
}

// parseFilter reads a filter from a query; the error names the parameter.
func parseFilter(q url.Values) (filter, error) {
	f := filter{Task: q.Get("task"), Domain: q.Get("domain"), Status: q.Get("status"), Version: q.Get("version"),
		Quarantined: q.Get("quarantined"), RewardMin: q.Get("reward_min"), RewardMax: q.Get("reward_max")}
	switch f.Quarantined {
	case "", "yes", "no":
	default:
		return f, fmt.Errorf("quarantined=%q: want yes, no or nothing", f.Quarantined)
	}
	for _, b := range []struct {
		name, text string
		p          **float64
	}{{"reward_min", f.RewardMin, &f.rmin}, {"reward_max", f.RewardMax, &f.rmax}} {
		if b.text == "" {
			continue
		}
		v, err := strconv.ParseFloat(b.text, 64)
		if err != nil || math.IsNaN(v) {
			return f, fmt.Errorf("%s=%q: want a number", b.name, b.text)
		}
		*b.p = &v
	}
	return f, nil
}

func (f filter) values() url.Values {
	q := url.Values{}
	for k, v := range map[string]string{"task": f.Task, "domain": f.Domain, "status": f.Status, "version": f.Version,
		"quarantined": f.Quarantined, "reward_min": f.RewardMin, "reward_max": f.RewardMax} {
		if v != "" {
			q.Set(k, v)
		}
	}
	return q
}

func (f filter) match(rw *row) bool {
	switch {
	case f.Task != "" && rw.Task != f.Task,
		f.Domain != "" && rw.Domain != f.Domain,
		f.Status != "" && string(rw.Status) != f.Status,
		f.Version != "" && rw.Version != f.Version,
		f.Quarantined == "yes" && !rw.Quarantined,
		f.Quarantined == "no" && rw.Quarantined:
		return false
	}
	if f.rmin != nil || f.rmax != nil {
		if !rw.Graded || f.rmin != nil && rw.Reward < *f.rmin || f.rmax != nil && rw.Reward > *f.rmax {
			return false
		}
	}
	return true
}

// pageSize is how many attempts a page of the run lists.
const pageSize = 100

type bar struct {
	Label string
	N     int
	Width float64 // percent of the longest bar
	Color string
	Link  string
}

type taskRow struct {
	Task, Domain, Link string
	Records, Finished  int
	Success            string
	Quarantined        bool
}

type attemptRow struct {
	ID, Link, Task, Domain, Group, GroupLink, Status, Reward, Version string
	Attempt, Steps                                                    int
	Quarantined                                                       bool
	Color                                                             string
}

type runPage struct {
	Dir, Model, Version, Harness            string
	Records, Tasks, Groups, Torn, Matched   int
	Success                                 string
	Statuses, Rewards                       []bar
	TaskRows                                []taskRow
	Filter                                  filter
	TaskIDs, Domains, StatusNames, Versions []string
	Attempts                                []attemptRow
	Page, Pages                             int
	Prev, Next, First                       string
	Static                                  bool
}

var statusOrder = []schema.Status{schema.StatusOK, schema.StatusTruncated, schema.StatusSurplus, schema.StatusCancelled,
	schema.StatusSkipped, schema.StatusRetried, schema.StatusError}

func fmtReward(rw *row) string {
	if !rw.Graded {
		return "–"
	}
	return strconv.FormatFloat(rw.Reward, 'g', 4, 64)
}

// buildRun is the run page: the summary and histograms of the attempts f
// matches, their tasks, and the given page of them.
func (r *Run) buildRun(ix index, f filter, page int, l links) runPage {
	p := runPage{Dir: r.dir, Records: len(ix.rows), Torn: ix.torn, Filter: f, Static: l.static(), Page: page}
	if b := r.batch; b != nil {
		p.Model, p.Version, p.Harness = b.Model, b.Version, b.Harness
	}
	tasks, domains, versions, groups := map[string]bool{}, map[string]bool{}, map[string]bool{}, map[string]bool{}
	statusN := map[schema.Status]int{}
	type acc struct {
		taskRow
		sum float64
	}
	perTask := map[string]*acc{}
	var matched []int
	var rewardMin, rewardMax = math.Inf(1), math.Inf(-1)
	var sum float64
	var finished int
	for i := range ix.rows {
		rw := &ix.rows[i]
		tasks[rw.Task], domains[rw.Domain], versions[rw.Version] = true, true, true
		if !f.match(rw) {
			continue
		}
		matched = append(matched, i)
		groups[rw.Group] = true
		statusN[rw.Status]++
		a := perTask[rw.Task]
		if a == nil {
			a = &acc{taskRow: taskRow{Task: rw.Task, Domain: rw.Domain, Quarantined: rw.Quarantined}}
			perTask[rw.Task] = a
		}
		a.Records++
		if rw.Graded {
			rewardMin, rewardMax = min(rewardMin, rw.Reward), max(rewardMax, rw.Reward)
		}
		if rw.Status.Finished() && rw.Graded {
			a.Finished++
			a.sum += rw.Reward
			finished++
			sum += rw.Reward
		}
	}
	p.Matched, p.Groups = len(matched), len(groups)
	p.Tasks = len(perTask)
	if finished > 0 {
		p.Success = fmt.Sprintf("%.1f%%", 100*sum/float64(finished))
	}
	most := 0
	for _, n := range statusN {
		most = max(most, n)
	}
	for _, s := range statusOrder {
		if n := statusN[s]; n > 0 {
			g := f
			g.Status = string(s)
			p.Statuses = append(p.Statuses, bar{Label: string(s), N: n, Width: 100 * float64(n) / float64(most), Color: profile.StatusColor(s), Link: l.run(g, 1)})
		}
	}
	p.Rewards = rewardBars(ix.rows, matched, rewardMin, rewardMax)
	for _, a := range perTask {
		if a.Finished > 0 {
			a.Success = fmt.Sprintf("%.0f%%", 100*a.sum/float64(a.Finished))
		}
		g := f
		g.Task = a.Task
		a.Link = l.run(g, 1)
		p.TaskRows = append(p.TaskRows, a.taskRow)
	}
	slices.SortFunc(p.TaskRows, func(a, b taskRow) int { return cmp.Compare(a.Task, b.Task) })
	p.TaskIDs, p.Domains, p.Versions = sortedKeys(tasks), sortedKeys(domains), sortedKeys(versions)
	for _, s := range statusOrder {
		p.StatusNames = append(p.StatusNames, string(s))
	}

	p.Pages = max(1, (len(matched)+pageSize-1)/pageSize)
	p.Page = min(max(page, 1), p.Pages)
	if p.Page > 1 {
		p.Prev = l.run(f, p.Page-1)
	}
	if p.Page < p.Pages {
		p.Next = l.run(f, p.Page+1)
	}
	p.First = l.run(filter{}, 1)
	for _, i := range matched[(p.Page-1)*pageSize : min(len(matched), p.Page*pageSize)] {
		rw := &ix.rows[i]
		p.Attempts = append(p.Attempts, attemptRow{ID: rw.ID, Link: l.attempt(rw.ID), Task: rw.Task, Domain: rw.Domain,
			Group: rw.Group, GroupLink: l.group(rw.Group), Status: string(rw.Status), Reward: fmtReward(rw), Version: rw.Version,
			Attempt: rw.Attempt, Steps: rw.Steps, Quarantined: rw.Quarantined, Color: profile.StatusColor(rw.Status)})
	}
	return p
}

// rewardBars is the histogram of the graded rewards of rows[matched]: one
// bar per distinct reward when there are few (0 and 1 mostly), else ten
// bins over their range.
func rewardBars(rows []row, matched []int, lo, hi float64) []bar {
	distinct := map[float64]int{}
	for _, i := range matched {
		if rows[i].Graded {
			distinct[rows[i].Reward]++
		}
	}
	if len(distinct) == 0 {
		return nil
	}
	var out []bar
	if len(distinct) <= 10 {
		for _, v := range slices.Sorted(mapKeys(distinct)) {
			out = append(out, bar{Label: strconv.FormatFloat(v, 'g', 4, 64), N: distinct[v]})
		}
	} else {
		const bins = 10
		n := make([]int, bins)
		for v, k := range distinct {
			b := min(int((v-lo)/(hi-lo)*bins), bins-1)
			n[b] += k
		}
		for b := range bins {
			out = append(out, bar{Label: fmt.Sprintf("%.3g–%.3g", lo+(hi-lo)*float64(b)/bins, lo+(hi-lo)*float64(b+1)/bins), N: n[b]})
		}
	}
	most := 0
	for _, b := range out {
		most = max(most, b.N)
	}
	for i := range out {
		out[i].Width = 100 * float64(out[i].N) / float64(most)
		out[i].Color = "#4e79a7"
	}
	return out
}

func mapKeys[K comparable, V any](m map[K]V) func(func(K) bool) {
	return func(yield func(K) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

func sortedKeys(m map[string]bool) []string { return slices.Sorted(mapKeys(m)) }

// shot is a screenshot in a page.
type shot struct {
	SHA, Src string
	W, H     int
}

// screenOf returns the screenshot a step acted on: the newest image of its
// prompt. Only the prompt's last messages are read: the newest image is in
// one of them.
func (r *Run) screenOf(st *schema.Step, l links) (*shot, error) {
	for i := len(st.Request) - 1; i >= 0; i-- {
		m, err := r.store.Message(st.Request[i])
		if err != nil {
			return nil, err
		}
		for j := len(m.Content) - 1; j >= 0; j-- {
			u := m.Content[j].ImageURL
			if u == nil {
				continue
			}
			sha, ok := strings.CutPrefix(u.URL, schema.ImageScheme)
			if !ok {
				continue
			}
			s := &shot{SHA: sha, Src: l.image(sha)}
			if data, err := r.store.ImagePNG(sha); err == nil {
				if cfg, err := png.DecodeConfig(bytes.NewReader(data)); err == nil {
					s.W, s.H = cfg.Width, cfg.Height
				}
			}
			return s, nil
		}
	}
	return nil, nil
}

type groupAttempt struct {
	ID, Link, Status, Reward, Advantage string
	Attempt, Steps                      int
	First                               *shot
	SameFirst                           bool
	Color                               string
}

type groupPage struct {
	Group, Task, Domain, RunLink string
	Attempts                     []groupAttempt
	Identical                    bool // every first screen is the same image
	Static                       bool
}

// buildGroup is a group's page: its attempts side by side.
func (r *Run) buildGroup(ix index, id string, l links) (groupPage, bool, error) {
	p := groupPage{Group: id, RunLink: l.run(filter{}, 1), Static: l.static()}
	var rows []row
	for _, rw := range ix.rows {
		if rw.Group == id {
			rows = append(rows, rw)
		}
	}
	if len(rows) == 0 {
		return p, false, nil
	}
	slices.SortStableFunc(rows, func(a, b row) int { return cmp.Compare(a.Attempt, b.Attempt) })
	p.Task, p.Domain = rows[0].Task, rows[0].Domain
	// Advantages as export computes them: over the finished attempts'
	// rewards, with the batch's std.
	var rewards []float64
	var idx []int
	for i, rw := range rows {
		if rw.Status.Finished() && rw.Graded {
			rewards, idx = append(rewards, rw.Reward), append(idx, i)
		}
	}
	adv := map[int]float64{}
	for k, a := range export.Advantages(rewards, r.advStd) {
		adv[idx[k]] = a
	}
	p.Identical = true
	var first string
	for i, rw := range rows {
		ga := groupAttempt{ID: rw.ID, Link: l.attempt(rw.ID), Status: string(rw.Status), Reward: fmtReward(&rw),
			Attempt: rw.Attempt, Steps: rw.Steps, Color: profile.StatusColor(rw.Status), Advantage: "–"}
		if a, ok := adv[i]; ok {
			ga.Advantage = fmt.Sprintf("%+.3f", a)
		}
		rec, err := r.record(rw)
		if err != nil {
			return p, true, err
		}
		if len(rec.Steps) > 0 {
			if ga.First, err = r.screenOf(&rec.Steps[0], l); err != nil {
				return p, true, err
			}
		}
		if ga.First != nil {
			if first == "" {
				first = ga.First.SHA
			}
			ga.SameFirst = ga.First.SHA == first
			p.Identical = p.Identical && ga.SameFirst
		}
		p.Attempts = append(p.Attempts, ga)
	}
	return p, true, nil
}

type stepView struct {
	N                           int
	Anchor                      string
	Shot                        *shot
	Marks                       []Mark
	Shapes                      []shape
	Captions                    []Mark
	Reasoning, Content          string
	Version, Finish, ParseError string
	Warnings                    []string
	Started                     string
	ModelS, QueueS, DownS       float64
	Calls                       int
	Prompt, Completion          int
	Cached                      string
	Replica                     string
	Logprobs                    string
	Actions                     []actionView
	Replay                      *screenMatch
	Radius                      float64
}

type actionView struct {
	Action                       string
	ActS, WaitS, ReadyS, ObsS    float64
	CaptureS, EncodeS, TransferS float64
	Settle                       string
}

type screenMatch struct {
	Identical          bool
	Distance           string
	Recorded, Replayed string
	ReplayedSrc        string
}

type attemptPage struct {
	ID, Task, Domain, Group, GroupLink, RunLink string
	Attempt, Try, Desktop                       int
	Status, Reward, Color                       string
	Error                                       *schema.ErrorInfo
	Policy                                      schema.Policy
	Timing                                      schema.Timing
	Started, Ended                              string
	Env                                         *schema.EnvReport
	SecondGrade                                 *schema.SecondGrade
	EndState                                    *schema.EndStateRef
	Regrade                                     *schema.Regrade
	Replay                                      *replayAttempt
	Steps                                       []stepView
	Prev, Next                                  string
	Quarantined                                 bool
	Static                                      bool
}

// buildAttempt is an attempt's page: each step with its screenshot and
// what the step's actions did drawn over it.
func (r *Run) buildAttempt(ix index, id string, l links) (attemptPage, bool, error) {
	i, ok := ix.byID[id]
	if !ok {
		return attemptPage{}, false, nil
	}
	rw := ix.rows[i]
	rec, err := r.record(rw)
	if err != nil {
		return attemptPage{}, true, err
	}
	p := attemptPage{ID: rec.RolloutID, Task: rec.TaskID, Domain: rec.Domain, Group: rec.GroupID, GroupLink: l.group(rec.GroupID),
		RunLink: l.run(filter{}, 1), Attempt: rec.Attempt, Try: rec.Try, Desktop: rec.Desktop, Status: string(rec.Status),
		Reward: fmtReward(&rw), Color: profile.StatusColor(rec.Status), Error: rec.Error, Policy: rec.Policy, Timing: rec.Timing,
		Started: fmtTime(rec.StartedAt), Ended: fmtTime(rec.EndedAt), Env: rec.Env, SecondGrade: rec.SecondGrade,
		EndState: rec.EndState, Quarantined: rw.Quarantined, Static: l.static()}
	if g, ok := ix.regrades[id]; ok {
		p.Regrade = &g
	}
	if rp, ok := ix.replays[id]; ok {
		p.Replay = &rp
	}
	if i > 0 {
		p.Prev = l.attempt(ix.rows[i-1].ID)
	}
	if i+1 < len(ix.rows) {
		p.Next = l.attempt(ix.rows[i+1].ID)
	}
	var ptr pointer
	for k := range rec.Steps {
		st := &rec.Steps[k]
		sv := stepView{N: k, Anchor: fmt.Sprintf("step-%d", k), Reasoning: st.Response.Reasoning, Content: st.Response.Content,
			Version: st.Version(&rec), Finish: st.Response.FinishReason, ParseError: st.ParseError, Warnings: st.Warnings,
			Started: fmtTime(st.StartedAt), ModelS: st.Model.Seconds, QueueS: st.Model.QueueS, DownS: st.ServerDownS,
			Calls: st.Model.Attempts, Prompt: st.Model.PromptTokens, Completion: st.Model.CompletionTokens, Cached: "not said",
			Replica: st.Model.Replica, Logprobs: logprobSummary(st)}
		if c := st.Model.CachedTokens; c != nil {
			sv.Cached = strconv.Itoa(*c)
		}
		if sv.Shot, err = r.screenOf(st, l); err != nil {
			return p, true, fmt.Errorf("step %d: %w", k, err)
		}
		w, h := 0, 0
		if sv.Shot != nil {
			w, h = sv.Shot.W, sv.Shot.H
			sv.Radius = math.Max(6, float64(max(w, h))/70)
		}
		for _, a := range st.Actions {
			for _, m := range markAction(a, r.coords, w, h, &ptr) {
				if m.At && sv.Shot != nil {
					sv.Marks = append(sv.Marks, m)
				}
				if m.Caption != "" || !m.At {
					sv.Captions = append(sv.Captions, m)
				}
			}
			av := actionView{Action: a.Action, ActS: a.ActS, WaitS: a.WaitS, ReadyS: a.ReadyS, ObsS: a.ObsS,
				CaptureS: a.CaptureS, EncodeS: a.EncodeS, TransferS: a.TransferS, Settle: "settled"}
			if a.Unsettled {
				av.Settle = "unsettled: the wait reached its bound with the screen still changing"
			} else if a.ShotInWait {
				av.Settle = "settled; screenshot taken in the wait"
			}
			sv.Actions = append(sv.Actions, av)
		}
		sv.Shapes = shapesOf(sv.Marks, sv.Radius)
		if p.Replay != nil {
			for _, s := range p.Replay.Screens {
				if s.Step == k {
					sm := &screenMatch{Identical: s.Identical, Distance: fmt.Sprintf("%.2f%%", 100*s.Distance), Recorded: s.Recorded, Replayed: s.Replayed}
					// The replayed screen is shown when the store holds it.
					if _, err := r.store.ImagePNG(s.Replayed); err == nil {
						sm.ReplayedSrc = l.image(s.Replayed)
					}
					sv.Replay = sm
				}
			}
		}
		p.Steps = append(p.Steps, sv)
	}
	return p, true, nil
}

func fmtTime(t schema.Time) string {
	if t.IsZero() {
		return "–"
	}
	return t.UTC().Format(schema.TimeLayout)
}

// logprobSummary says how many logprobs a step's response has, their mean
// and smallest, and the perplexity they make.
func logprobSummary(st *schema.Step) string {
	lp := st.Response.Logprobs
	if len(lp) == 0 {
		return "none"
	}
	var sum float64
	lo := math.Inf(1)
	for _, v := range lp {
		sum += v
		lo = min(lo, v)
	}
	mean := sum / float64(len(lp))
	return fmt.Sprintf("%d tokens, mean %.3f, min %.3f, perplexity %.3f", len(lp), mean, lo, math.Exp(-mean))
}
