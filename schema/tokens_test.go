package schema

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"math"
	"math/rand/v2"
	"os"
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
		// Each chunk is the documented format: zstd of the JSON array,
		// named by the sha256 of that JSON.
		for _, h := range st.chunks {
			b, err := os.ReadFile(filepath.Join(dir, TokensDir, h))
			if err != nil {
				t.Fatal(err)
			}
			dec, _ := zstd.NewReader(nil)
			canon, err := dec.DecodeAll(b, nil)
			dec.Close()
			if err != nil {
				t.Fatal(err)
			}
			var ids []int64
			if err := json.Unmarshal(canon, &ids); err != nil {
				t.Errorf("chunk %s is not a JSON array of ids: %v", h, err)
			}
			if sum := sha256.Sum256(canon); hex.EncodeToString(sum[:]) != h {
				t.Errorf("chunk named %s holds content hashing to %x", h, sum)
			}
		}
	}
}

// TestPutTokenIDsSharesChunks: a prompt that extends another shares its
// full chunks, so the steps of an attempt store about one chunk each.
func TestPutTokenIDsSharesChunks(t *testing.T) {
	dir := t.TempDir()
	r := mustCreate(t, dir)
	base := promptIDs(5*TokenChunk/2, 1)
	first, err := r.PutTokenIDs(base)
	if err != nil {
		t.Fatal(err)
	}
	longer := append(append([]int64(nil), base...), promptIDs(TokenChunk, 2)...)
	second, err := r.PutTokenIDs(longer)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(first[:2], second[:2]); diff != "" {
		t.Errorf("full chunks of the shared prefix differ (-first +second):\n%s", diff)
	}
	if first[2] == second[2] {
		t.Error("the last, partial chunk of the shorter prompt was reused for a full one")
	}
	again, err := r.PutTokenIDs(longer)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(second, again); diff != "" {
		t.Errorf("same ids stored twice got other chunks (-first +second):\n%s", diff)
	}
	// 3 chunks for the first prompt, 2 new ones for the second.
	if got := len(names(t, filepath.Join(dir, TokensDir))); got != 5 {
		t.Errorf("%d chunk files, want 5", got)
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
			other, err := os.ReadFile(filepath.Join(dir, TokensDir, c[1]))
			if err != nil {
				t.Fatal(err)
			}
			writeFile(t, filepath.Join(dir, TokensDir, c[0]), other)
			return c
		}, ErrCorrupt},
		{"not zstd", func(t *testing.T, dir string, c []string) []string {
			writeFile(t, filepath.Join(dir, TokensDir, c[0]), []byte("[1,2,3]"))
			return c
		}, ErrCorrupt},
		// A short chunk anywhere but last would shift every later id.
		{"short chunk before the last", func(_ *testing.T, _ string, c []string) []string { return []string{c[1], c[0]} }, ErrCorrupt},
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

// TestCanonicalIDs: the hand-written encoding is encoding/json's, which the
// format documents.
func TestCanonicalIDs(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 9))
	for n := range 50 {
		ids := make([]int64, n)
		for i := range ids {
			ids[i] = int64(rng.Uint64())
		}
		want, err := json.Marshal(ids)
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			want = []byte("[]")
		}
		if got := canonicalIDs(ids); string(got) != string(want) {
			t.Errorf("canonicalIDs(%v) = %s, want %s", ids, got, want)
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
		got, ok := parseCanonicalIDs(canonicalIDs(ids))
		if !ok || !slices.Equal(got, ids) {
			t.Errorf("parseCanonicalIDs(%s) = %v, %v; want %v", canonicalIDs(ids), got, ok, ids)
		}
	}
	for _, in := range []string{"", "[", "]", "[1,]", "[,1]", "[1,,2]", "[ 1]", "[1 ]", "[01]", "[-]", "[--1]",
		"[1.5]", "[1e3]", "[+1]", `["1"]`, "[9223372036854775808]", "[-9223372036854775809]", "{}", "[1]x", "null"} {
		if got, ok := parseCanonicalIDs([]byte(in)); ok {
			t.Errorf("parseCanonicalIDs(%q) = %v, ok; want it refused", in, got)
		}
	}
}
