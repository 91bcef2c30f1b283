package rl

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"legato/rl/policy"
	"legato/rl/policy/qwen"
	"legato/rl/schema"
)

// A service runs groups that a trainer submits while it trains, on
// desktops it keeps for its whole life, into one run directory: the same
// scheduling, records and crash guarantees as Collect, with groups that
// arrive and end in any order, a policy whose version changes between
// steps, and a journal (JournalFile) from which a restart continues
// where the last run stopped.

// ServeOptions configures a service. The embedded CollectOptions say how
// attempts run; Group is the default group size, OnGroup is not used (the
// service's stream replaces it).
type ServeOptions struct {
	CollectOptions
	// Tasks are the tasks a submission may name by id alone.
	Tasks []Task
	// OSWorldDir resolves submissions naming an OSWorld task by id and
	// domain that is not among Tasks.
	OSWorldDir string
	// MaxStaleness, when above 0, drops from a group's result the steps
	// whose policy version is more than that many versions behind the one
	// in force when the group ended (counted in AttemptResult.StaleSteps).
	// 0 keeps every step.
	MaxStaleness int
	// ImageTokenID is the token id the model server expands each image
	// into; its runs in a step's prompt ids are the images' spans
	// (StepImage.TokenSpan). 0 means DefaultImageTokenID (Qwen-VL's).
	ImageTokenID int64
	// StaleRerun, with MaxStaleness, runs an attempt again when it
	// finishes with steps that far behind the version then in force
	// (recorded retried, error kind stale; at most twice an attempt),
	// instead of only leaving those steps out of the result.
	StaleRerun bool
	// ContiguousHarness is the harness of groups submitted with history
	// "contiguous": the service's own, evicting no screenshot. Nil with
	// the default harness makes one (the Qwen harness keeping
	// MaxImageMax screenshots); nil with another harness refuses such
	// groups.
	ContiguousHarness policy.Harness
	// Contiguous gives every graded attempt of a group's result its whole
	// interaction as one token sequence with a loss mask
	// (AttemptResult.Sequence), for trainers that take that shape. Use it
	// with a harness that evicts no screenshot (ImageMax at least the
	// steps), or sequences break at the first eviction.
	Contiguous bool
}

// GroupState is where a service's group is.
type GroupState string

const (
	GroupQueued    GroupState = "queued"    // no attempt started yet
	GroupRunning   GroupState = "running"   // attempts started, the group has not ended
	GroupClosed    GroupState = "closed"    // G attempts finished
	GroupShort     GroupState = "short"     // it ended with fewer: attempts failed for good
	GroupCancelled GroupState = "cancelled" // its caller cancelled it first
)

// Ended reports whether s is a final state.
func (s GroupState) Ended() bool {
	return s == GroupClosed || s == GroupShort || s == GroupCancelled
}

// GroupRequest asks a service for a group of attempts at one task.
type GroupRequest struct {
	// Task is the task as a tasks-file entry (see LoadTasks): {"task_id",
	// "domain"} names one of the service's tasks or an OSWorld task,
	// {"task_id", "config": {...}} carries it inline.
	Task json.RawMessage `json:"task"`
	// Size is G, the finished attempts that close the group (default: the
	// service's Group).
	Size int `json:"group_size,omitempty"`
	// Key, if set, makes the submission idempotent: the same key names the
	// same group, so a trainer that lost the answer can submit again.
	Key string `json:"key,omitempty"`
	// Policy, if set, sends the group's model calls to its own server
	// (a gateway, a server per rollout worker) with APIKey.
	Policy *GroupPolicy `json:"policy,omitempty"`
	// History is "per-step" (default: the service's harness) or
	// "contiguous": no screenshot leaves the group's prompts, and each
	// graded attempt of its result carries its Sequence.
	History string `json:"history,omitempty"`
	// APIKey is the key of Policy's server. It is never stored or logged:
	// a service continued after a restart cancels the unfinished groups
	// that had one (their key is gone); submit them again.
	APIKey string `json:"-"`
}

// GroupInfo is what a service says of a group.
type GroupInfo struct {
	ID     string `json:"id"`
	Key    string `json:"key,omitempty"`
	TaskID string `json:"task_id"`
	Domain string `json:"domain"`
	Size   int    `json:"group_size"`
	// History is "contiguous" for a group submitted so.
	History string `json:"history,omitempty"`
	// Policy is the group's own model server, when it has one (its key
	// is never shown).
	Policy   *GroupPolicy `json:"policy,omitempty"`
	Attempts int          `json:"n_attempts"`
	State    GroupState   `json:"state"`
	// Cursor is the group's place in the stream, from 1, once it ended.
	Cursor      int       `json:"cursor,omitempty"`
	SubmittedAt time.Time `json:"submitted_at"`
	EndedAt     time.Time `json:"ended_at,omitzero"`
}

// Errors of a service's calls, for its HTTP front to map to statuses.
var (
	ErrUnknownGroup   = errors.New("no such group")
	ErrBadRequest     = errors.New("bad request")
	ErrKeyConflict    = errors.New("the key names another group")
	ErrServiceStopped = errors.New("the service stopped")
	// ErrQuarantined refuses a group of a task a quarantine holds.
	ErrQuarantined = errors.New("the task is quarantined")
	// ErrVersionOrder refuses a policy version that does not come after
	// the one in force (see versionAfter); ResetPolicy goes back on
	// purpose.
	ErrVersionOrder = errors.New("policy versions only go up")
)

// Service is a running service; Serve starts one.
type Service struct {
	b       *batch
	opts    ServeOptions
	journal *journal
	known   map[string]Task // Tasks by id
	servers *groupServers   // groups' own model servers
	store   *schema.MessageStore
	cancel  context.CancelFunc
	done    chan struct{}
	// runErr and summary are the batch's result, set before done closes.
	runErr  error
	summary *Summary

	mu     sync.Mutex
	groups map[string]*serviceGroup
	keys   map[string]string // key → group id
	ended  []string          // ids in stream order: ended[i] has cursor i+1
	next   int               // the number of the next group id
	// versions are the policy versions in the order they came into force,
	// rank their places: a step's staleness is how many came after its own.
	versions []string
	rank     map[string]int
	// news is closed, and replaced, whenever a group ends or the service
	// stops: waiters watch it.
	news    chan struct{}
	stopped bool
}

type serviceGroup struct {
	info GroupInfo
	// endVersion is the policy version in force when the group ended.
	endVersion string
}

// maxServiceGroups bounds the groups one run directory holds, as
// MaxAttempts bounds a batch.
const maxServiceGroups = MaxAttempts / 4

// Serve starts a service with the model server of pol in opts.Out. A
// directory a service ran in before is continued: its groups run on,
// ended groups keep their place in the stream, and the policy is where it
// was left. It returns once the service takes submissions; Close stops it.
func Serve(ctx context.Context, pol PolicyConfig, opts ServeOptions) (*Service, error) {
	known := make(map[string]Task, len(opts.Tasks))
	for _, t := range opts.Tasks {
		known[t.ID] = t
	}
	s := &Service{known: known, groups: map[string]*serviceGroup{}, rank: map[string]int{},
		keys: map[string]string{}, news: make(chan struct{}), done: make(chan struct{})}
	runCtx, cancel := context.WithCancel(ctx)
	s.cancel = cancel
	// restore opens the journal and rebuilds the groups of earlier runs
	// from it, with the batch openBatch opened.
	restore := func(b *batch, m schema.Batch) (err error) {
		opts.CollectOptions = b.options()
		s.opts = opts
		var entries []journalEntry
		if s.journal, entries, err = openJournal(opts.Out, opts.Logger); err != nil {
			return err
		}
		// One reader of the store for the service's life, shared by every
		// answer: its caches hold what consecutive groups share.
		if s.store, err = schema.OpenMessageStore(opts.Out, schema.StoreOptions{}); err != nil {
			return err
		}
		if urls := lastBaseURLs(entries); len(urls) > 0 {
			// A trainer moved the policy to other servers: they hold it.
			if b.startOn(urls) {
				opts.Logger.Warn("serving from the model servers the trainer last named (POST /v1/policy), not --policy-url", "servers", len(urls))
			}
		}
		if opts.ContiguousHarness == nil && opts.Harness == nil {
			s.opts.ContiguousHarness = qwen.New(qwen.Config{ImageMax: MaxImageMax})
		}
		s.b = b
		s.servers = newGroupServers(runCtx, b)
		return s.replay(entries, m)
	}
	door := batchDoor{open: true, restore: restore, onGroup: s.onGroup,
		held: "ending the unfinished groups of tasks quarantined since they were submitted"}
	if opts.StaleRerun && opts.MaxStaleness > 0 {
		door.stale = s.isStale
	}
	// Groups queued before a restart whose task was quarantined since (by
	// this service's grades, or in the shared file) end short, as collect
	// ends them, instead of training on a task found unfit.
	b, _, err := openBatch(pol, opts.CollectOptions, door)
	if err != nil {
		cancel()
		if s.servers != nil {
			s.servers.close()
		}
		if s.journal != nil {
			s.journal.close()
		}
		if s.store != nil {
			s.store.Close()
		}
		return nil, err
	}
	go func() {
		defer close(s.done)
		sum, err := b.runAndClose(runCtx)
		cancel()
		s.servers.close()
		s.journal.close()
		s.store.Close()
		s.mu.Lock()
		s.summary, s.runErr, s.stopped = sum, err, true
		s.broadcastLocked()
		s.mu.Unlock()
	}()
	return s, nil
}

// replay rebuilds the service's state from its journal, or starts the
// journal with m.
func (s *Service) replay(entries []journalEntry, m schema.Batch) error {
	var old *schema.Batch
	if len(entries) > 0 {
		old = entries[0].Manifest
	}
	kind, err := keptAdvantageStd(JournalFile+" line 1", old, m.AdvantageStd)
	if err != nil {
		return err
	}
	if len(entries) == 0 {
		m.AdvantageStd, s.b.sched.advStd = kind, kind
		s.noteVersion(s.b.policyVersion(), false)
		return s.journal.append(journalEntry{Op: opService, Manifest: &m, Version: s.b.policyVersion()})
	}
	if entries[0].Op != opService || entries[0].Manifest == nil {
		return fmt.Errorf("%s does not start with the service's settings: not a service journal", JournalFile)
	}
	if err := continueBatch(s.opts.Out, JournalFile, entries[0].Manifest, m, s.opts.Logger); err != nil {
		return fmt.Errorf("%w (the service's settings are in the first line of %s)", err, JournalFile)
	}
	s.b.sched.advStd = kind
	s.noteVersion(entries[0].Version, false)
	var keyed []string
	for i, e := range entries[1:] {
		switch e.Op {
		case opGroup:
			tasks, err := ParseTasks(append(append([]byte("["), e.Task...), ']'), fmt.Sprintf("%s line %d", JournalFile, i+2), LoadOptions{})
			if err != nil {
				return err
			}
			info := GroupInfo{ID: e.ID, Key: e.Key, TaskID: tasks[0].ID, Domain: tasks[0].Domain, Size: e.Size, Policy: e.Policy, History: e.History,
				Attempts: e.Attempts, State: GroupQueued, SubmittedAt: e.At}
			s.groups[e.ID] = &serviceGroup{info: info}
			if e.Key != "" {
				s.keys[e.Key] = e.ID
			}
			g := newGroup(e.ID, tasks[0], e.Size, e.Attempts)
			if e.TaskSHA != "" {
				// The config as submitted, not as journaled: its records
				// and quarantine entries before the restart name it so.
				g.taskSHA = e.TaskSHA
			}
			if e.History == "contiguous" {
				if g.harness = s.opts.ContiguousHarness; g.harness == nil {
					return fmt.Errorf("%s line %d: group %s has history contiguous, which this service's harness cannot give; serve with the harness it had", JournalFile, i+2, e.ID)
				}
			}
			s.b.restoreGroup(g)
			s.next++
			switch {
			case e.Keyed:
				// Its key was never stored: it cannot run on. Cancelled
				// below unless it ended.
				keyed = append(keyed, e.ID)
			case e.Policy != nil:
				if g.server, err = s.servers.get(*e.Policy, ""); err != nil {
					return fmt.Errorf("%s line %d: group %s's policy: %w", JournalFile, i+2, e.ID, serviceErr(err))
				}
			}
		case opDrop:
			s.b.restoreDrop(e.ID)
		case opPolicy:
			paused := e.Paused != nil && *e.Paused
			s.b.setPolicy(e.Version, paused)
			s.noteVersion(e.Version, e.Force)
		case opEnd:
			g := s.groups[e.ID]
			if g == nil || e.Cursor != len(s.ended)+1 {
				return fmt.Errorf("%s line %d: group %q ends at cursor %d, out of order: the journal is damaged", JournalFile, i+2, e.ID, e.Cursor)
			}
			g.info.State, g.info.Cursor, g.info.EndedAt, g.endVersion = e.State, e.Cursor, e.At, e.Version
			s.ended = append(s.ended, e.ID)
		}
	}
	for _, id := range keyed {
		if s.groups[id].info.Cursor != 0 || s.b.restoredDropped(id) {
			continue
		}
		s.opts.Logger.Warn("cancelled a group that had its own model key: keys are never stored, so it cannot run on after a restart; submit it again", "group", id)
		if err := s.journal.append(journalEntry{Op: opDrop, ID: id}); err != nil {
			return err
		}
		s.b.restoreDrop(id)
	}
	if len(entries) > 1 && !slices.ContainsFunc(entries[1:], func(e journalEntry) bool { return e.Op == opPolicy }) {
		// The policy was never changed: this run's --version is in force,
		// and joins the history if it is new.
		if v := s.b.policyVersion(); v != s.versions[len(s.versions)-1] {
			s.noteVersion(v, false)
			return s.journal.append(journalEntry{Op: opPolicy, Version: v, Paused: new(false)})
		}
	}
	return nil
}

// noteVersion adds v to the history of versions when it is new, or, put
// in force again on purpose (ResetPolicy), moves it to the end: steps of
// the versions between are then behind it.
func (s *Service) noteVersion(v string, again bool) {
	if _, ok := s.rank[v]; (!ok || again) && v != "" {
		s.rank[v] = len(s.versions)
		s.versions = append(s.versions, v)
	}
}

// versionAfter says why next may not follow cur as the policy version,
// or nil when it may. Versions are the trainer's names ("v7", "step-41"),
// so "after" is what can be told of names: next is not one that came
// into force before (rank holds those), and when both end in a number
// after the same text ("step-41", "step-42"), next's number is larger.
// Any other new name comes after.
func versionAfter(rank map[string]int, cur, next string) error {
	if next == cur {
		return nil
	}
	if _, seen := rank[next]; seen {
		return fmt.Errorf("%w: version %q came into force before %q, the current one", ErrVersionOrder, next, cur)
	}
	cp, cn := splitVersionNumber(cur)
	np, nn := splitVersionNumber(next)
	if cn != "" && nn != "" && cp == np && !numberAbove(nn, cn) {
		return fmt.Errorf("%w: version %q does not come after %q, the current one (%s is not above %s)", ErrVersionOrder, next, cur, nn, cn)
	}
	return nil
}

// splitVersionNumber splits v into its text and its trailing decimal
// digits ("step-41": "step-", "41").
func splitVersionNumber(v string) (text, number string) {
	i := len(v)
	for i > 0 && v[i-1] >= '0' && v[i-1] <= '9' {
		i--
	}
	return v[:i], v[i:]
}

// numberAbove reports whether the decimal digits a are a larger number
// than b, at any length.
func numberAbove(a, b string) bool {
	a, b = strings.TrimLeft(a, "0"), strings.TrimLeft(b, "0")
	if len(a) != len(b) {
		return len(a) > len(b)
	}
	return a > b
}

// checkVersion refuses a version that cannot be stamped on records and
// logged as it is.
func checkVersion(v string) error {
	switch {
	case len(v) > 256:
		return fmt.Errorf("%w: version of %d bytes: want at most 256", ErrBadRequest, len(v))
	case !utf8.ValidString(v):
		return fmt.Errorf("%w: version %q: not UTF-8", ErrBadRequest, v)
	case strings.ContainsFunc(v, unicode.IsControl):
		return fmt.Errorf("%w: version %q: holds a control character; want one line of printable text", ErrBadRequest, v)
	}
	return nil
}

// isStale reports whether a graded try has a step more than MaxStaleness
// versions behind the version in force now.
func (s *Service) isStale(rec *Record) bool {
	now := s.b.policyVersion()
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range rec.Steps {
		if n, ok := s.staleness(rec.Steps[i].Version(rec), now); ok && n > s.opts.MaxStaleness {
			return true
		}
	}
	return false
}

// staleness is how many versions came into force after v up to end; false
// when either is not a version the service put in force (a server's own
// weight_version).
func (s *Service) staleness(v, end string) (int, bool) {
	rv, ok1 := s.rank[v]
	re, ok2 := s.rank[end]
	if !ok1 || !ok2 {
		return 0, false
	}
	return max(re-rv, 0), true
}

// onGroup journals a group that ended, giving it its place in the stream.
func (s *Service) onGroup(grp Group) {
	s.mu.Lock()
	g := s.groups[grp.ID]
	if g == nil || g.info.Cursor != 0 {
		s.mu.Unlock()
		return // ended in an earlier run
	}
	state := GroupShort
	switch {
	case grp.Dropped:
		state = GroupCancelled
	case grp.Closed:
		state = GroupClosed
	}
	cursor := len(s.ended) + 1
	now := time.Now().UTC()
	version := s.b.policyVersion()
	// Under the lock: the stream's order is the journal's.
	err := s.journal.append(journalEntry{Op: opEnd, At: now, ID: grp.ID, Cursor: cursor, State: state, Version: version})
	if err == nil {
		g.info.State, g.info.Cursor, g.info.EndedAt, g.endVersion = state, cursor, now, version
		s.ended = append(s.ended, grp.ID)
		s.broadcastLocked()
	}
	s.mu.Unlock()
	if err != nil {
		s.b.fail(&storeFailure{err})
	}
}

func (s *Service) broadcastLocked() {
	close(s.news)
	s.news = make(chan struct{})
}

// keyPattern is what an idempotency key may be: it is logged and echoed.
var keyPattern = regexp.MustCompile(`^[A-Za-z0-9._:-]{1,128}$`)

// Submit queues a group. created is false when req.Key named a group
// submitted before, which is returned as it is now.
func (s *Service) Submit(req GroupRequest) (info GroupInfo, created bool, err error) {
	bad := func(format string, args ...any) (GroupInfo, bool, error) {
		return GroupInfo{}, false, fmt.Errorf("%w: "+format, append([]any{ErrBadRequest}, args...)...)
	}
	size := req.Size
	if size == 0 {
		size = s.opts.Group
	}
	if size < 1 || size > MaxGroup {
		return bad("group_size %d: want 1 to %d", req.Size, MaxGroup)
	}
	var harness policy.Harness
	switch req.History {
	case "", "per-step":
		req.History = ""
	case "contiguous":
		if harness = s.opts.ContiguousHarness; harness == nil {
			return bad(`history "contiguous": this service's harness has no contiguous form; start it with --history contiguous`)
		}
	default:
		return bad(`history %q: want "per-step" or "contiguous"`, req.History)
	}
	if req.Key != "" && !keyPattern.MatchString(req.Key) {
		return bad("key %q: want 1 to 128 letters, digits, '.', '_', ':' or '-'", req.Key)
	}
	if len(req.Task) == 0 {
		return bad(`no task: give "task" as {"task_id": ID, "domain": D} or {"task_id": ID, "config": {...}}`)
	}
	task, err := s.resolve(req.Task)
	if errors.Is(err, errUnknownTask) {
		return GroupInfo{}, false, fmt.Errorf("task: %w", err)
	}
	if err != nil {
		return GroupInfo{}, false, fmt.Errorf("%w: task: %w", ErrBadRequest, err)
	}
	if e, ok := s.b.quarantined(task); ok {
		return GroupInfo{}, false, fmt.Errorf("%w: task %q (%s: %s); remove its entry from %s once it is fixed",
			ErrQuarantined, task.ID, e.Reason, e.Evidence, s.b.quarantineFiles())
	}
	entry, err := json.Marshal(struct {
		ID     string          `json:"task_id"`
		Domain string          `json:"domain"`
		Config json.RawMessage `json:"config"`
	}{task.ID, task.Domain, taskRaw(task)})
	if err != nil {
		return bad("task: %v", err)
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return GroupInfo{}, false, s.stoppedErrLocked()
	}
	if req.Key != "" {
		if id, ok := s.keys[req.Key]; ok {
			g := s.groups[id]
			if g.info.TaskID != task.ID || g.info.Size != size {
				return GroupInfo{}, false, fmt.Errorf("%w: key %q is group %s of task %q with group_size %d", ErrKeyConflict, req.Key, id, g.info.TaskID, g.info.Size)
			}
			return s.infoLocked(g), false, nil
		}
	}
	var server *modelServer
	if req.Policy != nil {
		if server, err = s.servers.get(*req.Policy, req.APIKey); err != nil {
			return GroupInfo{}, false, fmt.Errorf("%w: policy: %w", ErrBadRequest, serviceErr(err))
		}
	}
	if len(s.groups) >= maxServiceGroups {
		return GroupInfo{}, false, fmt.Errorf("%w: this run directory holds %d groups, the most one may; serve into a new --out", ErrBadRequest, len(s.groups))
	}
	id := fmt.Sprintf("g%06d", s.next+1)
	attempts := AttemptsPerTask(size, s.opts.Oversample)
	now := time.Now().UTC()
	if err := s.journal.append(journalEntry{Op: opGroup, At: now, ID: id, Key: req.Key, Size: size, Attempts: attempts, Task: entry, TaskSHA: TaskSHA(task),
		Policy: req.Policy, Keyed: req.Policy != nil && req.APIKey != "", History: req.History}); err != nil {
		return GroupInfo{}, false, err
	}
	s.next++
	g := &serviceGroup{info: GroupInfo{ID: id, Key: req.Key, TaskID: task.ID, Domain: task.Domain, Size: size, Policy: req.Policy, History: req.History,
		Attempts: attempts, State: GroupQueued, SubmittedAt: now}}
	s.groups[id] = g
	if req.Key != "" {
		s.keys[req.Key] = id
	}
	ng := newGroup(id, task, size, attempts)
	ng.server, ng.harness = server, harness
	if err := s.b.submit(ng); err != nil {
		return GroupInfo{}, false, serviceErr(err)
	}
	return s.infoLocked(g), true, nil
}

// taskRaw is the config a task was read from, or the task itself.
func taskRaw(t Task) json.RawMessage {
	if len(t.Raw) > 0 {
		return t.Raw
	}
	raw, _ := json.Marshal(t)
	return raw
}

// resolve parses a submission's task entry: one of the service's tasks by
// id, or an entry LoadTasks would read.
func (s *Service) resolve(raw json.RawMessage) (Task, error) {
	var fields map[string]json.RawMessage
	if json.Unmarshal(raw, &fields) == nil {
		if unknown := unknownEntryFields(fields); len(unknown) > 0 {
			return Task{}, fmt.Errorf("%s: %w", unknown[0], errUnknownEntryField)
		}
	}
	var ref struct {
		ID     string          `json:"task_id"`
		Domain string          `json:"domain"`
		Config json.RawMessage `json:"config"`
	}
	if err := json.Unmarshal(raw, &ref); err == nil && len(ref.Config) == 0 && ref.ID != "" {
		if t, ok := s.known[ref.ID]; ok {
			if ref.Domain != "" && ref.Domain != t.Domain {
				return Task{}, fmt.Errorf("domain %q: the service's task %q is in domain %q", ref.Domain, ref.ID, t.Domain)
			}
			return t, nil
		}
		if s.opts.OSWorldDir == "" {
			return Task{}, fmt.Errorf("%w: no task %q among the service's tasks (--tasks), and no --osworld directory to look it up in", errUnknownTask, ref.ID)
		}
	}
	tasks, err := ParseTasks(append(append([]byte("["), raw...), ']'), "task", LoadOptions{OSWorldDir: s.opts.OSWorldDir})
	if err != nil {
		return Task{}, err
	}
	return tasks[0], nil
}

var errUnknownTask = errors.New("unknown task")

// IsUnknownTask reports whether a Submit error is a task the service does
// not know.
func IsUnknownTask(err error) bool { return errors.Is(err, errUnknownTask) }

// serviceErr says an engine's errBatchStopping in the service's words:
// callers test for ErrServiceStopped.
func serviceErr(err error) error {
	if errors.Is(err, errBatchStopping) {
		return fmt.Errorf("%w: %w", ErrServiceStopped, err)
	}
	return err
}

func (s *Service) stoppedErrLocked() error {
	if s.runErr != nil {
		return fmt.Errorf("%w: %w", ErrServiceStopped, s.runErr)
	}
	return ErrServiceStopped
}

// Info returns what the service says of group id now.
func (s *Service) Info(id string) (GroupInfo, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	g := s.groups[id]
	if g == nil {
		return GroupInfo{}, fmt.Errorf("%w %q", ErrUnknownGroup, id)
	}
	return s.infoLocked(g), nil
}

func (s *Service) infoLocked(g *serviceGroup) GroupInfo {
	info := g.info
	if info.State == GroupQueued && s.b.groupStarted(info.ID) {
		info.State = GroupRunning
	}
	return info
}

// Wait returns group id's info once it ended, or as it is when ctx ends
// first (with no error: the caller asked how it is within a time).
func (s *Service) Wait(ctx context.Context, id string) (GroupInfo, error) {
	for {
		s.mu.Lock()
		g := s.groups[id]
		if g == nil {
			s.mu.Unlock()
			return GroupInfo{}, fmt.Errorf("%w %q", ErrUnknownGroup, id)
		}
		info, news, stopped := s.infoLocked(g), s.news, s.stopped
		s.mu.Unlock()
		if info.State.Ended() || stopped {
			return info, nil
		}
		select {
		case <-news:
		case <-ctx.Done():
			return info, nil
		}
	}
}

// Cancel ends group id: its queued attempts are skipped and its stepping
// ones cancelled; attempts that finished stay recorded. A group that ended
// already is left as it is. It waits for the group to end (its stepping
// attempts to stop) until ctx ends, then returns its state.
func (s *Service) Cancel(ctx context.Context, id string) (GroupInfo, error) {
	s.mu.Lock()
	g := s.groups[id]
	if g == nil {
		s.mu.Unlock()
		return GroupInfo{}, fmt.Errorf("%w %q", ErrUnknownGroup, id)
	}
	if g.info.State.Ended() {
		defer s.mu.Unlock()
		return s.infoLocked(g), nil
	}
	if s.stopped {
		defer s.mu.Unlock()
		return GroupInfo{}, s.stoppedErrLocked()
	}
	err := s.journal.append(journalEntry{Op: opDrop, ID: id})
	s.mu.Unlock()
	if err != nil {
		return GroupInfo{}, err
	}
	s.b.cancelGroup(id)
	return s.Wait(ctx, id)
}

// Ended returns the ids of the groups that ended after cursor, in stream
// order, at most limit (0: all); the first has cursor after+1.
func (s *Service) Ended(after, limit int) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if after < 0 || after >= len(s.ended) {
		return nil
	}
	ids := s.ended[after:]
	if limit > 0 && len(ids) > limit {
		ids = ids[:limit]
	}
	return append([]string(nil), ids...)
}

// WaitEnded waits until a group ended after cursor, ctx ends or the
// service stops; it reports whether one did.
func (s *Service) WaitEnded(ctx context.Context, after int) bool {
	for {
		s.mu.Lock()
		n, news, stopped := len(s.ended), s.news, s.stopped
		s.mu.Unlock()
		if n > after {
			return true
		}
		if stopped {
			return false
		}
		select {
		case <-news:
		case <-ctx.Done():
			return false
		}
	}
}

// SetPolicy changes the version stamped on model calls sent from now on
// and whether they are held (paused): a trainer pauses, swaps the weights
// on its servers, then serves the new version. An empty version keeps the
// current one. baseURLs, if given, move the service's model calls to
// those servers (data-parallel replicas of the same weights, as
// --policy-url repeated): calls sent from now on go there, and so do those
// waiting out an outage of the old servers, which then no longer counts
// against ServerDownTimeout (moveMain).
//
// A version must come after the current one (see versionAfter): a
// version that does not is refused with ErrVersionOrder.
func (s *Service) SetPolicy(version string, paused bool, baseURLs ...string) (PolicyState, error) {
	return s.setPolicy(version, paused, false, baseURLs)
}

// ResetPolicy is SetPolicy that puts version in force even when it does
// not come after the current one: a trainer going back to earlier weights
// on purpose. It is journaled so, and steps of the versions in between
// count as behind it.
func (s *Service) ResetPolicy(version string, paused bool, baseURLs ...string) (PolicyState, error) {
	return s.setPolicy(version, paused, true, baseURLs)
}

func (s *Service) setPolicy(version string, paused, force bool, baseURLs []string) (PolicyState, error) {
	if err := checkVersion(version); err != nil {
		return PolicyState{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return PolicyState{}, s.stoppedErrLocked()
	}
	cur := s.b.gateState()
	if version == "" {
		version = cur.Version
	}
	if version == cur.Version && paused == cur.Paused && len(baseURLs) == 0 {
		return cur, nil
	}
	if err := versionAfter(s.rank, cur.Version, version); err != nil && !force {
		return PolicyState{}, err
	}
	force = force && version != cur.Version
	var cfg PolicyConfig
	if len(baseURLs) > 0 {
		var err error
		if cfg, err = s.b.policyOn(baseURLs); err != nil {
			return PolicyState{}, fmt.Errorf("%w: base URLs: %w", ErrBadRequest, err)
		}
	}
	// Journaled first: a restart must not serve calls the trainer paused.
	if err := s.journal.append(journalEntry{Op: opPolicy, Version: version, Paused: &paused, BaseURLs: baseURLs, Force: force}); err != nil {
		return PolicyState{}, err
	}
	if len(baseURLs) > 0 {
		if err := s.b.moveMain(cfg); err != nil {
			return PolicyState{}, serviceErr(err)
		}
	}
	s.b.setPolicy(version, paused)
	st := s.Policy()
	s.noteVersion(version, force)
	if force {
		s.opts.Logger.Warn("policy version reset on purpose (force)", "version", version, "was", cur.Version)
	}
	s.opts.Logger.Info("policy", "version", st.Version, "paused", st.Paused)
	return st, nil
}

// Policy returns the policy gate's state and the servers the calls go to.
func (s *Service) Policy() PolicyState { return s.b.policyState() }

// Drain waits until no model call is in flight, for a trainer that paused
// the policy and must know every call sent under the old weights has come
// back before it swaps them: the calls held since the pause wait at the
// gate and go under the version served next. It refuses a policy that
// serves (ErrBadRequest), and gives up when ctx ends. A service that stops
// ends its calls first (its workers return before it is done), so a drain
// never outwaits the service.
func (s *Service) Drain(ctx context.Context) error {
	err := s.b.drainCalls(ctx)
	if errors.Is(err, errDrainServing) {
		return fmt.Errorf("%w: %v", ErrBadRequest, err)
	}
	return err
}

// ServiceStatus is a snapshot of a service.
type ServiceStatus struct {
	Policy   PolicyState        `json:"policy"`
	Desktops int                `json:"desktops"`
	Groups   map[GroupState]int `json:"groups"`
	// Cursor is the stream's last cursor.
	Cursor int `json:"cursor"`
	// Running counts attempts on desktops, InFlight model calls.
	Running  int            `json:"attempts_running"`
	InFlight int            `json:"model_calls_in_flight"`
	Counts   map[Status]int `json:"records"`
	// PhaseSeconds sums the seconds the service's tries spent per timing
	// phase.
	PhaseSeconds map[string]float64 `json:"phase_seconds"`
	Stopped      bool               `json:"stopped"`
	Error        string             `json:"error,omitempty"`
}

// Status returns a snapshot of the service.
func (s *Service) Status() ServiceStatus {
	p := s.b.progress(false)
	phases := s.b.phaseSeconds()
	pol := s.Policy()
	s.mu.Lock()
	defer s.mu.Unlock()
	st := ServiceStatus{Policy: pol, Desktops: s.opts.Desktops, Groups: map[GroupState]int{},
		Cursor: len(s.ended), Running: p.Running, InFlight: p.InFlight, Counts: p.Counts, PhaseSeconds: phases, Stopped: s.stopped}
	for _, g := range s.groups {
		st.Groups[s.infoLocked(g).State]++
	}
	if s.runErr != nil {
		st.Error = s.runErr.Error()
	}
	return st
}

// Done is closed when the service stopped: Close was called, its ctx
// ended, or it failed (Err says why).
func (s *Service) Done() <-chan struct{} { return s.done }

// Err is why the service stopped on its own; nil while it runs and after
// Close.
func (s *Service) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if errors.Is(s.runErr, context.Canceled) {
		return nil
	}
	return s.runErr
}

// Close stops the service: no attempt starts, running ones are
// interrupted (they run again when a service continues the directory),
// every desktop is closed and the summary written. It returns the final
// summary.
//
// When ctx ends first (a desktop slow to close), Close returns ctx's
// error: the service was told to stop and goes on stopping, every desktop
// still closed; Done is closed once it stopped, and Close called again
// then returns the summary.
func (s *Service) Close(ctx context.Context) (*Summary, error) {
	s.cancel()
	select {
	case <-s.done:
	case <-ctx.Done():
		select {
		case <-s.done: // both: the service stopped
		default:
			return nil, ctx.Err()
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.runErr != nil && !errors.Is(s.runErr, context.Canceled) {
		return s.summary, s.runErr
	}
	return s.summary, nil
}

// Blob returns the bytes of the store object named sha256 in hex: a
// screenshot (PNG) or a message (JSON, its images as references), and
// which it is.
func (s *Service) Blob(sha string) (data []byte, contentType string, err error) {
	if !hexName.MatchString(sha) {
		return nil, "", fmt.Errorf("%w: %q is not a sha256 in hex", ErrBadRequest, sha)
	}
	if data, err := s.store.ImagePNG(sha); err == nil {
		return data, "image/png", nil
	}
	m, err := s.store.Message(sha)
	if err != nil {
		return nil, "", fmt.Errorf("%w: no blob %s", ErrUnknownBlob, sha)
	}
	data, err = json.Marshal(m)
	return data, "application/json", err
}

// ErrUnknownBlob: no store object has that hash.
var ErrUnknownBlob = errors.New("no such blob")

var hexName = regexp.MustCompile(`^[0-9a-f]{64}$`)
