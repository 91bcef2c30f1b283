package schema

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
)

// TokenChunk is the number of token ids per chunk of a stored prompt (see
// Run.PutTokenIDs). Consecutive prompts of an attempt share all but their
// last chunks, so a step stores about one chunk of new ids; a chunk is also
// small enough to cost little when a prompt changes early (an evicted
// screenshot) and every later chunk is new.
const TokenChunk = 4096

// PutTokenIDs stores the token ids of a prompt in the run's content store
// and returns the hashes of its chunks, in order, for
// Step.PromptTokenChunks; nil for no ids. MessageStore.PromptTokenIDs
// rebuilds the ids.
//
// The ids are cut into chunks of TokenChunk ids from the start, the last
// one shorter:
//
//	tokens/<sha256>    zstd frame of the chunk's canonical JSON: [151644,8948,…]
//
// The hash of a chunk is the sha256 (hex) of its canonical JSON
// (encoding/json.Marshal of the []int64). A prompt that extends the
// previous one (the next step of an attempt, a sibling of its group) shares
// every full chunk with it, so they are stored once and cost a hash and no
// disk access. Like PutMessages, new chunks are synced by the next Append.
func (r *Run) PutTokenIDs(ids []int64) ([]string, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	r.life.RLock()
	defer r.life.RUnlock()
	if r.closed {
		return nil, ErrClosed
	}
	hashes := make([]string, 0, (len(ids)+TokenChunk-1)/TokenChunk)
	for start := 0; start < len(ids); start += TokenChunk {
		h, err := r.putTokenChunk(ids[start:min(start+TokenChunk, len(ids))])
		if err != nil {
			return nil, fmt.Errorf("put token ids: chunk %d: %w", len(hashes), err)
		}
		hashes = append(hashes, h)
	}
	return hashes, nil
}

func (r *Run) putTokenChunk(ids []int64) (string, error) {
	canon := canonicalIDs(ids)
	sum := sha256.Sum256(canon)
	h := hex.EncodeToString(sum[:])
	if _, ok := r.toks.Load(sum); ok {
		return h, nil
	}
	_, err, _ := r.flight.Do("t"+h, func() (any, error) {
		if _, ok := r.toks.Load(sum); ok {
			return nil, nil
		}
		if err := r.writeObject(r.tokDir, h, storedObject{&r.toks, sum}, r.enc.EncodeAll(canon, nil)); err != nil {
			return nil, err
		}
		r.toks.Store(sum, struct{}{})
		return nil, nil
	})
	if err != nil {
		return "", &ObjectError{Op: "put", Kind: "token chunk", Hash: h, Err: err}
	}
	return h, nil
}

// canonicalIDs is json.Marshal of ids, without its reflection: a prompt
// of 20 screenshots is tens of thousands of ids per step.
func canonicalIDs(ids []int64) []byte {
	return AppendTokenIDs(make([]byte, 0, 2+7*len(ids)), ids)
}

// AppendTokenIDs appends ids to b as the JSON array encoding/json writes
// for a non-nil []int64 ([] when empty), without its reflection.
func AppendTokenIDs(b []byte, ids []int64) []byte {
	b = append(b, '[')
	for i, id := range ids {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, id, 10)
	}
	return append(b, ']')
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
	if len(step.PromptTokenChunks) == 0 {
		return nil, nil
	}
	s.life.RLock()
	defer s.life.RUnlock()
	if s.closed {
		return nil, ErrClosed
	}
	var out []int64
	for i, h := range step.PromptTokenChunks {
		ids, err := s.tokenChunk(h)
		if err != nil {
			return nil, fmt.Errorf("load prompt token ids: chunk %d: %w", i, err)
		}
		if i < len(step.PromptTokenChunks)-1 && len(ids) != TokenChunk {
			// Only the last chunk may be short; anything else would shift
			// every later id without an error.
			return nil, fmt.Errorf("load prompt token ids: chunk %d: %w", i, &ObjectError{Op: "load", Kind: "token chunk", Hash: h,
				Err: fmt.Errorf("%w: %d ids in a chunk that is not the last, want %d", ErrCorrupt, len(ids), TokenChunk)})
		}
		if out == nil {
			out = make([]int64, 0, len(step.PromptTokenChunks)*TokenChunk)
		}
		out = append(out, ids...)
	}
	return out, nil
}

// tokenChunk returns a stored chunk; the slice is shared with the cache and
// must not be modified.
func (s *MessageStore) tokenChunk(hash string) ([]int64, error) {
	sum, err := parseHash(hash)
	if err != nil {
		return nil, &ObjectError{Op: "load", Kind: "token chunk", Err: err}
	}
	if ids, ok := s.toks.get(sum); ok {
		return ids, nil
	}
	ids, err := s.readTokenChunk(hash, sum)
	if err != nil {
		return nil, &ObjectError{Op: "load", Kind: "token chunk", Hash: hash, Err: err}
	}
	s.toks.put(sum, ids, int64(8*len(ids)))
	return ids, nil
}

func (s *MessageStore) readTokenChunk(hash string, sum [32]byte) ([]int64, error) {
	b, err := os.ReadFile(filepath.Join(s.tokDir, hash))
	if err != nil {
		return nil, notFound(err)
	}
	canon, err := s.dec.DecodeAll(b, nil)
	if err != nil {
		return nil, fmt.Errorf("%w: zstd: %v", ErrCorrupt, err)
	}
	if sha256.Sum256(canon) != sum {
		return nil, fmt.Errorf("%w: content does not match its hash", ErrCorrupt)
	}
	if ids, ok := parseCanonicalIDs(canon); ok {
		return ids, nil
	}
	// Valid JSON of another shape (spaces, a "+" or "1e3" that the hash
	// still vouches for): the decoder says whether it is ids.
	var ids []int64
	if err := json.Unmarshal(canon, &ids); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	return ids, nil
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
