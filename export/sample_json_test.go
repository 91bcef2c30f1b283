package export

import (
	"bytes"
	"encoding/json"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"

	"legato/rl/schema"
)

// TestAppendTail: the hand-written tail is encoding/json's, byte for byte,
// over random tails and the numbers whose format changes (exponents, -0,
// the extremes), nil and empty slices, and strings that need escapes.
func TestAppendTail(t *testing.T) {
	sw := newSampleWriter(nil)
	want := func(tail *sampleTail) []byte {
		var b bytes.Buffer
		enc := json.NewEncoder(&b)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(tail); err != nil {
			t.Fatal(err)
		}
		return bytes.TrimSuffix(b.Bytes(), []byte("\n"))
	}
	floats := []float64{0, math.Copysign(0, -1), -0.5, 1, -1e-7, 1e-6, 9.99e-7, 1e20, 1e21, -1e21, 123456789e-30,
		math.MaxFloat64, math.SmallestNonzeroFloat64, -3.4028234663852886e38, 0.1, -2.302585092994046, 1.5e-10}
	ints := []int64{0, -1, 151644, math.MaxInt64, math.MinInt64}
	tails := []sampleTail{
		{},
		{PromptTokenIDs: []int64{}, ResponseTokenIDs: []int64{}, ResponseLogprobs: []float64{}, ResponseTokens: []string{}, Warnings: []string{}},
		{PromptPrefixIDs: 1 << 20, PromptTokenIDs: ints, ResponseTokenIDs: ints, ResponseLogprobs: floats, ResponseTokens: []string{"<a>", "\"", "\u2028", "\x01", "é", "\xff"},
			ResponseText: "<tool_call>{\"a\": 1} & \n\t\\", ResponseReasoning: "think\u2029", TokenIDsSource: schema.SourceReturnTokenIDs,
			FinishReason: "stop", Warnings: []string{schema.WarnLogprobsMismatch}},
		{Images: []StepImage{}},
		{Images: testImages},
	}
	rng := rand.New(rand.NewPCG(28, 1))
	for range 200 {
		var tl sampleTail
		if rng.IntN(4) > 0 {
			tl.PromptTokenIDs = make([]int64, rng.IntN(50))
			for i := range tl.PromptTokenIDs {
				tl.PromptTokenIDs[i] = rng.Int64N(200_000) - 10
			}
		}
		if rng.IntN(2) == 0 {
			tl.PromptPrefixIDs = rng.IntN(100_000)
		}
		n := rng.IntN(20)
		tl.ResponseTokenIDs, tl.ResponseLogprobs = make([]int64, n), make([]float64, n)
		for i := range n {
			tl.ResponseTokenIDs[i] = rng.Int64()
			tl.ResponseLogprobs[i] = -rng.ExpFloat64() * math.Pow(10, float64(rng.IntN(40)-30))
		}
		tl.ResponseText = string(rune(rng.IntN(0x3000)))
		tails = append(tails, tl)
	}
	for i := range tails {
		got, err := appendTail(nil, &tails[i], sw.encode)
		if err != nil {
			t.Fatalf("tail %d: %v", i, err)
		}
		w := want(&tails[i])
		if !bytes.Equal(got, w) {
			t.Errorf("tail %d:\n got %s\nwant %s", i, got, w)
		}
		// The same ids as the store's chunks, cut anywhere (empty
		// chunks too), write the same bytes.
		if ids := tails[i].PromptTokenIDs; len(ids) > 0 {
			chunked := tails[i]
			chunked.PromptTokenIDs = nil
			for start := 0; start < len(ids); {
				n := min(rng.IntN(7), len(ids)-start)
				chunked.promptChunks = append(chunked.promptChunks, ids[start:start+n])
				start += n
			}
			got, err := appendTail(nil, &chunked, sw.encode)
			if err != nil || !bytes.Equal(got, w) {
				t.Errorf("tail %d from %d chunks:\n got %s (%v)\nwant %s", i, len(chunked.promptChunks), got, err, w)
			}
		}
	}
	for _, bad := range []float64{math.NaN(), math.Inf(1), math.Inf(-1)} {
		if _, err := appendTail(nil, &sampleTail{ResponseLogprobs: []float64{-1, bad}}, sw.encode); err == nil {
			t.Errorf("logprob %v: no error; encoding/json refuses it", bad)
		}
	}
}

// TestAppendAttemptSample: a contiguous sample's JSON is encoding/json's,
// byte for byte, for edge values and random sequences; NaN and ±Inf are
// refused as encoding/json refuses them.
// testImages are images as samples list them: with a span, without, and
// at the bounds of their numbers.
var testImages = []StepImage{
	{SHA256: strings.Repeat("0a", 32), Bytes: 1 << 21, Width: 1920, Height: 1080, TokenSpan: &[2]int{14, 2714}},
	{SHA256: strings.Repeat("f9", 32), Bytes: 1, Width: 1, Height: math.MaxInt32},
	{SHA256: strings.Repeat("00", 32), TokenSpan: &[2]int{0, math.MaxInt}},
}

func TestAppendAttemptSample(t *testing.T) {
	sw := newSampleWriter(nil)
	want := func(s *AttemptSample) []byte {
		var b bytes.Buffer
		enc := json.NewEncoder(&b)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(s); err != nil {
			t.Fatal(err)
		}
		return bytes.TrimSuffix(b.Bytes(), []byte("\n"))
	}
	samples := []AttemptSample{
		{},
		{RolloutID: "r<1>&\"", TaskID: "\u2028é\xff", GroupID: "v1/t", Attempt: -3, Status: schema.StatusTruncated,
			Reward: math.Copysign(0, -1), Advantage: -1e-7, Sequence: Sequence{TokenIDs: []int64{}, LossMask: []int{}, Logprobs: []float64{},
				StepStarts: []int{}, PolicyVersions: []string{}}},
		{Reward: 1e21, Advantage: math.MaxFloat64, Sequence: Sequence{TokenIDs: []int64{math.MinInt64, math.MaxInt64}, LossMask: []int{0, 1},
			Logprobs: []float64{0, math.SmallestNonzeroFloat64}, PromptLength: 1, StepStarts: []int{1}, PolicyVersions: []string{"v<2>"}},
			Images: testImages},
		{Images: []StepImage{}},
	}
	rng := rand.New(rand.NewPCG(28, 2))
	for range 100 {
		n := rng.IntN(300)
		s := AttemptSample{RolloutID: string(rune(rng.IntN(0x3000))), Attempt: rng.IntN(16), Status: schema.StatusOK,
			Reward: float64(rng.IntN(2)), Advantage: rng.NormFloat64(), Sequence: Sequence{
				TokenIDs: make([]int64, n), LossMask: make([]int, n), PromptLength: rng.IntN(n + 1)}}
		if rng.IntN(3) > 0 {
			s.Logprobs = make([]float64, n)
		}
		for i := range n {
			s.TokenIDs[i] = rng.Int64N(200_000)
			s.LossMask[i] = rng.IntN(2)
			if s.Logprobs != nil && s.LossMask[i] == 1 {
				s.Logprobs[i] = -rng.ExpFloat64() * math.Pow(10, float64(rng.IntN(40)-30))
			}
		}
		for range rng.IntN(5) {
			s.StepStarts = append(s.StepStarts, rng.IntN(n+1))
			s.PolicyVersions = append(s.PolicyVersions, "step-"+strconv.Itoa(rng.IntN(100)))
		}
		samples = append(samples, s)
	}
	for i := range samples {
		got, at, err := appendAttemptSample(nil, &samples[i], nil, sw.encode)
		// The advantage alone is padded (to advantageWidth): without
		// the whitespace the line is encoding/json's.
		var compact bytes.Buffer
		if err == nil {
			err = json.Compact(&compact, got)
		}
		if w := want(&samples[i]); err != nil || !bytes.Equal(compact.Bytes(), w) {
			t.Errorf("sample %d:\n got %s (%v)\nwant %s", i, got, err, w)
			continue
		}
		if field := got[at:min(at+advantageWidth+1, len(got))]; len(field) <= advantageWidth || field[advantageWidth] != ',' ||
			strings.TrimLeft(string(field[:advantageWidth]), " ") != string(mustAppendFloat(samples[i].Advantage)) {
			t.Errorf("sample %d: advantage at %d is %q, want %v in %d bytes", i, at, field, samples[i].Advantage, advantageWidth)
		}
	}
	for _, bad := range []AttemptSample{{Reward: math.NaN()}, {Advantage: math.Inf(1)}, {Sequence: Sequence{Logprobs: []float64{math.Inf(-1)}}}} {
		if _, _, err := appendAttemptSample(nil, &bad, nil, sw.encode); err == nil {
			t.Errorf("%+v: no error; encoding/json refuses it", bad)
		}
	}
}

func mustAppendFloat(f float64) []byte {
	b, ok := appendFloat(nil, f)
	if !ok {
		panic(f)
	}
	return b
}

// TestAdvantageWidth: every float64 appendFloat writes fits advantageWidth
// (the widest have 17 significant digits just above 1e-6, negative), and
// appendAdvantage writes it right-aligned in exactly that many bytes, so a
// reader gets the number back.
func TestAdvantageWidth(t *testing.T) {
	rng := rand.New(rand.NewPCG(28, 3))
	values := []float64{0, math.Copysign(0, -1), 1, -1, math.MaxFloat64, -math.SmallestNonzeroFloat64, -1.2345678901234567e-6,
		math.Nextafter(1e-6, 1), -math.Nextafter(1e21, 0), -1e21, -9.999999999999999e-7}
	for range 100_000 {
		// Every exponent, and most digits at the widest ones.
		e := rng.IntN(628) - 320
		if rng.IntN(2) == 0 {
			e = rng.IntN(8) - 7
		}
		values = append(values, -rng.Float64()*math.Pow(10, float64(e)))
	}
	widest := 0
	for _, v := range values {
		widest = max(widest, len(mustAppendFloat(v)))
		b, err := appendAdvantage([]byte("x"), v)
		if err != nil {
			t.Fatalf("%v: %v", v, err)
		}
		if len(b) != 1+advantageWidth {
			t.Fatalf("%v written in %d bytes %q, want %d", v, len(b)-1, b[1:], advantageWidth)
		}
		var got float64
		if err := json.Unmarshal(b[1:], &got); err != nil || got != v || math.Signbit(got) != math.Signbit(v) {
			t.Fatalf("%q reads back as %v (%v), want %v", b[1:], got, err, v)
		}
	}
	if widest != advantageWidth {
		t.Errorf("the widest advantage written took %d bytes, advantageWidth is %d", widest, advantageWidth)
	}
	if _, err := appendAdvantage(nil, math.NaN()); err == nil {
		t.Error("NaN: no error; JSON cannot hold it")
	}
}
