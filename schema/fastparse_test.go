package schema

import (
	"bytes"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// readWays are the ways a line is parsed: without a RecordText
// (parseRecordOpts), and with one, its logprobs parsed or lazy.
var readWays = []struct {
	name string
	text bool
	opts ReadOptions
}{
	{"plain", false, ReadOptions{}},
	{"no requests", false, ReadOptions{NoRequests: true}},
	{"text", true, ReadOptions{}},
	{"text, lazy", true, ReadOptions{LazyLogprobs: true}},
	{"text, lazy, no requests", true, ReadOptions{LazyLogprobs: true, NoRequests: true}},
	{"last request", false, ReadOptions{NoRequests: true, LastRequest: true}},
	{"text, lazy, last request", true, ReadOptions{LazyLogprobs: true, NoRequests: true, LastRequest: true}},
}

// parsedLine is what a reader makes of a line one way: the record, the
// text of each step's logprobs, the record with its lazy logprobs parsed,
// or the error.
type parsedLine struct {
	Rec    Record
	Texts  []string
	Parsed Record
	Err    string
}

// parseWay parses line the way w, with the fast path on or off.
func parseWay(t *testing.T, line []byte, text bool, opts ReadOptions, fast bool) parsedLine {
	t.Helper()
	defer func(f bool) { fastParse = f }(fastParse)
	fastParse = fast
	var p parsedLine
	var rt *RecordText
	var err error
	if text {
		p.Rec, rt, err = parseRecordText(line, opts)
	} else {
		p.Rec, err = parseRecordOpts(line, opts)
	}
	if err != nil {
		return parsedLine{Err: err.Error()}
	}
	for i := range p.Rec.Steps {
		p.Texts = append(p.Texts, string(rt.Logprobs(&p.Rec, i)))
	}
	// ParseLogprobs parses into the slices read: Rec keeps copies of them
	// as read, Parsed the slices.
	p.Parsed = p.Rec
	p.Rec.Steps = slices.Clone(p.Rec.Steps)
	for i := range p.Rec.Steps {
		r := &p.Rec.Steps[i].Response
		r.Logprobs = slices.Clone(r.Logprobs)
	}
	if err := rt.ParseLogprobs(&p.Parsed); err != nil {
		t.Fatalf("ParseLogprobs: %v", err)
	}
	return p
}

// agree reports how line parsed with the fast path differs from line
// parsed by the decoder alone, in each way of reading, or "".
func agree(t *testing.T, line []byte) string {
	t.Helper()
	for _, w := range readWays {
		want := parseWay(t, line, w.text, w.opts, false)
		got := parseWay(t, line, w.text, w.opts, true)
		if diff := cmp.Diff(want, got, cmpopts.EquateNaNs()); diff != "" {
			return fmt.Sprintf("%s (-decoder +fast path):\n%s", w.name, diff)
		}
		for i, st := range got.Rec.Steps {
			for k, f := range st.Response.Logprobs {
				// -0 and 0 are equal to cmp.
				if w2 := want.Rec.Steps[i].Response.Logprobs[k]; math.Signbit(f) != math.Signbit(w2) {
					return fmt.Sprintf("%s: step %d logprob %d is %v, the decoder's %v", w.name, i, k, f, w2)
				}
			}
		}
	}
	return ""
}

// fastRecords are records as legato writes them, which the fast path
// must read itself: random ids, logprobs (exponents, -0, 17 digits),
// hashes, empty and absent arrays, escapes in the other strings.
func fastRecords(t testing.TB) [][]byte {
	t.Helper()
	rng := rand.New(rand.NewPCG(11, 12))
	hash := func() string {
		b := make([]byte, 32)
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		return fmt.Sprintf("%x", b)
	}
	var lines [][]byte
	for r := range 200 {
		rec := fullRecord(fmt.Sprintf("r-%d", r))
		rec.Steps = nil
		for range rng.IntN(8) {
			st := fullRecord("x").Steps[0]
			st.Request = nil
			for range rng.IntN(6) {
				st.Request = append(st.Request, hash())
			}
			switch rng.IntN(4) {
			case 0:
				st.Request = []string{}
			case 1:
				st.PromptTokenChunks = []string{hash(), hash()}
				st.PromptTokenCount = 2300
			}
			n := rng.IntN(40)
			st.Response.TokenIDs = nil
			st.Response.Logprobs = nil
			if rng.IntN(5) > 0 {
				st.Response.TokenIDs = make([]int64, n)
				st.Response.Logprobs = make([]float64, n)
				for k := range n {
					st.Response.TokenIDs[k] = rng.Int64N(200_000)
					switch rng.IntN(6) {
					case 0:
						st.Response.Logprobs[k] = math.Copysign(0, -1)
					case 1:
						st.Response.Logprobs[k] = -rng.Float64() * 1e-9
					default:
						st.Response.Logprobs[k] = -rng.ExpFloat64()
					}
				}
			}
			st.Response.Content = fmt.Sprintf("step \"%d\" <b>\n\u2028 é", r)
			rec.Steps = append(rec.Steps, st)
		}
		lines = append(lines, []byte(line(t, rec)))
	}
	return append(lines, fixtureLines(t)...)
}

// TestParseFastAgrees: the fast path reads the records legato writes
// (each of them: the test fails if one falls back to the decoder), and
// what it reads, in every way of reading, is what the decoder alone reads:
// records, logprob texts, lazy logprobs once parsed.
func TestParseFastAgrees(t *testing.T) {
	for i, line := range fastRecords(t) {
		if _, ok := parseRecordFast(line, ReadOptions{}, nil); !ok {
			t.Fatalf("line %d: the fast path does not read it: %s", i, line)
		}
		if diff := agree(t, line); diff != "" {
			t.Fatalf("line %d: %s", i, diff)
		}
	}
}

// TestParseFastFallsBack: lines the fast path does not read as it reads
// legato's (whitespace, escapes, other numbers, duplicate or unknown
// members, nulls, damage) parse to what the decoder alone makes of them,
// a record or an error; and the fast path leaves most of them to it.
func TestParseFastFallsBack(t *testing.T) {
	every := everyField()
	base := fastRecords(t)[3]
	if !bytes.Contains(base, []byte(`"token_ids":[`)) || !bytes.Contains(base, []byte(`"request":["`)) || !bytes.Contains(base, []byte(`"logprobs":[`)) {
		t.Fatalf("base line without the arrays to change: %s", base)
	}
	edit := func(old, new string) []byte {
		return bytes.Replace(base, []byte(old), []byte(new), 1)
	}
	lines := [][]byte{
		[]byte(line(t, &every)),
		edit(`"token_ids":[`, `"token_ids": [`),
		edit(`"token_ids":[`, `"token_ids":[1.5,`),
		edit(`"token_ids":[`, `"token_ids":[1e3,`),
		edit(`"token_ids":[`, `"token_ids":[-0,`),
		edit(`"token_ids":[`, `"token_ids":[01,`),
		edit(`"token_ids":[`, `"token_ids":[9223372036854775808,`),
		edit(`"token_ids":[`, `"token_ids":[null,`),
		edit(`"token_ids":[`, `"token_ids":["1",`),
		edit(`"token_ids":[`, `"token_ids":[[1],`),
		edit(`"token_ids":[`, `"token_ids":null,"x":[`),
		edit(`"token_ids":[`, `"token_ids":[],"token_ids":[`),
		edit(`"logprobs":[`, `"logprobs":[1e400,`),
		edit(`"logprobs":[`, `"logprobs":[1e308,`),
		edit(`"logprobs":[`, `"logprobs":[-.5,`),
		edit(`"logprobs":[`, `"logprobs":[1.,`),
		edit(`"logprobs":[`, `"logprobs":[-,`),
		edit(`"logprobs":[`, `"logprobs":[--1,`),
		edit(`"logprobs":[`, `"logprobs":[1e,`),
		edit(`"logprobs":[`, `"logprobs":[NaN,`),
		edit(`"logprobs":[`, `"logprobs":[null,`),
		edit(`"logprobs":[`, `"logprobs":[ -1,`),
		edit(`"logprobs":[`, `"logprobs":[1E+2,`),
		edit(`"logprobs":[`, `"logprobs":[0.000e999,`),
		edit(`"logprobs":[`, `"logprobs":{},"y":[`),
		edit(`"request":["`, `"request":["\u0061`),
		edit(`"request":["`, `"request":["é`),
		edit(`"request":["`, `"request":[null,"`),
		edit(`"request":["`, `"request":[1,"`),
		edit(`"request":["`, `"re\u0071uest":["`),
		edit(`"request":["`, `"request":"x","z":["`),
		edit(`"request":["`, `"request":[],"request":["`),
		edit(`"response":{`, `"response":null,"r":{`),
		edit(`"response":{`, `"response":{},"response":{`),
		edit(`"response":{`, `"response":{"zz":{"token_ids":[1.5]},`),
		edit(`"request":["`, `"token_ids":[7],"logprobs":[-1],"request":["`),
		edit(`"schema":"`, `"token_ids":[7],"request":["a"],"response":{},"schema":"`),
		edit(`"desktop":`, `"request":["a"],"prompt_token_chunks":["b"],"token_ids":[1],"logprobs":[-1],"desktop":`),
		edit(`"steps":[`, `"steps":null,"s":[`),
		edit(`"steps":[`, `"steps":[],"steps":[`),
		edit(`"steps":[`, `"steps":[null,`),
		edit(`"steps":[`, `"unknown":{"steps":[1]},"steps":[`),
		edit(`"schema":"`, `"schema":"x`),
		edit(`"schema":"`, ` "schema":"`),
		edit(`,"steps":[`, `, "steps":[`),
		append(bytes.Clone(base), 'x'),
		append(bytes.Clone(base), ' '),
		append(bytes.Clone(base), "\r"...),
		base[:len(base)-1],
		base[:len(base)/2],
		[]byte(`{}`), []byte(`{"steps":[]}`), []byte(`[]`), []byte(`null`), []byte(``),
	}
	fellBack := 0
	for i, line := range lines {
		if _, ok := parseRecordFast(line, ReadOptions{}, nil); !ok {
			fellBack++
		}
		if diff := agree(t, line); diff != "" {
			t.Errorf("line %d %.200q: %s", i, line, diff)
		}
	}
	if fellBack < len(lines)/2 {
		t.Errorf("the fast path read %d of %d changed lines itself", len(lines)-fellBack, len(lines))
	}
}

// FuzzParseFast: whatever the line, a record the fast path reads is the
// decoder's, in every way of reading.
func FuzzParseFast(f *testing.F) {
	lines := fastRecords(f)
	for _, line := range lines[:20] {
		f.Add(line)
	}
	f.Add([]byte(`{"schema":"legato.rollout/v0","steps":[{"request":["a"],"response":{"token_ids":[1,2],"logprobs":[-0.5,-1e-7]}}]}`))
	f.Add([]byte(`{"schema":"legato.rollout/v0","steps":[{"response":{"logprobs":[]}},{}]}`))
	f.Fuzz(func(t *testing.T, line []byte) {
		if strings.Count(string(line), "[") > 1000 {
			return // deep nesting is the decoder's to refuse
		}
		if _, ok := parseRecordFast(line, ReadOptions{}, nil); !ok {
			return
		}
		if diff := agree(t, line); diff != "" {
			t.Fatalf("%q: %s", line, diff)
		}
	})
}
