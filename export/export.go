package export

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"

	"legato/rl/schema"
)

// This file holds the entry point, ExportSteps, with its Options and
// Stats. admission.go decides which records and groups are exported,
// samples.go and contiguous.go what their lines hold, and write.go how the
// output file is written.

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
	// ImageTokenID is the token id the model server expanded each image
	// into, whose runs in the prompts' ids are the images' spans
	// (StepImage.TokenSpan). 0 means DefaultImageTokenID (Qwen-VL's).
	ImageTokenID int64
	// AdvantageStd is the std that divides the advantages: "" takes the
	// one the batch recorded (schema.RecordedAdvantageStd: batch.json's,
	// a service's journal's, PopulationStd when neither records one).
	// Another value is used as given, and Stats.RecordedAdvantageStd
	// says whether it disagrees with the batch's (a trainer's scale
	// changes with it).
	AdvantageStd schema.AdvantageStd
}

// Which rewards an export takes (Options.Rewards).
const (
	RewardsRecorded = "recorded"
	RewardsRegraded = "regraded"
)

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
	// AdvantageStd is the std that divided the advantages, and
	// RecordedAdvantageStd the one the batch recorded
	// (Options.AdvantageStd).
	AdvantageStd         schema.AdvantageStd
	RecordedAdvantageStd schema.AdvantageStd
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
	if opts.ImageTokenID < 0 {
		return st, fmt.Errorf("export: ImageTokenID %d: want the model's image token id, or 0 for DefaultImageTokenID (%d)", opts.ImageTokenID, DefaultImageTokenID)
	}
	if opts.AdvantageStd != "" {
		if _, err := schema.ParseAdvantageStd(string(opts.AdvantageStd)); err != nil {
			return st, fmt.Errorf("export: AdvantageStd: %w", err)
		}
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
	if st.RecordedAdvantageStd, err = schema.RecordedAdvantageStd(runDir); err != nil {
		return st, fmt.Errorf("export %s: %w", runDir, err)
	}
	if opts.AdvantageStd == "" {
		opts.AdvantageStd = st.RecordedAdvantageStd
	}
	st.AdvantageStd = opts.AdvantageStd
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
			st = Stats{AdvantageStd: st.AdvantageStd, RecordedAdvantageStd: st.RecordedAdvantageStd}
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
