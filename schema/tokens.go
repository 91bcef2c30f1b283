package schema

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strconv"
)

// TokenChunk is the most token ids a chunk of a stored prompt holds (see
// Run.PutTokenIDs). It keeps a prompt that changes early (an evicted
// screenshot), after which every later chunk is new, cheap to store again.
const TokenChunk = 4096

// PutTokenIDs stores the token ids of one prompt in the run's content
// store and returns the hashes of its chunks, in order, for
// Step.PromptTokenChunks; nil for no ids. The steps of an attempt store
// theirs through one TokenWriter instead, which shares each prompt's
// chunks with the next. MessageStore.PromptTokenIDs rebuilds the ids.
func (r *Run) PutTokenIDs(ids []int64) ([]string, error) {
	return r.NewTokenWriter().Put(ids)
}

// A TokenWriter stores the prompt token ids of the successive steps of one
// attempt, cut as PromptChunker cuts them:
//
//	tokens/pack-<n>    entries of zstd frames of chunks' content (see PromptChunk, packWriter)
//
// so a step stores about the ids its prompt added, not the whole prompt
// again. Like PutMessages, new chunks are synced by the next Append. A
// TokenWriter is used by one goroutine at a time.
type TokenWriter struct {
	r *Run
	c PromptChunker
}

// NewTokenWriter returns a writer for the prompts of one attempt.
func (r *Run) NewTokenWriter() *TokenWriter { return &TokenWriter{r: r} }

// Put stores the ids of the attempt's next prompt and returns its chunk
// hashes; nil for no ids.
func (w *TokenWriter) Put(ids []int64) ([]string, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	r := w.r
	r.life.RLock()
	defer r.life.RUnlock()
	if r.closed {
		return nil, ErrClosed
	}
	chunks := w.c.Cut(ids)
	hashes := make([]string, len(chunks))
	for i, c := range chunks {
		if c.Content != nil {
			if err := r.putTokenChunk(c); err != nil {
				// The next prompt must not count on a chunk that is not
				// stored.
				w.c = PromptChunker{}
				return nil, fmt.Errorf("put token ids: chunk %d: %w", i, err)
			}
		}
		hashes[i] = c.Hash
	}
	return hashes, nil
}

func (r *Run) putTokenChunk(c PromptChunk) error {
	if _, ok := r.toks.Load(c.sum); ok {
		return nil
	}
	_, err, _ := r.flight.Do("t"+c.Hash, func() (any, error) {
		if _, ok := r.toks.Load(c.sum); ok {
			return nil, nil
		}
		if err := r.tokPack.put(c.sum, r.enc.EncodeAll(c.Content, nil)); err != nil {
			return nil, err
		}
		r.toks.Store(c.sum, struct{}{})
		return nil, nil
	})
	if err != nil {
		return &ObjectError{Op: "put", Kind: "token chunk", Hash: c.Hash, Err: err}
	}
	return nil
}

// A PromptChunker cuts the successive prompts of one attempt into chunks.
// A prompt keeps every chunk of the previous one that it starts with, in
// order, and cuts the ids after them into chunks of TokenChunk ids, the
// last one shorter. An attempt whose prompts grow by appending (a reply and
// the next screenshot) stores each id once; the siblings of a group, whose
// first prompts are equal, share that prompt's chunks; a prompt that
// changes early stores its ids from the change on again.
//
// PromptChunker does no I/O: Run's TokenWriter stores what it cuts, and a
// program writing a run directory itself can use it to lay chunks out as
// legato does. The zero value is ready; use one per attempt.
type PromptChunker struct {
	prev []PromptChunk // the previous prompt's chunks, without content
}

// A PromptChunk is one chunk of a prompt's token ids. Its content, the
// bytes stored (zstd-compressed) under its hash, is binary:
//
//	"LTK4" or "LTK8"   magic: ids of 4 bytes, or of 8 where one does not fit
//	uint64             the index of the chunk's first id in its prompt
//	ids                little-endian: uint32, or int64
//
// The hash is the sha256 (hex) of the content, what the chunk's pack entry
// is keyed by (a file's name, in runs written before packs). The index makes a chunk
// out of place (dropped, repeated or swapped in a record) an error when
// read, since chunks no longer all hold TokenChunk ids. Runs written
// before this format hold chunks of the canonical JSON of the ids
// ([151644,8948,…], each chunk but the last TokenChunk ids); readers take
// both.
type PromptChunk struct {
	Hash string
	// Content is what to store under Hash; nil for a chunk the previous
	// prompt had, which is stored already.
	Content []byte
	sum     [32]byte
	n       int // ids in the chunk
}

// Cut returns the chunks of ids, the attempt's next prompt.
func (c *PromptChunker) Cut(ids []int64) []PromptChunk {
	out := make([]PromptChunk, 0, len(c.prev)+(len(ids)+TokenChunk-1)/TokenChunk)
	off := 0
	for _, p := range c.prev {
		if off+p.n > len(ids) || sha256.Sum256(encodeTokenChunk(off, ids[off:off+p.n])) != p.sum {
			break
		}
		out = append(out, p)
		off += p.n
	}
	for off < len(ids) {
		n := min(TokenChunk, len(ids)-off)
		content := encodeTokenChunk(off, ids[off:off+n])
		sum := sha256.Sum256(content)
		out = append(out, PromptChunk{Hash: hex.EncodeToString(sum[:]), Content: content, sum: sum, n: n})
		off += n
	}
	c.prev = make([]PromptChunk, len(out))
	for i, p := range out {
		p.Content = nil
		c.prev[i] = p
	}
	return out
}

// Token chunk magics: the width of the ids that follow.
const (
	tokMagic4   = "LTK4"
	tokMagic8   = "LTK8"
	tokHeader   = 4 + 8
	tokMaxIndex = 1 << 40 // far past any prompt; bounds a corrupt index
)

// encodeTokenChunk returns the content of the chunk holding ids, which
// start at index off of their prompt.
func encodeTokenChunk(off int, ids []int64) []byte {
	wide := false
	for _, id := range ids {
		if id < 0 || id > math.MaxUint32 {
			wide = true
			break
		}
	}
	magic, width := tokMagic4, 4
	if wide {
		magic, width = tokMagic8, 8
	}
	b := make([]byte, tokHeader, tokHeader+width*len(ids))
	copy(b, magic)
	binary.LittleEndian.PutUint64(b[4:], uint64(off))
	for _, id := range ids {
		if wide {
			b = binary.LittleEndian.AppendUint64(b, uint64(id))
		} else {
			b = binary.LittleEndian.AppendUint32(b, uint32(id))
		}
	}
	return b
}

// decodeTokenChunk reads a chunk's content in either format; off is the
// chunk's index in its prompt, -1 for a JSON chunk, which has none.
func decodeTokenChunk(b []byte) (ids []int64, off int, err error) {
	if len(b) >= 4 && (string(b[:4]) == tokMagic4 || string(b[:4]) == tokMagic8) {
		width := 4
		if string(b[:4]) == tokMagic8 {
			width = 8
		}
		if len(b) < tokHeader || (len(b)-tokHeader)%width != 0 {
			return nil, 0, fmt.Errorf("%w: %d bytes, not a header and whole ids of %d bytes", ErrCorrupt, len(b), width)
		}
		index := binary.LittleEndian.Uint64(b[4:])
		n := (len(b) - tokHeader) / width
		if index > tokMaxIndex || n == 0 || n > TokenChunk {
			return nil, 0, fmt.Errorf("%w: a chunk of %d ids at index %d", ErrCorrupt, n, index)
		}
		ids = make([]int64, n)
		body := b[tokHeader:]
		if width == 4 {
			for i := range ids {
				ids[i] = int64(binary.LittleEndian.Uint32(body[4*i:]))
			}
		} else {
			for i := range ids {
				ids[i] = int64(binary.LittleEndian.Uint64(body[8*i:]))
			}
		}
		return ids, int(index), nil
	}
	if ids, ok := parseCanonicalIDs(b); ok {
		return ids, -1, nil
	}
	// Valid JSON of another shape (spaces, a "+" or "1e3" that the hash
	// still vouches for): the decoder says whether it is ids.
	if err := json.Unmarshal(b, &ids); err != nil {
		return nil, 0, fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	return ids, -1, nil
}

// AppendTokenIDs appends ids to b as the JSON array encoding/json writes
// for a non-nil []int64 ([] when empty), without its reflection.
func AppendTokenIDs(b []byte, ids []int64) []byte {
	b = append(b, '[')
	b = appendIDList(b, ids, false)
	return append(b, ']')
}

// AppendTokenIDChunks appends the ids of chunks, in order, as one JSON
// array, as AppendTokenIDs appends them joined: [1,2]+[3] → [1,2,3].
func AppendTokenIDChunks(b []byte, chunks [][]int64) []byte {
	b = append(b, '[')
	comma := false
	for _, c := range chunks {
		b = appendIDList(b, c, comma)
		comma = comma || len(c) > 0
	}
	return append(b, ']')
}

// appendIDList appends ids separated by commas, and one before them when
// comma is set. Token ids are most of an export's bytes and below 10^8
// (vocabularies hold about 10^5): those are written two digits at a time
// into room grown once, in 0.6 of a strconv.AppendInt loop's time
// (BenchmarkAppendTokenIDs); any other goes through strconv.
func appendIDList(b []byte, ids []int64, comma bool) []byte {
	b = slices.Grow(b, 9*len(ids))
	n := len(b)
	b = b[:cap(b)]
	for i, id := range ids {
		if i > 0 || comma {
			b[n] = ','
			n++
		}
		if uint64(id) >= 1e8 {
			b = strconv.AppendInt(b[:n], id, 10)
			n = len(b)
			b = slices.Grow(b, 9*(len(ids)-i))
			b = b[:cap(b)]
			continue
		}
		n = putSmall(b, n, uint32(id))
	}
	return b[:n]
}

// digitPairs holds "00" to "99".
const digitPairs = "0001020304050607080910111213141516171819" +
	"2021222324252627282930313233343536373839" +
	"4041424344454647484950515253545556575859" +
	"6061626364656667686970717273747576777879" +
	"8081828384858687888990919293949596979899"

// putSmall writes the decimal digits of u < 10^8 at b[n:], which has room,
// and returns the index after them. Counting the digits first lets them go
// straight to their places: writing them into a scratch array and copying
// that took 1.4 to 1.8 times as long (BenchmarkAppendTokenIDs).
func putSmall(b []byte, n int, u uint32) int {
	digits := 1
	switch {
	case u >= 1e7:
		digits = 8
	case u >= 1e6:
		digits = 7
	case u >= 1e5:
		digits = 6
	case u >= 1e4:
		digits = 5
	case u >= 1e3:
		digits = 4
	case u >= 100:
		digits = 3
	case u >= 10:
		digits = 2
	}
	end := n + digits
	i := end
	for u >= 100 {
		q := u / 100
		r := (u - q*100) * 2
		i -= 2
		b[i], b[i+1] = digitPairs[r], digitPairs[r+1]
		u = q
	}
	if u >= 10 {
		b[i-2], b[i-1] = digitPairs[2*u], digitPairs[2*u+1]
	} else {
		b[i-1] = byte('0' + u)
	}
	return end
}

// LoadPromptTokenIDs rebuilds the prompt token ids of step from the content
// store of the run directory runDir; nil when the step has none (the server
// did not return them). To load many steps, use one MessageStore.
func LoadPromptTokenIDs(runDir string, step Step) ([]int64, error) {
	s, err := OpenMessageStore(runDir, StoreOptions{})
	if err != nil {
		return nil, err
	}
	defer s.Close()
	return s.PromptTokenIDs(step)
}

// PromptTokenIDs rebuilds the prompt token ids of step; nil when the step
// has none. The result is the caller's.
func (s *MessageStore) PromptTokenIDs(step Step) ([]int64, error) {
	chunks, n, err := s.PromptTokenIDChunks(step)
	if err != nil || chunks == nil {
		return nil, err
	}
	out := make([]int64, 0, n)
	for _, c := range chunks {
		out = append(out, c...)
	}
	return out, nil
}

// PromptTokenIDChunks returns the prompt token ids of step as its chunks'
// ids, in order, and how many there are; nil when the step has none. The
// slices are shared with the store's cache and must not be modified: a
// writer appending them saves copying each prompt into one slice first.
func (s *MessageStore) PromptTokenIDChunks(step Step) ([][]int64, int, error) {
	return s.PromptTokenIDChunksAfter(step, Step{}, nil)
}

// PromptTokenIDChunksAfter is PromptTokenIDChunks for a step whose prompt
// starts with chunks of the prompt of prev, an earlier step, as
// PromptTokenIDChunks returned them (prevChunks): those shared leading
// chunks (equal hashes) come from prevChunks, not the store. A writer
// going through an attempt's steps loads each chunk once this way, not
// once per step that holds it.
func (s *MessageStore) PromptTokenIDChunksAfter(step, prev Step, prevChunks [][]int64) ([][]int64, int, error) {
	if len(step.PromptTokenChunks) == 0 {
		return nil, 0, nil
	}
	s.life.RLock()
	defer s.life.RUnlock()
	if s.closed {
		return nil, 0, ErrClosed
	}
	out := make([][]int64, 0, len(step.PromptTokenChunks))
	n := 0
	for i, h := range step.PromptTokenChunks {
		last, prevLast := i == len(step.PromptTokenChunks)-1, i == len(prev.PromptTokenChunks)-1
		if i < len(prevChunks) && i < len(prev.PromptTokenChunks) && prev.PromptTokenChunks[i] == h && (last || !prevLast) {
			// The same chunk at the same place after the same chunks:
			// checked as this one would be where prev loaded it (a last
			// chunk is checked less).
			out = append(out, prevChunks[i])
			n += len(prevChunks[i])
			continue
		}
		prevChunks = nil // past the shared ones
		c, err := s.tokenChunk(h)
		if err != nil {
			return nil, 0, fmt.Errorf("load prompt token ids: chunk %d: %w", i, err)
		}
		misplaced := ""
		switch {
		case c.index >= 0 && c.index != n:
			misplaced = fmt.Sprintf("it starts at id %d of its prompt, but the chunks before it hold %d", c.index, n)
		case c.index < 0 && i < len(step.PromptTokenChunks)-1 && len(c.ids) != TokenChunk:
			// A JSON chunk (an older run's) holds TokenChunk ids unless it
			// is the last; anything else would shift every later id.
			misplaced = fmt.Sprintf("%d ids in a chunk that is not the last, want %d", len(c.ids), TokenChunk)
		}
		if misplaced != "" {
			return nil, 0, fmt.Errorf("load prompt token ids: chunk %d: %w", i, &ObjectError{Op: "load", Kind: "token chunk", Hash: h,
				Err: fmt.Errorf("%w: %s", ErrCorrupt, misplaced)})
		}
		out = append(out, c.ids)
		n += len(c.ids)
	}
	if step.PromptTokenCount > 0 && n != step.PromptTokenCount {
		return nil, 0, fmt.Errorf("load prompt token ids: %w: its chunks hold %d ids, the step says %d", ErrCorrupt, n, step.PromptTokenCount)
	}
	return out, n, nil
}

// storedChunk is a token chunk as read: its ids and their index in the
// prompt, -1 for a JSON chunk.
type storedChunk struct {
	ids   []int64
	index int
}

// tokenChunk returns a stored chunk; its ids are shared with the cache and
// must not be modified.
func (s *MessageStore) tokenChunk(hash string) (storedChunk, error) {
	sum, err := parseHash(hash)
	if err != nil {
		return storedChunk{}, &ObjectError{Op: "load", Kind: "token chunk", Err: err}
	}
	if c, ok := s.toks.get(sum); ok {
		return c, nil
	}
	c, err := s.readTokenChunk(hash, sum)
	if err != nil {
		return storedChunk{}, &ObjectError{Op: "load", Kind: "token chunk", Hash: hash, Err: err}
	}
	s.toks.put(sum, c, int64(8*len(c.ids)))
	return c, nil
}

func (s *MessageStore) readTokenChunk(hash string, sum [32]byte) (storedChunk, error) {
	scratch := getScratch()
	defer putScratch(scratch)
	b, err := readObject(s.tokPacks, s.tokDir, hash, sum, scratch.stored[:0])
	scratch.stored = b
	if err != nil {
		return storedChunk{}, err
	}
	// decodeTokenChunk copies the ids out of content.
	content, err := s.dec.DecodeAll(b, scratch.content[:0])
	scratch.content = content
	if err != nil {
		return storedChunk{}, fmt.Errorf("%w: zstd: %v", ErrCorrupt, err)
	}
	if sha256.Sum256(content) != sum {
		return storedChunk{}, fmt.Errorf("%w: content does not match its hash", ErrCorrupt)
	}
	ids, index, err := decodeTokenChunk(content)
	if err != nil {
		return storedChunk{}, err
	}
	return storedChunk{ids, index}, nil
}

// parseCanonicalIDs parses what canonicalIDs writes, an order of magnitude
// faster than encoding/json (whose reflection was half of an export's
// CPU); ok is false for anything else, which the caller hands to
// encoding/json.
func parseCanonicalIDs(b []byte) (ids []int64, ok bool) {
	if len(b) < 2 || b[0] != '[' || b[len(b)-1] != ']' {
		return nil, false
	}
	b = b[1 : len(b)-1]
	if len(b) == 0 {
		return []int64{}, true
	}
	ids = make([]int64, 0, len(b)/5+1)
	for len(b) > 0 {
		neg := b[0] == '-'
		if neg {
			b = b[1:]
		}
		n, digits := int64(0), 0
		for digits < len(b) && b[digits] >= '0' && b[digits] <= '9' {
			d := int64(b[digits] - '0')
			// Past int64 (or a leading zero, not canonical): let the
			// decoder judge.
			if n > (math.MaxInt64-d)/10 || (digits == 1 && n == 0) {
				return nil, false
			}
			n = n*10 + d
			digits++
		}
		if digits == 0 {
			return nil, false
		}
		if neg {
			n = -n
		}
		ids = append(ids, n)
		b = b[digits:]
		if len(b) > 0 {
			if b[0] != ',' || len(b) == 1 {
				return nil, false
			}
			b = b[1:]
		}
	}
	return ids, true
}
