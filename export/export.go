package export

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"

	"golang.org/x/sync/errgroup"

	"legato/rl/schema"
)

// Options says how ExportSteps writes samples. The zero value writes image
// references and keeps every group.
type Options struct {
	// InlineImages writes images as PNG data URLs. By default they stay
	// legato-image://<sha256> references to DIR/images/<sha256>.png, which
	// keeps the file small (a prompt repeats up to 20 screenshots).
	InlineImages bool
	// DropConstantGroups leaves out the groups whose finished rewards are
	// all equal: their advantages are all 0, so they carry no GRPO signal.
	DropConstantGroups bool
	// AllowMissingLogprobs exports samples whose response has no logprobs
	// (the model server returned none). By default the export fails with a
	// *MissingLogprobsError, writing nothing: a trainer computing
	// importance ratios or a KL term from the sampler's logprobs cannot
	// use such samples, and would otherwise find out late or not at all.
	AllowMissingLogprobs bool
	// AllowBadLogprobs exports samples whose logprobs the server sent
	// broken (schema.Step.LogprobDefect: null or non-finite, or not one
	// per token id). By default the export fails with a *BadLogprobsError,
	// writing nothing. With it, such samples are written with
	// response_logprobs null and the defect in their warnings, so that a
	// trainer can only treat them as samples without logprobs.
	AllowBadLogprobs bool
	// Contiguous writes one AttemptSample per finished attempt (its whole
	// interaction as one token sequence with a loss mask, see
	// AttemptSequence) instead of one Sample per step. Attempts whose
	// prompts do not extend each other fail the export, naming the step.
	Contiguous bool
	// PromptPrefix writes each step's prompt token ids after the part it
	// shares with the previous step's prompt: a sample then says, in
	// prompt_prefix_ids, how many ids its prompt shares with the sample of
	// the step before (the line before it), and prompt_token_ids holds
	// only the rest. The prompt of step k is the first prompt_prefix_ids
	// ids of step k-1's prompt followed by its own prompt_token_ids. An
	// attempt's prompts repeat its history, so whole prompts grow the
	// output with the square of the steps; with PromptPrefix it grows with
	// the steps. Not with Contiguous, which has no per-step prompts.
	PromptPrefix bool
	// QuarantineFile is a task quarantine shared across batches (collect
	// --quarantine) whose tasks are left out, beside those of the run
	// directory's quarantine.json, which always are.
	QuarantineFile string
	// IncludeQuarantined writes the samples of quarantined tasks too.
	IncludeQuarantined bool
	// Rewards says which rewards the samples and the advantages take:
	// RewardsRecorded (the default, also ""), or RewardsRegraded, the
	// latest regrade of each attempt's kept end state (regrades.jsonl,
	// legato rl regrade): then every finished attempt must have one.
	Rewards string
	// PartialGroups writes the groups that never ended too (see
	// Stats.PartialGroups), with advantages over the finished attempts
	// they have. By default they are left out: a group cut short by a
	// signal or a crash has fewer attempts than its batch's group size,
	// and its advantages would be another group's (3 rewards 1, 1, 0 give
	// 0.707 and −1.414; with the fourth attempt's 1, 0.577 and −1.732).
	PartialGroups bool
}

// Which rewards an export takes (Options.Rewards).
const (
	RewardsRecorded = "recorded"
	RewardsRegraded = "regraded"
)

// ErrNotRegraded means an export of regraded rewards met finished
// attempts without one.
var ErrNotRegraded = errors.New("finished attempts without a regraded reward")

// ErrBadLogprobs is wrapped by the error of an export that refused
// samples with broken logprobs; see Options.AllowBadLogprobs.
var ErrBadLogprobs = errors.New("samples with broken logprobs")

// maxNamedRollouts is how many rollouts a BadLogprobsError names.
const maxNamedRollouts = 3

// BadLogprobsError is the error of an export that refused to write samples
// whose logprobs the server sent broken.
type BadLogprobsError struct {
	// Samples is how many of the Total samples to write have broken
	// logprobs: NonFinite of them null, NaN or ±Inf, Mismatch of them not
	// one per token id. They are in RolloutCount rollouts, the first few
	// of which Rollouts names.
	Samples, Total      int
	NonFinite, Mismatch int
	RolloutCount        int
	Rollouts            []string
}

func (e *BadLogprobsError) Error() string {
	return fmt.Sprintf("%d of %d samples have broken logprobs (%d null, NaN or infinite: %s; %d not one per token id: %s), in %d rollouts (%s): "+
		"a trainer computing importance ratios from them would be silently wrong; check the server with legato rl probe, "+
		"or export them anyway with --allow-bad-logprobs (Options.AllowBadLogprobs), which writes them with response_logprobs null and the defect in their warnings",
		e.Samples, e.Total, e.NonFinite, schema.WarnNonFiniteLogprobs, e.Mismatch, schema.WarnLogprobsMismatch, e.RolloutCount, e.rollouts())
}

func (e *BadLogprobsError) rollouts() string {
	s := strings.Join(e.Rollouts, ", ")
	if e.RolloutCount > len(e.Rollouts) {
		s += ", …"
	}
	return s
}

func (e *BadLogprobsError) Unwrap() error { return ErrBadLogprobs }

// ErrMissingLogprobs is wrapped by the error of an export that refused
// samples without logprobs; see Options.AllowMissingLogprobs.
var ErrMissingLogprobs = errors.New("samples without logprobs")

// MissingLogprobsError is the error of an export that refused to write
// samples without logprobs.
type MissingLogprobsError struct {
	// Samples is how many of the Total samples to write have no logprobs;
	// FirstRollout and FirstStep name the first of them.
	Samples, Total int
	FirstRollout   string
	FirstStep      int
}

func (e *MissingLogprobsError) Error() string {
	return fmt.Sprintf("%d of %d samples have no logprobs (the first: rollout %s step %d): the model server returned none, "+
		"so a trainer cannot compute importance ratios from them; ask the server for logprobs (legato rl probe checks it), "+
		"or export them anyway with --allow-missing-logprobs (Options.AllowMissingLogprobs)",
		e.Samples, e.Total, e.FirstRollout, e.FirstStep)
}

func (e *MissingLogprobsError) Unwrap() error { return ErrMissingLogprobs }

// ErrDamagedRecords is wrapped by the error of an export that found an
// unreadable line of rollouts.jsonl other than the last one. It is
// schema.ErrDamagedRecords: replay and regrade read a run by the same rule
// (schema.RunAttempts) and refuse with the same error.
var ErrDamagedRecords = schema.ErrDamagedRecords

// The content-store caches of an export. An export goes rollout by
// rollout, and a step's prompt repeats the earlier messages of its own
// rollout and little else, so the caches only need to hold one rollout's
// history (about 30 messages and, inlined, 15 screenshots of 1–2 MB as
// data URLs). Bigger caches would only raise the memory an export holds
// without saving reads. A rollout's steps take the token chunks they share
// from the step before, not from the cache, so it holds little more than
// the first prompts a group's attempts share: at the default 32 MB it was
// a fifth of a contiguous export's peak memory, and every page of that is
// a page fault in a fresh process.
const (
	exportMessageCacheBytes = 8 << 20
	exportImageCacheBytes   = 64 << 20
	exportTokenCacheBytes   = 4 << 20
)

// keepRecordsBytes is the largest rollouts.jsonl whose records an export
// keeps from its first pass (rewards and checks) for its second (samples)
// instead of decoding them again, which was a tenth of its CPU. Records
// take about their JSON's size in memory; past it they are read twice.
var keepRecordsBytes int64 = 256 << 20

// Stats describes one export.
type Stats struct {
	// Lines is the number of samples written: one per step.
	Lines int
	// Rollouts and Groups count the finished attempts and the groups whose
	// samples were written.
	Rollouts int
	Groups   int
	// DroppedGroups and DroppedLines count what DropConstantGroups left out.
	DroppedGroups int
	DroppedLines  int
	// PartialGroups names, in the order of their first finished attempt,
	// the groups with samples that never ended (schema.GroupEnded): fewer
	// than GroupSize finished attempts, batch.json's group, while some of
	// their attempts have no final record, as a collect stopped by a
	// signal or a crash, or a repair that moved a record aside, leaves
	// them. Unless Options.PartialGroups their samples are left out,
	// PartialLines counting them. A batch.json that gives no group size
	// (GroupSize 0) leaves none out.
	PartialGroups []string
	PartialLines  int
	GroupSize     int
	// Records is the number of records read from rollouts.jsonl.
	Records int
	// RegradedRewards counts the samples' attempts whose regraded reward
	// was taken (Options.Rewards).
	RegradedRewards int
	// QuarantinedRecords counts the records of quarantined tasks left out,
	// and QuarantinedTasks names those tasks.
	QuarantinedRecords int
	QuarantinedTasks   []string
	// MissingReward counts finished records without a reward, which are
	// neither exported nor part of their group's statistics.
	MissingReward int
	// TornLines counts the unreadable lines of rollouts.jsonl that were
	// skipped (see schema.ReadRecords); FirstTorn says where the first is.
	// Only a torn last line is skipped: an export fails on any other.
	TornLines int
	FirstTorn *schema.LineError
	// MissingLogprobs counts the written samples without logprobs (only
	// with Options.AllowMissingLogprobs; otherwise the export fails).
	MissingLogprobs int
	// BadLogprobs counts the written samples whose broken logprobs were
	// left out (only with Options.AllowBadLogprobs; otherwise the export
	// fails).
	BadLogprobs int
	// Bytes is the size of the written file.
	Bytes int64
}

// Sample is one line of an export: one model call of a finished attempt,
// with the prompt it was given, what the model generated and the attempt's
// reward and group advantage. Decode lines into it.
type Sample struct {
	RolloutID string        `json:"rollout_id"`
	TaskID    string        `json:"task_id"`
	GroupID   string        `json:"group_id"`
	Attempt   int           `json:"attempt"`
	Step      int           `json:"step"` // index into the record's steps, from 0
	Status    schema.Status `json:"status"`
	// PolicyVersion is the version of the weights that generated the
	// response (the step's, see schema.Step.PolicyVersion), so a trainer
	// can correct for off-policy samples.
	PolicyVersion string  `json:"policy_version"`
	Reward        float64 `json:"reward"`
	Advantage     float64 `json:"advantage"`
	// Messages is the exact prompt of the call.
	Messages []schema.Message `json:"messages"`
	// PromptPrefixIDs, with Options.PromptPrefix, is how many ids at the
	// start of the prompt are those at the start of the previous step's
	// prompt; PromptTokenIDs then holds the ids after them (absent when
	// none follow). Absent otherwise, and for a first step.
	PromptPrefixIDs int `json:"prompt_prefix_ids,omitempty"`
	// PromptTokenIDs are the prompt's token ids as the server tokenized
	// it (chat template and image tokens included); absent when the server
	// did not return them.
	PromptTokenIDs    []int64   `json:"prompt_token_ids,omitempty"`
	ResponseText      string    `json:"response_text"`
	ResponseReasoning string    `json:"response_reasoning"`
	ResponseTokenIDs  []int64   `json:"response_token_ids"`
	ResponseLogprobs  []float64 `json:"response_logprobs"`
	// ResponseTokens holds token strings when the server gave no ids.
	ResponseTokens []string `json:"response_tokens"`
	// TokenIDsSource says how the response's ids came; keep the samples
	// whose source is exact (schema.TokenIDSource.Exact) for a
	// token-level loss.
	TokenIDsSource schema.TokenIDSource `json:"token_ids_source,omitempty"`
	FinishReason   string               `json:"finish_reason"`
	// Warnings repeats the step's data warnings, such as a logprobs and
	// token ids length mismatch.
	Warnings []string `json:"warnings,omitempty"`
}

// sampleHead and sampleTail are the fields of Sample before and after its
// messages. A line is written in three pieces so that a prompt with inline
// screenshots (tens of MB) is never encoded as one buffer.
// TestSampleWriterLayout keeps the pieces in step with Sample.
type sampleHead struct {
	RolloutID     string        `json:"rollout_id"`
	TaskID        string        `json:"task_id"`
	GroupID       string        `json:"group_id"`
	Attempt       int           `json:"attempt"`
	Step          int           `json:"step"`
	Status        schema.Status `json:"status"`
	PolicyVersion string        `json:"policy_version"`
	Reward        float64       `json:"reward"`
	Advantage     float64       `json:"advantage"`
}

type sampleTail struct {
	PromptPrefixIDs int     `json:"prompt_prefix_ids,omitempty"`
	PromptTokenIDs  []int64 `json:"prompt_token_ids,omitempty"`
	// promptChunks, when set, are the prompt's ids as the store's chunks
	// (PromptTokenIDs is then nil): appendTail writes them one after the
	// other, without first copying the prompt into one slice.
	promptChunks [][]int64
	// logprobsText, when set, is ResponseLogprobs as the record's line
	// holds them (schema.RecordText), which appendTail copies.
	logprobsText      []byte
	ResponseText      string               `json:"response_text"`
	ResponseReasoning string               `json:"response_reasoning"`
	ResponseTokenIDs  []int64              `json:"response_token_ids"`
	ResponseLogprobs  []float64            `json:"response_logprobs"`
	ResponseTokens    []string             `json:"response_tokens"`
	TokenIDsSource    schema.TokenIDSource `json:"token_ids_source,omitempty"`
	FinishReason      string               `json:"finish_reason"`
	Warnings          []string             `json:"warnings,omitempty"`
}

// ExportSteps writes the training samples of the run directory runDir to
// outPath as JSON lines: one Sample per step of every ok or truncated
// attempt, in the order of rollouts.jsonl, with the group advantages
// described in the package comment. The groups that never ended
// (Stats.PartialGroups) are left out unless opts.PartialGroups.
//
// It reads rollouts.jsonl twice, first for the rewards of each group and
// then for the samples, holding a few words per finished attempt; prompts
// come from the content store one step at a time. Records appended while
// it runs are left for the next export. outPath is written through a temp
// file in its directory and renamed when complete, so it is never
// half-written; it must not be one of the run's own files
// (schema.CheckOutput).
//
// The export refuses data a trainer would be misled by, leaving outPath
// untouched; it reads the records by schema.RunAttempts, as replay and
// regrade do. Two final records for one attempt fail it with a
// *schema.DuplicateFinalError (see schema.AttemptRule). An unreadable
// last line, what a crash mid-append leaves, is skipped and counted in
// Stats.TornLines (its attempt runs again on resume); an unreadable line
// anywhere else fails the export with an error wrapping ErrDamagedRecords
// and a *schema.LineError naming the line: the record it held is lost and
// its group's advantages would silently change.
// Samples with broken logprobs fail it with a *BadLogprobsError unless
// opts.AllowBadLogprobs, and samples without logprobs with a
// *MissingLogprobsError unless opts.AllowMissingLogprobs.
func ExportSteps(runDir, outPath string, opts Options) (Stats, error) {
	return ExportStepsContext(context.Background(), runDir, outPath, opts)
}

// ExportStepsContext is ExportSteps stopping, with ctx's error and without
// leaving outPath behind, when ctx is done.
func ExportStepsContext(ctx context.Context, runDir, outPath string, opts Options) (st Stats, err error) {
	if runDir == "" {
		return st, errors.New("export: empty run directory name: pass the run directory")
	}
	if outPath == "" {
		return st, errors.New("export: empty output path: name the file to write the samples to")
	}
	if err := schema.CheckOutput(runDir, outPath); err != nil {
		return st, fmt.Errorf("export: output %w", err)
	}
	if opts.Contiguous && opts.PromptPrefix {
		return st, errors.New("export: PromptPrefix shares prompt ids between per-step samples, and Contiguous writes one sequence per attempt: choose one")
	}

	held, err := readQuarantines(runDir, opts)
	if err != nil {
		return st, fmt.Errorf("export %s: %w", runDir, err)
	}
	regraded, err := readRegrades(runDir, opts)
	if err != nil {
		return st, fmt.Errorf("export %s: %w", runDir, err)
	}
	batch, err := schema.ReadBatch(runDir)
	if err != nil {
		return st, fmt.Errorf("export %s: %w", runDir, err)
	}
	var shape groupShape
	if batch != nil {
		shape = groupShape{size: batch.Group, attempts: batch.Attempts}
	}
	a := newAdmission(runDir, held, regraded, shape, &st)
	var rs schema.ReadStats
	rs, err = readRun(runDir, func(r *io.SectionReader) (schema.ReadStats, error) {
		if onePassExport && !opts.DropConstantGroups {
			rs, err := exportOnePass(ctx, r, a, outPath, opts, &st)
			if !errors.Is(err, errLeavesGroupsOut) {
				return rs, err
			}
			// Groups to leave out are known once every record is read,
			// and their samples were written: two passes write the
			// others. Only a run cut short pays for the three reads.
			if _, err := r.Seek(0, io.SeekStart); err != nil {
				return rs, err
			}
			st = Stats{}
			a = newAdmission(runDir, held, regraded, shape, &st)
		}
		return exportTwoPasses(ctx, r, a, outPath, opts, &st)
	})
	st.Records, st.TornLines, st.FirstTorn = rs.Records, rs.TornLines, rs.FirstTorn
	st.QuarantinedTasks = slices.Sorted(maps.Keys(a.heldSeen))
	if err != nil {
		// A one-pass export counts what it writes as it goes, into a temp
		// file that is gone now.
		st.Lines, st.Rollouts, st.Groups, st.DroppedLines, st.PartialLines = 0, 0, 0, 0, 0
		return st, fmt.Errorf("export %s: %w", runDir, err)
	}
	for _, g := range a.groups.order {
		if opts.DropConstantGroups && !a.groups.leftOut[g] && a.groups.constant(g) {
			st.DroppedGroups++
		}
	}
	return st, nil
}

// groupShape is a batch's groups as batch.json gives them: size finished
// attempts close one, which runs attempts attempts. The zero value, when
// batch.json is absent or does not say, judges no group cut short.
type groupShape struct {
	size, attempts int
}

// errLeavesGroupsOut is a one-pass export's check meeting groups to leave
// out, whose samples it wrote: the export is done again in two passes.
var errLeavesGroupsOut = errors.New("export leaves groups out: two passes")

// onePassExport lets an export that drops no group write its samples as it
// reads the records; a test turns it off to hold the two ways to each
// other.
var onePassExport = true

// exportOnePass reads the records once, writing each one's samples as it
// goes with a placeholder for its advantage, which depends on every
// attempt of its group, wherever in the file they are; once the last
// record is read and checked, the advantages are written over their
// placeholders (advantageWidth bytes each) before the file is synced. Two
// passes kept the records between them: hundreds of MB for a long run,
// and in a fresh process every page of it was a page fault, a third of a
// contiguous export's time. A group that DropConstantGroups leaves out is
// only known at the end, so that export takes two passes.
//
// It refuses what two passes refuse, with the same errors. Once a record
// makes the checks at the end certain to fail (doomed), it writes no more
// samples and only reads on, for the error's counts. When writing a sample
// fails (a sequence that is not contiguous, a damaged object), the records
// are read again to check them: their error, if any, is the one returned,
// as two passes would have found it before writing.
func exportOnePass(ctx context.Context, r *io.SectionReader, a *admission, outPath string, opts Options, st *Stats) (rs schema.ReadStats, err error) {
	a.patching = true
	store, err := openExportStore(a.runDir)
	if err != nil {
		return rs, err
	}
	defer store.Close()
	src := func(each func(*schema.Record, *schema.RecordText, float64) error) (schema.ReadStats, error) {
		return schema.ReadRecordsTextWith(r, readOptions(opts), func(rec schema.Record, text *schema.RecordText, line int) error {
			if err := ctx.Err(); err != nil {
				return err
			}
			if ok, err := a.admit(&rec, line); err != nil || !ok || a.doomed(opts) {
				return err
			}
			return each(&rec, text, 0) // a placeholder
		})
	}
	var patches []advantagePatch
	wrote := false // writeSamples returned: errors after it are the checks' or the patches'
	st.Bytes, err = schema.WriteFileAtomicPatched(outPath, func(w io.Writer) error {
		var err error
		rs, patches, err = writeSamples(ctx, src, true, w, store, opts, st)
		if err != nil {
			return err
		}
		wrote = true
		return a.check(rs, opts, st)
	}, func(f io.WriterAt) error {
		return a.patch(f, patches)
	})
	if err != nil && !wrote && ctx.Err() == nil {
		if rs2, cerr := recheck(ctx, r, a, opts); cerr != nil {
			return rs2, cerr
		}
	}
	return rs, err
}

// recheck reads r from its start with a fresh admission like a's and
// returns the error admitting the records or checking them gives.
func recheck(ctx context.Context, r *io.SectionReader, a *admission, opts Options) (schema.ReadStats, error) {
	if _, err := r.Seek(0, io.SeekStart); err != nil {
		return schema.ReadStats{}, err
	}
	fresh := newAdmission(a.runDir, a.held, a.regraded, a.shape, &Stats{})
	fresh.patching = a.patching
	rs, err := schema.ReadRecordLinesWith(r, readOptions(opts), func(rec schema.Record, line int) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		_, err := fresh.admit(&rec, line)
		return err
	})
	if err != nil {
		return rs, err
	}
	return rs, fresh.check(rs, opts, fresh.st)
}

// exportTwoPasses reads the records once for the groups' rewards and the
// checks, and again for the samples. A file that fits keepRecordsBytes is
// decoded once: the first pass keeps its records for the second.
func exportTwoPasses(ctx context.Context, r *io.SectionReader, a *admission, outPath string, opts Options, st *Stats) (schema.ReadStats, error) {
	var kept []keptRecord
	keep := r.Size() <= keepRecordsBytes
	read := func(fn func(schema.Record, *schema.RecordText, int) error) (schema.ReadStats, error) {
		return schema.ReadRecordLinesWith(r, readOptions(opts), func(rec schema.Record, line int) error { return fn(rec, nil, line) })
	}
	if keep {
		kept = []keptRecord{}
		read = func(fn func(schema.Record, *schema.RecordText, int) error) (schema.ReadStats, error) {
			return schema.ReadRecordsTextWith(r, readOptions(opts), fn)
		}
	}
	rs, err := read(func(rec schema.Record, text *schema.RecordText, line int) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		ok, err := a.admit(&rec, line)
		if ok && keep {
			kept = append(kept, keptRecord{rec, text})
		}
		return err
	})
	if err != nil {
		return rs, err
	}
	if err := a.check(rs, opts, st); err != nil {
		return rs, err
	}
	store, err := openExportStore(a.runDir)
	if err != nil {
		return rs, err
	}
	defer store.Close()
	// The second pass reads the same bytes as the first, so every
	// finished record it meets has its advantage.
	if _, err := r.Seek(0, io.SeekStart); err != nil {
		return rs, err
	}
	groups := a.groups
	src := func(each func(*schema.Record, *schema.RecordText, float64) error) (schema.ReadStats, error) {
		take := func(rec schema.Record, text *schema.RecordText) error {
			if reward, ok := a.regraded[rec.RolloutID]; ok && rec.Status.Finished() && rec.Reward != nil {
				rec.Reward = &reward
			}
			adv, ok := groups.advantage(rec.GroupID, rec.RolloutID)
			if !ok {
				return nil // not finished, or finished without a reward
			}
			// The lines an attempt would have written: one sequence, or a
			// sample per step.
			lines := len(rec.Steps)
			if opts.Contiguous {
				lines = 1
			}
			if groups.leftOut[rec.GroupID] {
				st.PartialLines += lines
				return nil
			}
			if opts.DropConstantGroups && groups.constant(rec.GroupID) {
				st.DroppedLines += lines
				return nil
			}
			return each(&rec, text, adv)
		}
		if kept == nil {
			return schema.ReadRecordsTextWith(r, readOptions(opts), func(rec schema.Record, text *schema.RecordText, _ int) error { return take(rec, text) })
		}
		for _, k := range kept {
			if err := take(k.rec, k.text); err != nil {
				return schema.ReadStats{}, err
			}
		}
		return schema.ReadStats{}, nil
	}
	st.Bytes, err = schema.WriteFileAtomic(outPath, func(w io.Writer) error {
		_, _, err := writeSamples(ctx, src, false, w, store, opts, st)
		return err
	})
	return rs, err
}

func openExportStore(runDir string) (*schema.MessageStore, error) {
	return schema.OpenMessageStore(runDir, schema.StoreOptions{
		MessageCacheBytes: exportMessageCacheBytes,
		ImageCacheBytes:   exportImageCacheBytes,
		TokenCacheBytes:   exportTokenCacheBytes,
	})
}

// admission decides, record by record in the file's order, which records
// an export takes: each attempt once (or the run is refused), quarantined
// tasks left out, regraded rewards in place of recorded ones. It keeps the
// groups' rewards and their logprob counts for the checks made once every
// record is read, which leave out the groups that never ended.
type admission struct {
	runDir      string
	held        heldTasks
	regraded    map[string]float64
	shape       groupShape
	attempts    *schema.RunAttempts
	groups      *groupTable
	heldSeen    map[string]bool
	notRegraded []string
	st          *Stats
	// patching: a one-pass export, which has written every group's
	// samples by the time check knows which to leave out.
	patching bool
}

// newAdmission returns an admission that has taken no record yet, of a
// batch whose groups have the given shape, and counts what it leaves out
// in st.
func newAdmission(runDir string, held heldTasks, regraded map[string]float64, shape groupShape, st *Stats) *admission {
	return &admission{runDir: runDir, held: held, regraded: regraded, shape: shape, attempts: schema.NewRunAttempts(runDir),
		groups: newGroupTable(), heldSeen: map[string]bool{}, st: st}
}

// admit takes rec, read from line, and reports whether it is a finished
// attempt with a reward, whose samples an export writes (unless its group
// is dropped). A rerun error record is no record to write, and a second
// final record of an attempt is an error.
func (a *admission) admit(rec *schema.Record, line int) (bool, error) {
	// The rule collect's resume reads by: a trainer must get the
	// attempts collect counted, each once.
	if _, err := a.attempts.Add(rec, line); err != nil {
		return false, err
	}
	if a.held.holds(rec) {
		a.st.QuarantinedRecords++
		a.heldSeen[rec.TaskID] = true
		return false, nil
	}
	if a.regraded != nil && rec.Status.Finished() && rec.Reward != nil {
		r, ok := a.regraded[rec.RolloutID]
		if !ok {
			a.notRegraded = append(a.notRegraded, rec.RolloutID)
			return false, nil
		}
		rec.Reward = &r
		a.st.RegradedRewards++
	}
	if !a.groups.add(rec) {
		if rec.Status.Finished() {
			a.st.MissingReward++
		}
		return false, nil
	}
	return true, nil
}

// doomed reports whether the records admitted so far make check fail
// whatever follows: a sample with broken or missing logprobs that opts do
// not allow, or a finished attempt without its regraded reward. (Without
// DropConstantGroups, which leaves groups out only at the end.)
func (a *admission) doomed(opts Options) bool {
	return len(a.notRegraded) > 0 || !opts.AllowBadLogprobs && a.groups.bad > 0 || !opts.AllowMissingLogprobs && a.groups.missing > 0
}

// check is what an export refuses once every record is read: a damaged
// line, finished attempts without their regraded reward, samples with
// broken or missing logprobs (unless opts allow them). It computes the
// groups' advantages, and which groups never ended (left out unless
// opts.PartialGroups); a one-pass export that must leave some out
// fails with errLeavesGroupsOut.
func (a *admission) check(rs schema.ReadStats, opts Options, st *Stats) error {
	if err := a.attempts.Done(rs); err != nil {
		return err
	}
	if len(a.notRegraded) > 0 {
		return fmt.Errorf("%w: %d (%s): regrade them (legato rl regrade; their end states must have been kept) or export the recorded rewards",
			ErrNotRegraded, len(a.notRegraded), strings.Join(a.notRegraded[:min(3, len(a.notRegraded))], ", "))
	}
	a.groups.finish()
	st.GroupSize = a.shape.size
	for _, g := range a.groups.order {
		if !a.attempts.GroupEnded(g, a.shape.size, a.shape.attempts) {
			st.PartialGroups = append(st.PartialGroups, g)
			if !opts.PartialGroups {
				a.groups.leftOut[g] = true
			}
		}
	}
	if len(a.groups.leftOut) > 0 && a.patching {
		return errLeavesGroupsOut
	}
	if bad := a.groups.badLogprobs(opts.DropConstantGroups); bad.Samples > 0 {
		if !opts.AllowBadLogprobs {
			return &bad
		}
		st.BadLogprobs = bad.Samples
	}
	if miss := a.groups.missingLogprobs(opts.DropConstantGroups); miss.Samples > 0 {
		if !opts.AllowMissingLogprobs {
			return &miss
		}
		st.MissingLogprobs = miss.Samples
	}
	return nil
}

// advantagePatch is where a one-pass export wrote the placeholders of a
// finished attempt's advantage: one per sample, at these offsets of the
// output.
type advantagePatch struct {
	groupID, rolloutID string
	offsets            []int64
}

// patch writes each attempt's advantage over its placeholders, after
// check. A 0, the placeholder's own value and every advantage of a group
// whose rewards are equal, needs no write.
//
// The writes are shared among one goroutine per CPU: a per-step export
// writes one per sample, 30,000 for 2,000 attempts of 15 steps, and one
// at a time they were a tenth of its time.
func (a *admission) patch(f io.WriterAt, patches []advantagePatch) error {
	var g errgroup.Group
	workers := runtime.GOMAXPROCS(0)
	for w := range workers {
		part := patches[w*len(patches)/workers : (w+1)*len(patches)/workers]
		g.Go(func() error {
			var b []byte
			for _, p := range part {
				adv, ok := a.groups.advantage(p.groupID, p.rolloutID)
				if !ok {
					return fmt.Errorf("rollout %s: written without an advantage (an export bug)", p.rolloutID)
				}
				if adv == 0 && !math.Signbit(adv) {
					continue
				}
				var err error
				if b, err = appendAdvantage(b[:0], adv); err != nil {
					return err
				}
				for _, off := range p.offsets {
					if _, err := f.WriteAt(b, off); err != nil {
						return err
					}
				}
			}
			return nil
		})
	}
	return g.Wait()
}

// readOptions is what an export with opts leaves out of the records it
// reads: a sequence holds no messages, so a contiguous export skips the
// requests' hashes.
func readOptions(opts Options) schema.ReadOptions {
	// The writers copy logprobs from the records' text; writeRecord
	// parses the values of a record whose text does not hold them all.
	return schema.ReadOptions{NoRequests: opts.Contiguous, LazyLogprobs: copyLogprobText}
}

// keptRecord is a record the first pass of an export keeps for the second,
// with its text.
type keptRecord struct {
	rec  schema.Record
	text *schema.RecordText
}

// recordSource calls each with the records whose samples an export
// writes, in the file's order, and each record's advantage (0, the
// placeholder's, in an export that patches them in at the end).
type recordSource func(each func(rec *schema.Record, text *schema.RecordText, adv float64) error) (schema.ReadStats, error)

// writeSamples writes the samples of the records src gives and returns
// src's read stats and, with placeholders, where each record's advantages
// are, for exportOnePass to write over once they are known. A reader goroutine takes the records from src and reads their
// new messages from disk into the store's cache; the samples of each
// record are built and encoded by one of several workers (one per CPU)
// into a buffer of their own, and a writer writes the buffers in the
// records' order. With inline images a record's samples are too big to
// hold (a prompt's screenshots are tens of MB per line): the writer
// encodes them itself, straight to w.
func writeSamples(ctx context.Context, src recordSource, placeholders bool, w io.Writer, store *schema.MessageStore, opts Options, st *Stats) (rs schema.ReadStats, patches []advantagePatch, err error) {
	workers := runtime.GOMAXPROCS(0)
	if opts.InlineImages {
		workers = 0
	}
	type job struct {
		rec   *schema.Record
		text  *schema.RecordText
		adv   float64
		buf   *bytes.Buffer
		lines int
		// advAt are the offsets in buf (or, written by the writer, from
		// where the record's samples start) of the advantages written.
		advAt []int64
		err   error
		done  chan struct{} // closed once buf or err is set
	}
	g, ctx := errgroup.WithContext(ctx)
	// queue holds the records in the file's order, for the writer; its
	// size bounds how far the reader and the workers run ahead of it.
	queue := make(chan *job, 2*max(workers, 1))
	// free holds the buffers of written jobs for the next ones: a record's
	// samples are hundreds of KB, and growing a new buffer for each was a
	// tenth of a per-step export's CPU. No more jobs than the queue holds
	// and the workers work on are alive at once.
	free := make(chan *bytes.Buffer, cap(queue)+workers)
	jobs := make(chan *job, max(workers, 1))
	send := func(ch chan<- *job, j *job) error {
		select {
		case ch <- j:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	g.Go(func() error {
		defer close(queue)
		defer close(jobs)
		seen := make(map[string]struct{})
		var err error
		rs, err = src(func(rec *schema.Record, text *schema.RecordText, adv float64) error {
			// Warm the cache with the rollout's distinct messages; the
			// encoder reports any error when it loads them.
			clear(seen)
			for i := range rec.Steps {
				if opts.Contiguous {
					break // a sequence has no messages
				}
				for _, h := range rec.Steps[i].Request {
					if _, ok := seen[h]; !ok {
						seen[h] = struct{}{}
						if opts.InlineImages {
							_, _ = store.Message(h) // the cache LoadRequest reads
						} else {
							_, _ = store.MessageJSON(h)
						}
					}
				}
			}
			j := &job{rec: rec, text: text, adv: adv, done: make(chan struct{})}
			if workers > 0 { // else the writer encodes the samples itself
				select {
				case j.buf = <-free:
					j.buf.Reset()
				default:
					j.buf = new(bytes.Buffer)
				}
			}
			if err := send(queue, j); err != nil || workers == 0 {
				return err
			}
			return send(jobs, j)
		})
		return err
	})
	for range workers {
		g.Go(func() error {
			sw := newSampleWriter(nil)
			for j := range jobs {
				sw.w, sw.n = j.buf, 0
				j.lines, j.err = writeRecord(ctx, j.rec, j.text, j.adv, sw, store, opts)
				j.advAt = slices.Clone(sw.advAt)
				close(j.done)
			}
			return nil
		})
	}
	g.Go(func() error {
		sw := newSampleWriter(w)
		exported := make(map[string]struct{})
		defer func() { st.Groups = len(exported) }()
		var written int64 // bytes written to w
		for j := range queue {
			start := written
			if workers == 0 {
				sw.n = 0
				lines, err := writeRecord(ctx, j.rec, j.text, j.adv, sw, store, opts)
				st.Lines += lines
				if err != nil {
					return err
				}
				j.advAt = sw.advAt
				written += sw.n
			} else {
				select {
				case <-j.done:
				case <-ctx.Done():
					return ctx.Err()
				}
				if j.err != nil {
					return j.err
				}
				if _, err := w.Write(j.buf.Bytes()); err != nil {
					return err
				}
				written += int64(j.buf.Len())
				select {
				case free <- j.buf:
				default:
				}
				st.Lines += j.lines
			}
			if placeholders {
				p := advantagePatch{groupID: j.rec.GroupID, rolloutID: j.rec.RolloutID, offsets: make([]int64, len(j.advAt))}
				for i, at := range j.advAt {
					p.offsets[i] = start + at
				}
				patches = append(patches, p)
			}
			st.Rollouts++
			exported[j.rec.GroupID] = struct{}{}
		}
		return nil
	})
	err = g.Wait()
	return rs, patches, err
}

// writeRecord writes the samples of rec, with advantage adv, with sw and
// returns how many it wrote; sw.advAt says where it wrote the advantages.
func writeRecord(ctx context.Context, rec *schema.Record, text *schema.RecordText, adv float64, sw *sampleWriter, store *schema.MessageStore, opts Options) (lines int, err error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	sw.advAt = sw.advAt[:0]
	if !logprobTextWhole(rec, text) {
		// Some values are formatted: they must be parsed.
		if err := text.ParseLogprobs(rec); err != nil {
			return 0, err
		}
	}
	load := schema.LoadOptions{KeepImageRefs: !opts.InlineImages}
	if opts.Contiguous {
		if err := fillSequence(&sw.seq, store, rec); err != nil {
			return 0, err
		}
		sw.texts = sw.texts[:0]
		if sw.seq.Logprobs != nil && copyLogprobText {
			for i := range rec.Steps {
				t := text.Logprobs(rec, i)
				if t == nil {
					sw.texts = sw.texts[:0]
					break
				}
				sw.texts = append(sw.texts, stepText{t, len(rec.Steps[i].Response.Logprobs)})
			}
		}
		var at int
		sw.tail, at, err = appendAttemptSample(sw.tail[:0], &AttemptSample{RolloutID: rec.RolloutID, TaskID: rec.TaskID, GroupID: rec.GroupID,
			Attempt: rec.Attempt, Status: rec.Status, Reward: *rec.Reward, Advantage: adv, Sequence: sw.seq}, sw.texts, sw.encode)
		if err == nil {
			sw.advAt = append(sw.advAt, sw.n+int64(at))
			err = sw.put(append(sw.tail, '\n'))
		}
		return 1, err
	}
	var prev [][]int64 // the previous step's prompt ids, as chunks
	// A step's prompt repeats the messages of the steps before it: each
	// distinct message of the attempt is encoded once (with images inline
	// they are too big to keep, and encoded as they are written).
	clear(sw.msgJSON)
	for i := range rec.Steps {
		step := &rec.Steps[i]
		head, tail, err := stepHeadTail(store, rec, i, adv, prev)
		if err != nil {
			return lines, err
		}
		if tail.ResponseLogprobs != nil && copyLogprobText {
			tail.logprobsText = text.Logprobs(rec, i)
		}
		msg := func(k int) ([]byte, error) {
			b, ok := sw.msgJSON[step.Request[k]]
			if ok {
				return b, nil
			}
			// The stored JSON with HTML characters unescaped is what
			// encoding/json writes for the message with its images as
			// references (TestMessageJSONAsEncoded).
			canon, err := store.MessageJSON(step.Request[k])
			if err != nil {
				return nil, fmt.Errorf("rollout %s step %d: load request: message %d: %w", rec.RolloutID, i, k, err)
			}
			b = appendUnescapedHTML(nil, canon)
			sw.msgJSON[step.Request[k]] = b
			return b, nil
		}
		if !load.KeepImageRefs {
			msgs, err := store.LoadRequest(*step, load)
			if err != nil {
				return lines, fmt.Errorf("rollout %s step %d: %w", rec.RolloutID, i, err)
			}
			msg = func(k int) ([]byte, error) { return sw.encode(&msgs[k]) }
		}
		whole := tail.promptChunks
		if opts.PromptPrefix && i > 0 {
			n := commonChunkPrefix(prev, whole, sharedChunks(rec.Steps[i-1].PromptTokenChunks, step.PromptTokenChunks))
			tail.PromptPrefixIDs, tail.promptChunks = n, dropIDs(whole, n)
		}
		prev = whole
		if err := sw.write(&head, len(step.Request), msg, &tail); err != nil {
			return lines, err
		}
		lines++
	}
	return lines, nil
}

// logprobTextWhole reports whether text holds the logprobs of every step
// of rec that has some, which the writers then copy.
func logprobTextWhole(rec *schema.Record, text *schema.RecordText) bool {
	for i := range rec.Steps {
		if len(rec.Steps[i].Response.Logprobs) > 0 && text.Logprobs(rec, i) == nil {
			return false
		}
	}
	return true
}

// stepSample loads the sample of step i of rec, with advantage adv, in the
// three pieces a line is written in (stepHeadTail, and the messages).
func stepSample(store *schema.MessageStore, rec *schema.Record, i int, adv float64, load schema.LoadOptions) (sampleHead, []schema.Message, sampleTail, error) {
	msgs, err := store.LoadRequest(rec.Steps[i], load)
	if err != nil {
		return sampleHead{}, nil, sampleTail{}, fmt.Errorf("rollout %s step %d: %w", rec.RolloutID, i, err)
	}
	head, tail, err := stepHeadTail(store, rec, i, adv, nil)
	return head, msgs, tail, err
}

// stepHeadTail loads the fields of step i's sample before and after its
// messages; prev is the prompt of step i-1 as chunks, nil for none.
// Logprobs with a defect are left out and the defect named in its
// warnings: only an export with AllowBadLogprobs gets that far.
func stepHeadTail(store *schema.MessageStore, rec *schema.Record, i int, adv float64, prev [][]int64) (sampleHead, sampleTail, error) {
	step := &rec.Steps[i]
	var prevStep schema.Step
	if i > 0 {
		prevStep = rec.Steps[i-1]
	}
	promptChunks, _, err := store.PromptTokenIDChunksAfter(*step, prevStep, prev)
	if err != nil {
		return sampleHead{}, sampleTail{}, fmt.Errorf("rollout %s step %d: %w", rec.RolloutID, i, err)
	}
	head := sampleHead{RolloutID: rec.RolloutID, TaskID: rec.TaskID, GroupID: rec.GroupID, Attempt: rec.Attempt,
		Step: i, Status: rec.Status, PolicyVersion: step.Version(rec), Reward: *rec.Reward, Advantage: adv}
	tail := sampleTail{
		promptChunks:      promptChunks,
		ResponseText:      step.Response.Content,
		ResponseReasoning: step.Response.Reasoning,
		ResponseTokenIDs:  step.Response.TokenIDs,
		ResponseLogprobs:  step.Response.Logprobs,
		ResponseTokens:    step.Response.Tokens,
		TokenIDsSource:    step.Response.TokenIDsSource,
		FinishReason:      step.Response.FinishReason,
		Warnings:          step.Warnings,
	}
	if d := step.LogprobDefect(); d != "" {
		tail.ResponseLogprobs = nil
		if !slices.Contains(tail.Warnings, d) {
			tail.Warnings = append(slices.Clone(tail.Warnings), d)
		}
	}
	return head, tail, nil
}

// copyLogprobText lets the writers copy logprobs from the records' text
// (schema.RecordText); a test turns it off to compare.
var copyLogprobText = true

// RecordSamples returns the samples export writes for rec, one per step,
// with advantage adv; rec must be graded (a reward). Images stay
// references unless inline. A service hands them to a trainer one group
// at a time.
func RecordSamples(store *schema.MessageStore, rec *schema.Record, adv float64, inline bool) ([]Sample, error) {
	if rec.Reward == nil {
		return nil, fmt.Errorf("rollout %s: no reward (status %s): only graded attempts have samples", rec.RolloutID, rec.Status)
	}
	load := schema.LoadOptions{KeepImageRefs: !inline}
	out := make([]Sample, 0, len(rec.Steps))
	for i := range rec.Steps {
		h, msgs, t, err := stepSample(store, rec, i, adv, load)
		if err != nil {
			return nil, err
		}
		out = append(out, Sample{
			RolloutID: h.RolloutID, TaskID: h.TaskID, GroupID: h.GroupID, Attempt: h.Attempt, Step: h.Step,
			Status: h.Status, PolicyVersion: h.PolicyVersion, Reward: h.Reward, Advantage: h.Advantage,
			Messages: msgs, PromptPrefixIDs: t.PromptPrefixIDs, PromptTokenIDs: t.promptIDs(), ResponseText: t.ResponseText,
			ResponseReasoning: t.ResponseReasoning, ResponseTokenIDs: t.ResponseTokenIDs,
			ResponseLogprobs: t.ResponseLogprobs, ResponseTokens: t.ResponseTokens,
			TokenIDsSource: t.TokenIDsSource, FinishReason: t.FinishReason, Warnings: t.Warnings,
		})
	}
	return out, nil
}

// sampleWriter writes samples as JSON lines. HTML characters are not
// escaped: replies are full of <tool_call> tags, and a trainer reads them
// as text.
type sampleWriter struct {
	w io.Writer
	n int64 // bytes written to w
	// advAt are the offsets in w of the advantages of the record being
	// written.
	advAt   []int64
	scratch bytes.Buffer
	enc     *json.Encoder
	tail    []byte     // the tail's JSON, reused from line to line
	seq     Sequence   // a contiguous sample's sequence, reused likewise
	texts   []stepText // the text of its steps' logprobs, likewise
	// msgJSON holds the JSON of the messages of the attempt being
	// written, by hash.
	msgJSON map[string][]byte
}

func newSampleWriter(w io.Writer) *sampleWriter {
	sw := &sampleWriter{w: w, msgJSON: map[string][]byte{}}
	sw.enc = json.NewEncoder(&sw.scratch)
	sw.enc.SetEscapeHTML(false)
	return sw
}

// encode returns v's JSON, without the newline, in scratch memory valid
// until the next call.
func (sw *sampleWriter) encode(v any) ([]byte, error) {
	sw.scratch.Reset()
	if err := sw.enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(sw.scratch.Bytes(), []byte("\n")), nil
}

// put writes b to w, counting it.
func (sw *sampleWriter) put(b []byte) error {
	n, err := sw.w.Write(b)
	sw.n += int64(n)
	return err
}

// write writes one line: head's fields, "messages" (n of them, msg(k)
// giving the JSON of the k-th), then tail's fields. The advantage, head's
// last field, takes advantageWidth bytes.
func (sw *sampleWriter) write(head *sampleHead, n int, msg func(k int) ([]byte, error), tail *sampleTail) error {
	b, err := sw.encode(head)
	if err != nil {
		return err
	}
	at := bytes.LastIndex(b, []byte(`,"advantage":`)) + len(`,"advantage":`)
	if b, err = appendAdvantage(b[:at], head.Advantage); err != nil {
		return err
	}
	sw.advAt = append(sw.advAt, sw.n+int64(at))
	if err := sw.put(b); err != nil {
		return err
	}
	if err := sw.put([]byte(`,"messages":[`)); err != nil {
		return err
	}
	for k := range n {
		if k > 0 {
			if err := sw.put([]byte(",")); err != nil {
				return err
			}
		}
		b, err := msg(k)
		if err != nil {
			return err
		}
		if err := sw.put(b); err != nil {
			return err
		}
	}
	if err := sw.put([]byte("],")); err != nil {
		return err
	}
	if sw.tail, err = appendTail(sw.tail[:0], tail, sw.encode); err != nil {
		return err
	}
	sw.tail = append(sw.tail, '\n')
	return sw.put(sw.tail[1:]) // without its "{"
}

// readRun calls read with a reader of runDir/rollouts.jsonl limited to its
// size when opened: a snapshot of the append-only file, so that passes
// over it see the same records while collect appends more.
func readRun(runDir string, read func(*io.SectionReader) (schema.ReadStats, error)) (schema.ReadStats, error) {
	f, err := os.Open(filepath.Join(runDir, schema.RecordsFile))
	if err != nil {
		return schema.ReadStats{}, fmt.Errorf("read records: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return schema.ReadStats{}, fmt.Errorf("read records: %w", err)
	}
	return read(io.NewSectionReader(f, 0, fi.Size()))
}

// commonChunkPrefix is how many ids the prompts a and b, as chunks, start
// with alike. Their first skip chunks are the same chunks (equal hashes),
// which need no comparing.
func commonChunkPrefix(a, b [][]int64, skip int) int {
	n := 0
	for _, c := range b[:skip] {
		n += len(c)
	}
	ai, ao, bi, bo := skip, 0, skip, 0
	for ai < len(a) && bi < len(b) {
		switch {
		case ao == len(a[ai]):
			ai, ao = ai+1, 0
		case bo == len(b[bi]):
			bi, bo = bi+1, 0
		default:
			k := min(len(a[ai])-ao, len(b[bi])-bo)
			m := commonPrefix(a[ai][ao:ao+k], b[bi][bo:bo+k])
			n += m
			if m < k {
				return n
			}
			ao, bo = ao+k, bo+k
		}
	}
	return n
}

// dropIDs returns chunks without their first n ids, sharing their memory.
func dropIDs(chunks [][]int64, n int) [][]int64 {
	for i, c := range chunks {
		if n < len(c) {
			return append([][]int64{c[n:]}, chunks[i+1:]...)
		}
		n -= len(c)
	}
	return nil
}

// commonPrefix is how many ids a and b start with alike.
func commonPrefix(a, b []int64) int {
	n := min(len(a), len(b))
	for i := range n {
		if a[i] != b[i] {
			return i
		}
	}
	return n
}

// promptIDs moves the prompt's ids into PromptTokenIDs, as one slice of
// the caller's, and returns them.
func (t *sampleTail) promptIDs() []int64 {
	if t.promptChunks != nil {
		n := 0
		for _, c := range t.promptChunks {
			n += len(c)
		}
		ids := make([]int64, 0, n)
		for _, c := range t.promptChunks {
			ids = append(ids, c...)
		}
		t.PromptTokenIDs, t.promptChunks = ids, nil
	}
	return t.PromptTokenIDs
}
