package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"

	"legato/rl/export"
	"legato/rl/schema"
)

// exportCommand is `legato rl export`: it writes one training sample per
// model call of a run, with group advantages.
type exportCommand struct {
	out          string
	opts         export.Options
	imageTokenID int
}

func (c *exportCommand) flagSet(stderr io.Writer) *flag.FlagSet {
	fs := newFlagSet("legato rl export", stderr)
	fs.StringVar(&c.out, "out", "", "write the samples to `FILE`, one JSON line per model call (required)")
	fs.BoolVar(&c.opts.InlineImages, "inline-images", false, "write images as PNG data URLs instead of references to DIR/images/")
	fs.BoolVar(&c.opts.DropConstantGroups, "drop-constant-groups", false, "leave out groups whose finished attempts all got the same reward (advantage 0)")
	fs.BoolVar(&c.opts.AllowMissingLogprobs, "allow-missing-logprobs", false, "write samples whose response has no logprobs (the model server returned none) instead of failing")
	fs.BoolVar(&c.opts.Contiguous, "contiguous", false, "one sample per finished attempt: its whole interaction as one token sequence with a loss mask over the generated tokens (NeMo RL, verl), instead of one per model call; needs prompt token ids and a run whose prompts grow append-only (--history contiguous)")
	fs.BoolVar(&c.opts.PromptPrefix, "prompt-prefix", false, "write each step's prompt token ids after the part it shares with the previous step's prompt (prompt_prefix_ids says how many ids that is): the output grows with the steps, not with their square")
	fs.StringVar(&c.opts.QuarantineFile, "quarantine", "", "a task quarantine `FILE` shared across batches (collect --quarantine): its tasks are left out too, beside those of the run's quarantine.json")
	fs.BoolVar(&c.opts.IncludeQuarantined, "include-quarantined", false, "write the samples of quarantined tasks too (left out by default: their rewards are not to be trusted)")
	choiceVar(fs, &c.opts.Rewards, "rewards", export.RewardsRecorded, []string{export.RewardsRecorded, export.RewardsRegraded}, "the rewards samples and advantages take: recorded, or regraded (the latest legato rl regrade of each attempt's kept end state; every finished attempt needs one)")
	fs.BoolVar(&c.opts.PartialGroups, "partial-groups", false, "write the groups that never ended too (fewer finished attempts than the batch's group size while some attempts have no final record: a collect stopped or crashed), with advantages over the attempts they have")
	intVar(fs, &c.imageTokenID, "image-token-id", export.DefaultImageTokenID, 1, math.MaxInt, "the token id the model server expands each image into (Qwen-VL's <|image_pad|> by default): its runs in the prompt ids are the images' token_span")
	advantageStdVar(fs, &c.opts.AdvantageStd, "the `std` dividing the advantages (default: the one the batch recorded, population when it records none; another is written with a warning on stderr: a trainer's scale changes)")
	fs.BoolVar(&c.opts.AllowBadLogprobs, "allow-bad-logprobs", false, "write samples whose logprobs came null, NaN, infinite or not one per token id instead of failing: they get response_logprobs null and the defect in their warnings")
	setUsage(fs, `Usage: legato rl export DIR --out FILE [--inline-images] [--drop-constant-groups]
       [--allow-missing-logprobs] [--allow-bad-logprobs] [--contiguous | --prompt-prefix]
       [--partial-groups] [--image-token-id N] [--advantage-std population|sample]

Writes one training sample per model call of every ok or truncated attempt
of the run directory DIR: the prompt, the response's text, token ids and
logprobs, the reward, and the GRPO advantage within the attempt's group
((reward - mean) / std over its finished attempts, with the std the batch
recorded, population unless collect or serve was given --advantage-std
sample; 0 when the group's rewards are equal).
Each sample lists its prompt's images (sha256, bytes, width, height and
token_span, where the image's tokens are in the prompt ids).
Flags may come before or after DIR.

A group that never ended is left out and counted on stderr: fewer finished
attempts than batch.json's group size while some of its attempts have no
final record, as a collect stopped by a signal or a crash (or a repair that
moved a record aside) leaves it. Its advantages over the attempts it has
would be those of a smaller group; resume the collect to finish it, or
write it anyway with --partial-groups. A group that got its G finished
attempts, or whose every attempt has a final record (errors included),
ended.

It fails, writing nothing, when samples have no logprobs (unless
--allow-missing-logprobs), when the server sent their logprobs null, NaN,
infinite or not one per token id (unless --allow-bad-logprobs), when a line
of rollouts.jsonl other than the last cannot be read (a lost record would
change its group's advantages) and when an attempt has two final records;
'legato rl repair DIR' moves such lines aside. A torn last line, left by a
crash mid-append, is skipped with a warning.

`)
	return fs
}

// Run parses args, writes the samples and reports what it wrote on stdout,
// and a skipped torn last line, groups that never ended (left out, or
// written with --partial-groups) and allowed samples without or with
// broken logprobs on stderr.
func (c *exportCommand) Run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := c.flagSet(stderr)
	dir, err := parseRunDir(fs, args)
	if err != nil {
		return err
	}
	if c.out == "" {
		return usageErrorf("missing --out FILE: name the file to write the samples to")
	}
	c.opts.ImageTokenID = int64(c.imageTokenID)
	if err := schema.CheckOutput(dir, c.out); errors.Is(err, schema.ErrRunFile) {
		return usageErrorf("--out %w", err)
	}
	if c.opts.Contiguous && c.opts.PromptPrefix {
		return usageErrorf("--prompt-prefix shares prompt ids between per-step samples and --contiguous writes one sequence per attempt: pass one of them")
	}
	st, err := export.ExportStepsContext(ctx, dir, c.out, c.opts)
	if err != nil {
		return err
	}
	if st.AdvantageStd != st.RecordedAdvantageStd {
		fmt.Fprintf(stderr, "warning: --advantage-std %s: the advantages are divided by the %s std, not the %s std the batch recorded (%s): they differ from the ones OnGroup or the service gave by a factor of sqrt(n/(n-1)) for groups of n (1.155 at 4), and a trainer's scale changes with them\n",
			st.AdvantageStd, st.AdvantageStd, st.RecordedAdvantageStd, recordedIn(dir))
	}
	if st.TornLines > 0 {
		fmt.Fprintf(stderr, "warning: skipped the torn last line of %s (a crash mid-append; collect runs its attempt again): %v\n",
			filepath.Join(dir, schema.RecordsFile), st.FirstTorn)
	}
	if st.BadLogprobs > 0 {
		fmt.Fprintf(stderr, "warning: wrote %d of %d samples with broken logprobs as samples without logprobs, marked in their warnings (--allow-bad-logprobs)\n", st.BadLogprobs, st.Lines)
	}
	if st.MissingLogprobs > 0 {
		fmt.Fprintf(stderr, "warning: wrote %d of %d samples without logprobs (--allow-missing-logprobs)\n", st.MissingLogprobs, st.Lines)
	}
	fmt.Fprintf(stdout, "wrote %d samples from %d rollouts in %d groups to %s (%s)\n",
		st.Lines, st.Rollouts, st.Groups, c.out, byteSize(st.Bytes))
	if c.opts.DropConstantGroups {
		fmt.Fprintf(stdout, "dropped %d groups with equal rewards (%d samples)\n", st.DroppedGroups, st.DroppedLines)
	}
	if n := len(st.PartialGroups); n > 0 && c.opts.PartialGroups {
		fmt.Fprintf(stdout, "wrote %d groups that never ended (--partial-groups)\n", n)
	} else if n > 0 {
		fmt.Fprintf(stdout, "left out %d groups that never ended (%d samples)\n", n, st.PartialLines)
	}
	writePartialGroups(stderr, st, c.opts.PartialGroups)
	if st.RegradedRewards > 0 {
		fmt.Fprintf(stdout, "took the regraded rewards of %d attempts (%s)\n", st.RegradedRewards, schema.RegradeFile)
	}
	if st.QuarantinedRecords > 0 {
		fmt.Fprintf(stderr, "warning: left out %d records of quarantined tasks (%s); --include-quarantined writes them\n",
			st.QuarantinedRecords, strings.Join(st.QuarantinedTasks, ", "))
	}
	if st.MissingReward > 0 {
		fmt.Fprintf(stderr, "warning: %d finished rollouts have no reward and were left out\n", st.MissingReward)
	}
	return nil
}

// recordedIn names the file a run directory's settings are in: a
// service's journal, or batch.json.
func recordedIn(dir string) string {
	if _, err := os.Stat(filepath.Join(dir, schema.ServiceFile)); err == nil {
		return schema.ServiceFile
	}
	return schema.BatchFile
}

// maxNamedGroups is how many groups the export's report names.
const maxNamedGroups = 5

// writePartialGroups reports the groups that never ended: left out, or
// written (written) with advantages over the attempts they have.
func writePartialGroups(w io.Writer, st export.Stats, written bool) {
	n := len(st.PartialGroups)
	if n == 0 {
		return
	}
	names := strings.Join(st.PartialGroups[:min(n, maxNamedGroups)], ", ")
	if n > maxNamedGroups {
		names += ", …"
	}
	if written {
		fmt.Fprintf(w, "warning: wrote %d groups that never ended, with advantages over the attempts they have (--partial-groups): %s\n", n, names)
		return
	}
	fmt.Fprintf(w, "warning: %d groups left out: not closed, fewer than %d finished attempts and some attempts without a final record (a collect stopped or crashed; resume it to finish them); --partial-groups writes them (%d samples): %s\n",
		n, st.GroupSize, st.PartialLines, names)
}

// byteSize formats n bytes for people.
func byteSize(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}
