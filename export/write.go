package export

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"runtime"
	"slices"

	"golang.org/x/sync/errgroup"

	"legato/rl/schema"
)

// This file writes the output file: in one pass with the advantages
// written over placeholders at the end, or in two; the content store an
// export reads prompts through; the pipeline whose workers encode records'
// lines for a writer that keeps the file's order; and the line writer
// (sample_json.go encodes a line's pieces).

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
// requests' hashes but the last step's, whose messages hold the
// sequence's images.
func readOptions(opts Options) schema.ReadOptions {
	// The writers copy logprobs from the records' text; writeRecord
	// parses the values of a record whose text does not hold them all.
	return schema.ReadOptions{NoRequests: opts.Contiguous, LastRequest: opts.Contiguous, LazyLogprobs: copyLogprobText}
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
				if opts.Contiguous && i < len(rec.Steps)-1 {
					continue // a sequence's images are in its last prompt
				}
				for _, h := range rec.Steps[i].Request {
					if _, ok := seen[h]; !ok {
						seen[h] = struct{}{}
						if opts.InlineImages && !opts.Contiguous {
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
	if opts.Contiguous {
		return writeSequence(rec, text, adv, sw, store, opts)
	}
	return writeStepSamples(rec, text, adv, sw, store, opts)
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

// copyLogprobText lets the writers copy logprobs from the records' text
// (schema.RecordText); a test turns it off to compare.
var copyLogprobText = true

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
	// images lists the images of the attempt being written.
	images *imageLister
}

// imageLister returns sw's lister of images, reset for a new attempt.
func (sw *sampleWriter) imageLister(store *schema.MessageStore, opts Options) *imageLister {
	if sw.images == nil {
		sw.images = newImageLister(store, opts.ImageTokenID)
	}
	sw.images.reset()
	return sw.images
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
