package schema

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"math"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/klauspost/compress/zstd"
)

// promptIDs returns n ids shaped like a Qwen-VL prompt: text ids with runs
// of the image pad id.
func promptIDs(n int, seed uint64) []int64 {
	rng := rand.New(rand.NewPCG(seed, 7))
	ids := make([]int64, n)
	for i := range ids {
		if (i/300)%2 == 1 {
			ids[i] = 151655
		} else {
			ids[i] = rng.Int64N(151643)
		}
	}
	return ids
}

func TestPutTokenIDsRoundTrip(t *testing.T) {
	sizes := []int{0, 1, TokenChunk - 1, TokenChunk, TokenChunk + 1, 3*TokenChunk + 5}
	dir := t.TempDir()
	r := mustCreate(t, dir)
	type stored struct {
		ids    []int64
		chunks []string
	}
	var all []stored
	for i, n := range sizes {
		ids := promptIDs(n, uint64(i))
		if n > 1 {
			// Ids are whatever the server sent: keep the extremes exact.
			ids[0], ids[n-1] = math.MinInt64, math.MaxInt64
		}
		chunks, err := r.PutTokenIDs(ids)
		if err != nil {
			t.Fatalf("%d ids: %v", n, err)
		}
		if want := (n + TokenChunk - 1) / TokenChunk; len(chunks) != want {
			t.Errorf("%d ids: %d chunks, want %d", n, len(chunks), want)
		}
		all = append(all, stored{ids, chunks})
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	s, err := OpenMessageStore(dir, StoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, st := range all {
		got, err := s.PromptTokenIDs(Step{PromptTokenChunks: st.chunks})
		if err != nil {
			t.Fatalf("%d ids: %v", len(st.ids), err)
		}
		want := st.ids
		if len(want) == 0 {
			want = nil
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("%d ids: loaded (-want +got):\n%s", len(st.ids), diff)
		}
		// Each chunk is the documented format: zstd of a header (magic,
		// the index of its first id) and the ids, little-endian, named
		// by the sha256 of that content.
		at := 0
		for _, h := range st.chunks {
			content := chunkContent(t, dir, h)
			if sum := sha256.Sum256(content); hex.EncodeToString(sum[:]) != h {
				t.Errorf("chunk named %s holds content hashing to %x", h, sum)
			}
			got, index := parseChunkByHand(t, content)
			if index != at {
				t.Errorf("chunk %s starts at id %d, want %d", h, index, at)
			}
			if !slices.Equal(got, st.ids[at:at+len(got)]) {
				t.Errorf("chunk %s does not hold ids %d..%d", h, at, at+len(got))
			}
			at += len(got)
		}
	}
}

// chunkContent is the uncompressed content of the stored token chunk h.
func chunkContent(t *testing.T, dir, h string) []byte {
	t.Helper()
	b, ok := objectsIn(t, filepath.Join(dir, TokensDir))[h]
	if !ok {
		t.Fatalf("token chunk %s is not stored", h)
	}
	dec, _ := zstd.NewReader(nil)
	defer dec.Close()
	content, err := dec.DecodeAll(b, nil)
	if err != nil {
		t.Fatal(err)
	}
	return content
}

// parseChunkByHand reads a chunk's content as PromptChunk documents it,
// without the package's decoder.
func parseChunkByHand(t *testing.T, b []byte) (ids []int64, index int) {
	t.Helper()
	if len(b) < 12 {
		t.Fatalf("chunk of %d bytes", len(b))
	}
	index = int(binary.LittleEndian.Uint64(b[4:12]))
	switch body := b[12:]; string(b[:4]) {
	case "LTK4":
		for i := 0; i+4 <= len(body); i += 4 {
			ids = append(ids, int64(binary.LittleEndian.Uint32(body[i:])))
		}
	case "LTK8":
		for i := 0; i+8 <= len(body); i += 8 {
			ids = append(ids, int64(binary.LittleEndian.Uint64(body[i:])))
		}
	default:
		t.Fatalf("chunk magic %q", b[:4])
	}
	return ids, index
}

// TestTokenWriterSharesChunks: the prompts of an attempt keep the chunks
// of the one before that they start with, so an attempt whose prompts grow
// stores each id once; a prompt that changes early stores from the change
// on; siblings share their equal first prompts.
func TestTokenWriterSharesChunks(t *testing.T) {
	dir := t.TempDir()
	r := mustCreate(t, dir)
	w := r.NewTokenWriter()
	base := promptIDs(5*TokenChunk/2, 1)
	first, err := w.Put(base)
	if err != nil {
		t.Fatal(err)
	}
	if len(first) != 3 {
		t.Fatalf("%d chunks for %d ids, want 3", len(first), len(base))
	}
	longer := append(slices.Clone(base), promptIDs(TokenChunk, 2)...)
	second, err := w.Put(longer)
	if err != nil {
		t.Fatal(err)
	}
	// All three, the short last one too, then the new ids in a chunk of
	// TokenChunk (the last one empty).
	if len(second) != 4 || !slices.Equal(first, second[:3]) {
		t.Errorf("chunks of a prompt extending the one before: %v, want %v and one more", second, first)
	}
	if got := len(objectHashes(t, filepath.Join(dir, TokensDir))); got != 4 {
		t.Errorf("%d chunks stored after two prompts, want 4", got)
	}
	// The same prompt again stores nothing and names the same chunks.
	again, err := w.Put(longer)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(second, again); diff != "" {
		t.Errorf("the same prompt again got other chunks (-first +second):\n%s", diff)
	}
	// A prompt changed in its second chunk keeps the first only.
	changed := slices.Clone(longer)
	changed[TokenChunk+5]++
	third, err := w.Put(changed)
	if err != nil {
		t.Fatal(err)
	}
	if third[0] != second[0] || slices.Contains(third[1:], second[1]) || len(third) != 4 {
		t.Errorf("a prompt changed at id %d: chunks %v, want the first of %v and 3 new ones (cut from the change on)", TokenChunk+5, third, second)
	}
	// A sibling's writer, starting from the same first prompt, names the
	// same chunks and writes none.
	before := entryCount(t, filepath.Join(dir, TokensDir))
	sib, err := r.NewTokenWriter().Put(base)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(sib, first) || entryCount(t, filepath.Join(dir, TokensDir)) != before {
		t.Errorf("a sibling's first prompt: chunks %v, want %v with no new file", sib, first)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	s, err := OpenMessageStore(dir, StoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, c := range []struct {
		ids    []int64
		chunks []string
	}{{base, first}, {longer, second}, {changed, third}} {
		got, err := s.PromptTokenIDs(Step{PromptTokenChunks: c.chunks, PromptTokenCount: len(c.ids)})
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, c.ids) {
			t.Errorf("loaded %d ids, not the %d stored", len(got), len(c.ids))
		}
	}
}

// TestPromptChunkerStoresIdsOnce: over an attempt of 15 growing prompts the
// chunks hold each id once, where fixed cuts from the start rewrote the
// last, partial chunk at every step.
func TestPromptChunkerStoresIdsOnce(t *testing.T) {
	var c PromptChunker
	seen := map[string]bool{}
	stored, final := 0, 0
	prompt := promptIDs(2000, 5)
	for step := range 15 {
		prompt = append(prompt, promptIDs(1300, uint64(10+step))...)
		for _, ch := range c.Cut(prompt) {
			if ch.Content != nil && !seen[ch.Hash] {
				seen[ch.Hash] = true
				stored += (len(ch.Content) - 12) / 4
			}
		}
		final = len(prompt)
	}
	if stored != final {
		t.Errorf("chunks hold %d ids for a last prompt of %d", stored, final)
	}
}

func TestPromptTokenIDsErrors(t *testing.T) {
	tests := []struct {
		name    string
		damage  func(t *testing.T, dir string, chunks []string) []string
		wantErr error
	}{
		{"malformed hash", func(_ *testing.T, _ string, c []string) []string { return []string{c[0], "../rollouts.jsonl"} }, ErrBadHash},
		{"missing chunk", func(_ *testing.T, _ string, c []string) []string { return []string{strings.Repeat("a", 64)} }, ErrNotFound},
		{"chunk swapped for another", func(t *testing.T, dir string, c []string) []string {
			other := objectsIn(t, filepath.Join(dir, TokensDir))[c[1]]
			rewriteObject(t, filepath.Join(dir, TokensDir), c[0], other)
			return c
		}, ErrCorrupt},
		{"not zstd", func(t *testing.T, dir string, c []string) []string {
			rewriteObject(t, filepath.Join(dir, TokensDir), c[0], []byte("[1,2,3]"))
			return c
		}, ErrCorrupt},
		// A chunk out of place would shift every later id.
		{"chunks swapped", func(_ *testing.T, _ string, c []string) []string { return []string{c[1], c[0]} }, ErrCorrupt},
		{"chunk repeated", func(_ *testing.T, _ string, c []string) []string { return []string{c[0], c[0], c[1]} }, ErrCorrupt},
		{"header cut", func(t *testing.T, dir string, c []string) []string {
			return []string{putRawChunk(t, dir, []byte("LTK4\x00\x00"))}
		}, ErrCorrupt},
		{"half an id", func(t *testing.T, dir string, c []string) []string {
			return []string{putRawChunk(t, dir, []byte("LTK4\x00\x00\x00\x00\x00\x00\x00\x00\x01\x02"))}
		}, ErrCorrupt},
		{"no ids", func(t *testing.T, dir string, c []string) []string {
			return []string{putRawChunk(t, dir, []byte("LTK8\x00\x00\x00\x00\x00\x00\x00\x00"))}
		}, ErrCorrupt},
		// An older run's JSON chunks: each but the last holds TokenChunk
		// ids.
		{"short JSON chunk before the last", func(t *testing.T, dir string, c []string) []string {
			return []string{putRawChunk(t, dir, []byte("[1,2]")), putRawChunk(t, dir, []byte("[3]"))}
		}, ErrCorrupt},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			r := mustCreate(t, dir)
			chunks, err := r.PutTokenIDs(promptIDs(TokenChunk+10, 3))
			if err != nil {
				t.Fatal(err)
			}
			if err := r.Close(); err != nil {
				t.Fatal(err)
			}
			step := Step{PromptTokenChunks: tt.damage(t, dir, chunks)}
			ids, err := LoadPromptTokenIDs(dir, step)
			if !errors.Is(err, tt.wantErr) || ids != nil {
				t.Errorf("LoadPromptTokenIDs = %d ids, %v; want %v", len(ids), err, tt.wantErr)
			}
			var oe *ObjectError
			if !errors.As(err, &oe) || oe.Kind != "token chunk" {
				t.Errorf("error %v does not say which token chunk", err)
			}
		})
	}
}

// putRawChunk stores content as a token chunk, compressed and named as the
// store names chunks, and returns its hash.
func putRawChunk(t *testing.T, dir string, content []byte) string {
	t.Helper()
	enc, _ := zstd.NewWriter(nil)
	defer enc.Close()
	sum := sha256.Sum256(content)
	h := hex.EncodeToString(sum[:])
	writeFile(t, filepath.Join(dir, TokensDir, h), enc.EncodeAll(content, nil))
	return h
}

// TestPromptTokenCount: a step's count catches chunks dropped from the end
// of its list, which no chunk's index can.
func TestPromptTokenCount(t *testing.T) {
	dir := t.TempDir()
	r := mustCreate(t, dir)
	ids := promptIDs(2*TokenChunk+10, 4)
	chunks, err := r.PutTokenIDs(ids)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if got, err := LoadPromptTokenIDs(dir, Step{PromptTokenChunks: chunks, PromptTokenCount: len(ids)}); err != nil || !slices.Equal(got, ids) {
		t.Fatalf("whole list: %d ids, %v", len(got), err)
	}
	got, err := LoadPromptTokenIDs(dir, Step{PromptTokenChunks: chunks[:2], PromptTokenCount: len(ids)})
	if !errors.Is(err, ErrCorrupt) || got != nil {
		t.Errorf("the last chunk dropped: %d ids, %v; want ErrCorrupt", len(got), err)
	}
}

// TestJSONTokenChunks: chunks of an older run, canonical JSON each holding
// TokenChunk ids but the last, still load.
func TestJSONTokenChunks(t *testing.T) {
	dir := t.TempDir()
	r := mustCreate(t, dir)
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	ids := promptIDs(TokenChunk+7, 8)
	chunks := []string{
		putRawChunk(t, dir, AppendTokenIDs(nil, ids[:TokenChunk])),
		putRawChunk(t, dir, AppendTokenIDs(nil, ids[TokenChunk:])),
	}
	got, err := LoadPromptTokenIDs(dir, Step{PromptTokenChunks: chunks})
	if err != nil || !slices.Equal(got, ids) {
		t.Errorf("JSON chunks: %d ids, %v; want the %d stored", len(got), err, len(ids))
	}
}

func TestTokenIDsClosed(t *testing.T) {
	dir := t.TempDir()
	r := mustCreate(t, dir)
	chunks, err := r.PutTokenIDs([]int64{1, 2, 3})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := r.PutTokenIDs([]int64{1}); !errors.Is(err, ErrClosed) {
		t.Errorf("PutTokenIDs after Close: %v, want ErrClosed", err)
	}
	s, err := OpenMessageStore(dir, StoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	if _, err := s.PromptTokenIDs(Step{PromptTokenChunks: chunks}); !errors.Is(err, ErrClosed) {
		t.Errorf("PromptTokenIDs after Close: %v, want ErrClosed", err)
	}
}

// TestCanonicalIDs: the hand-written encoding is encoding/json's, which
// older runs' token chunks hold and exports write.
func TestCanonicalIDs(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 9))
	edges := []int64{0, 1, 9, 10, 11, 99, 100, 101, 999, 1000, 151643, 9999999, 10000000, 99999999, 1e8, 1e8 + 1,
		-1, -10, -99999999, -1e8, math.MaxInt64, math.MinInt64}
	for n := range 50 {
		ids := make([]int64, n)
		for i := range ids {
			switch i % 3 {
			case 0:
				ids[i] = int64(rng.Uint64())
			case 1:
				ids[i] = rng.Int64N(1 << (rng.IntN(28) + 1)) // up to past 10^8
			default:
				ids[i] = edges[rng.IntN(len(edges))]
			}
		}
		want, err := json.Marshal(ids)
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			want = []byte("[]")
		}
		if got := AppendTokenIDs(nil, ids); string(got) != string(want) {
			t.Errorf("AppendTokenIDs(%v) = %s, want %s", ids, got, want)
		}
		// The same ids cut into chunks, some empty, join into the same
		// array, after bytes already in the buffer.
		var chunks [][]int64
		for rest := ids; ; {
			k := rng.IntN(min(len(rest), 5) + 1)
			chunks = append(chunks, rest[:k])
			if rest = rest[k:]; len(rest) == 0 && rng.IntN(2) == 0 {
				break
			}
		}
		if got := AppendTokenIDChunks([]byte("x"), chunks); string(got) != "x"+string(want) {
			t.Errorf("AppendTokenIDChunks(%v) = %s, want x%s", chunks, got, want)
		}
	}
}

// TestParseCanonicalIDs: the fast reader takes back what canonicalIDs
// wrote, and refuses (for encoding/json to judge) anything else.
func TestParseCanonicalIDs(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	cases := [][]int64{{}, {0}, {-1}, {math.MaxInt64}, {math.MinInt64 + 1}, {151644, 8948, 0, 198}}
	for n := range 40 {
		ids := make([]int64, n)
		for i := range ids {
			ids[i] = int64(rng.Uint64() >> rng.IntN(64))
		}
		cases = append(cases, ids)
	}
	for _, ids := range cases {
		got, ok := parseCanonicalIDs(AppendTokenIDs(nil, ids))
		if !ok || !slices.Equal(got, ids) {
			t.Errorf("parseCanonicalIDs(%s) = %v, %v; want %v", AppendTokenIDs(nil, ids), got, ok, ids)
		}
	}
	for _, in := range []string{"", "[", "]", "[1,]", "[,1]", "[1,,2]", "[ 1]", "[1 ]", "[01]", "[-]", "[--1]",
		"[1.5]", "[1e3]", "[+1]", `["1"]`, "[9223372036854775808]", "[-9223372036854775809]", "{}", "[1]x", "null"} {
		if got, ok := parseCanonicalIDs([]byte(in)); ok {
			t.Errorf("parseCanonicalIDs(%q) = %v, ok; want it refused", in, got)
		}
	}
}

// TestPromptTokenIDChunksAfter: an attempt's steps loaded each after the
// one before give what loading each alone gives, taking the chunks they
// share with it from the caller (not the store); a chunk shared but
// checked less before (an older run's short last chunk, now in the middle)
// is still refused.
func TestPromptTokenIDChunksAfter(t *testing.T) {
	dir := t.TempDir()
	r := mustCreate(t, dir)
	w := r.NewTokenWriter()
	prompt := promptIDs(TokenChunk+100, 5)
	var steps []Step
	for k := range 6 {
		if k == 4 {
			prompt = append(slices.Clone(prompt[:50]), prompt[60:]...) // changes early
		}
		chunks, err := w.Put(prompt)
		if err != nil {
			t.Fatal(err)
		}
		steps = append(steps, Step{PromptTokenChunks: chunks, PromptTokenCount: len(prompt)})
		prompt = append(prompt, promptIDs(300+k, uint64(k))...)
	}
	// An older run's JSON chunks: a short last chunk, then in the middle.
	full, short := promptIDs(TokenChunk, 9), promptIDs(10, 10)
	a, b := putRawChunk(t, dir, AppendTokenIDs(nil, full)), putRawChunk(t, dir, AppendTokenIDs(nil, short))
	c := putRawChunk(t, dir, AppendTokenIDs(nil, []int64{1, 2}))
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	s, err := OpenMessageStore(dir, StoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var prev Step
	var prevChunks [][]int64
	reused := 0
	for i, st := range steps {
		want, wantN, err := s.PromptTokenIDChunks(st)
		if err != nil {
			t.Fatal(err)
		}
		got, n, err := s.PromptTokenIDChunksAfter(st, prev, prevChunks)
		if err != nil || n != wantN || !cmp.Equal(got, want) {
			t.Fatalf("step %d: %d ids (%v), want %d as loaded alone", i, n, err, wantN)
		}
		for k := range min(len(got), len(prevChunks)) {
			if len(got[k]) > 0 && &got[k][0] == &prevChunks[k][0] {
				reused++
			}
		}
		prev, prevChunks = st, got
	}
	if reused == 0 {
		t.Error("no chunk taken from the step before")
	}
	// The shared chunk comes from the caller.
	mine := [][]int64{slices.Repeat([]int64{7}, len(prevChunks[0]))}
	got, _, err := s.PromptTokenIDChunksAfter(prev, prev, mine)
	if err != nil || got[0][0] != 7 {
		t.Errorf("a shared chunk not taken from the caller: %v", err)
	}
	old := Step{PromptTokenChunks: []string{a, b}}
	oldChunks, _, err := s.PromptTokenIDChunks(old)
	if err != nil {
		t.Fatal(err)
	}
	next := Step{PromptTokenChunks: []string{a, b, c}}
	if _, _, err := s.PromptTokenIDChunksAfter(next, old, oldChunks); !errors.Is(err, ErrCorrupt) {
		t.Errorf("a short JSON chunk in the middle, shared with a step it ended: %v, want ErrCorrupt", err)
	}
}
