package policytest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"

	"legato/rl/schema"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestPiecesRoundTrip(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want []string
	}{
		{"empty", "", nil},
		{"words", "Click the button", []string{"Click", " the", " button"}},
		{"punctuation", "at (12, 340).", []string{"at", " ", "(", "12", ",", " 340", ")", "."}},
		{"newlines", "a\n\nb", []string{"a", "\n\n", "b"}},
		{"spaces", "a   b", []string{"a", "  ", " b"}},
		{"unicode", "café ☕", []string{"café", " ", "☕"}},
		{"tool call", `{"action": "key"}`, []string{"{", `"`, "action", `"`, ":", " ", `"`, "key", `"`, "}"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := pieces(tt.in)
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("pieces(%q) (-want +got):\n%s", tt.in, diff)
			}
			if joined := strings.Join(got, ""); joined != tt.in {
				t.Errorf("pieces(%q) joined = %q", tt.in, joined)
			}
		})
	}
}

func FuzzPieces(f *testing.F) {
	f.Add("Action: Click at (841, 101).\n<tool_call>\n{}\n</tool_call>")
	f.Add("  \n\n x\xff\xfe")
	f.Fuzz(func(t *testing.T, s string) {
		if joined := strings.Join(pieces(s), ""); joined != s {
			t.Fatalf("pieces(%q) joined = %q", s, joined)
		}
	})
}

func TestTokenize(t *testing.T) {
	reply := DefaultScript(Request{Instruction: "Open the terminal"})
	a, b := Tokenize(reply), Tokenize(reply)
	if diff := cmp.Diff(a, b); diff != "" {
		t.Fatalf("Tokenize is not deterministic (-first +second):\n%s", diff)
	}
	var text strings.Builder
	for i, tok := range a[:len(a)-1] {
		text.WriteString(tok.Text)
		if tok.Logprob >= 0 || tok.Logprob < -4.01 {
			t.Errorf("token %d %q: logprob %v outside (-4.01, 0)", i, tok.Text, tok.Logprob)
		}
		if tok.ID < 0 || tok.ID >= wordVocab {
			t.Errorf("token %d %q: id %d outside the vocabulary", i, tok.Text, tok.ID)
		}
	}
	if text.String() != reply {
		t.Errorf("tokens spell %q, want %q", text.String(), reply)
	}
	// A reply ends with the end-of-turn token, as a real server's ids do.
	if last := a[len(a)-1]; last.ID != EndOfTurn || last.Text != "<|im_end|>" {
		t.Errorf("last token %+v, want <|im_end|> (%d)", last, EndOfTurn)
	}
}

// TestTokenizeSplitCharacters: a character kept as its bytes shows as
// U+FFFD in each byte's token string, as when a server decodes a token on
// its own, while the text keeps the character.
func TestTokenizeSplitCharacters(t *testing.T) {
	reply := "It’s done"
	toks := generate(reply)
	var texts []string
	for _, tok := range toks {
		texts = append(texts, tok.Text)
	}
	want := []string{"It", "\uFFFD", "\uFFFD", "\uFFFD", "s", " done", "<|im_end|>"}
	if diff := cmp.Diff(want, texts); diff != "" {
		t.Errorf("token strings (-want +got):\n%s", diff)
	}
	if got := spelled(toks); got != reply {
		t.Errorf("tokens spell %q, want %q", got, reply)
	}
	if toks[1].ID == toks[2].ID {
		t.Error("the bytes of a split character got the same id: strings and ids would both be lossy")
	}
	// Cut inside the character (max_tokens): the text holds it back.
	if got := spelled(toks[:3]); got != "It" {
		t.Errorf("tokens cut mid-character spell %q, want %q", got, "It")
	}
}

func TestLatencyShape(t *testing.T) {
	var l Latency // zero: the default model
	if got := l.Slowdown(32); got < 1.99 || got > 2.01 {
		t.Errorf("Slowdown(32) = %v, want 2 (latency doubles at the knee)", got)
	}
	if got := l.Slowdown(1); got > 1.01 {
		t.Errorf("Slowdown(1) = %v, want about 1", got)
	}
	throughput := func(n int) float64 { return float64(n) / l.Slowdown(n) }
	peak := 1
	for n := 1; n <= 200; n++ {
		if throughput(n) > throughput(peak) {
			peak = n
		}
	}
	if peak != 48 {
		t.Errorf("throughput peaks at %d in flight, want 48", peak)
	}
	if throughput(80) > throughput(64)/2 {
		t.Errorf("throughput at 80 = %.2f, want less than half of %.2f at 64 (collapse past capacity)", throughput(80), throughput(64))
	}
	d := DefaultLatency()
	want := time.Duration(float64(d.Base+100*d.PerPromptToken+10*d.PerToken) * l.Slowdown(5))
	if got := l.Duration(5, 100, 10); got != want {
		t.Errorf("Duration(5, 100, 10) = %v, want %v", got, want)
	}
}

// commonBlocks is what a block-granular prefix cache should serve for b
// after a: the whole blocks of their common prefix, leaving at least the
// last token of b to compute.
func commonBlocks(a, b []uint64) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	n = n / BlockSize * BlockSize
	if n >= len(b) {
		n = (len(b) - 1) / BlockSize * BlockSize
	}
	return n
}

func TestPrefixCache(t *testing.T) {
	sys := schema.Message{Role: "system", Content: []schema.Part{schema.TextPart(strings.Repeat("You operate a desktop. ", 10))}}
	user := func(text, img string) schema.Message {
		return schema.Message{Role: "user", Content: []schema.Part{schema.TextPart(text), schema.ImagePart(img)}}
	}
	asst := func(text string) schema.Message {
		return schema.Message{Role: "assistant", Content: []schema.Part{schema.TextPart(text)}}
	}
	step0 := []schema.Message{sys, user("Open the file manager", "data:image/png;base64,ONE")}
	step1 := append(append([]schema.Message(nil), step0...), asst("Action: click"), user("", "data:image/png;base64,TWO"))
	step2 := append(append([]schema.Message(nil), step1...), asst("Action: type"), user("", "data:image/png;base64,THREE"))
	// step2 with its oldest screenshot dropped, as an image-max limit does.
	dropped := append([]schema.Message{sys, {Role: "user", Content: []schema.Part{schema.TextPart("Open the file manager")}}}, step2[2:]...)
	otherImage := []schema.Message{sys, user("Open the file manager", "data:image/png;base64,OTHER")}

	tests := []struct {
		name        string
		before, req []schema.Message
		capacity    int
	}{
		{"group sibling repeats the prompt", step0, step0, DefaultCacheBlocks},
		{"next step extends the prompt", step0, step1, DefaultCacheBlocks},
		{"step after next", step1, step2, DefaultCacheBlocks},
		{"dropping the oldest screenshot misses", step2, dropped, DefaultCacheBlocks},
		{"a different image misses from the image on", step0, otherImage, DefaultCacheBlocks},
		{"evicted when the cache is too small", step0, step0, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newPrefixCache(tt.capacity)
			_, before := promptTokens(tt.before, 64)
			_, keys := promptTokens(tt.req, 64)
			if got := c.serve(before); got != 0 {
				t.Fatalf("cold cache served %d tokens, want 0", got)
			}
			want := commonBlocks(before, keys)
			if tt.capacity < len(before)/BlockSize {
				want = 0
			}
			if got := c.serve(keys); got != want {
				t.Errorf("cached = %d of %d tokens, want %d", got, len(keys), want)
			}
		})
	}
	// The cases above must show the effects they are named for.
	_, k0 := promptTokens(step0, 64)
	_, k1 := promptTokens(step1, 64)
	_, k2 := promptTokens(step2, 64)
	_, kd := promptTokens(dropped, 64)
	if got := commonBlocks(k0, k1); got < len(k0)-BlockSize {
		t.Errorf("step 1 shares %d tokens with step 0 (%d tokens), want all but the last block", got, len(k0))
	}
	if got := commonBlocks(k2, kd); got > len(k2)/4 {
		t.Errorf("dropping a screenshot still shares %d of %d tokens", got, len(k2))
	}
}

// TestSampledScript: the same seed answers the n-th request the same, and
// the attempts of one task differ.
func TestSampledScript(t *testing.T) {
	a, b, other := SampledScript(3), SampledScript(3), SampledScript(4)
	req := func(n, step int) Request { return Request{N: n, Instruction: "the same task", Step: step} }
	distinct := map[string]bool{}
	diffSeed := 0
	for n := range 40 {
		got := a(req(n, 0))
		if got != b(req(n, 0)) {
			t.Fatalf("request %d: two servers with seed 3 answer differently", n)
		}
		if got != other(req(n, 0)) {
			diffSeed++
		}
		distinct[got] = true
		calls, _ := extractToolCalls(got, 0)
		if len(calls) != 1 || calls[0].Function.Name != "computer_use" {
			t.Fatalf("request %d: %q has %d computer_use calls, want 1", n, got, len(calls))
		}
		if strings.Contains(got, "terminate") {
			t.Errorf("request %d: a first step ends the attempt: %q", n, got)
		}
	}
	// 40 first steps of one task: DefaultScript gives one reply; drawn,
	// clicks alone land on 40 places but for a collision.
	if len(distinct) < 20 {
		t.Errorf("40 first steps of one task gave %d distinct replies; want them to differ", len(distinct))
	}
	if diffSeed < 20 {
		t.Errorf("seeds 3 and 4 answered %d of 40 requests differently", diffSeed)
	}
	for n := range 40 {
		if got := a(req(n, 4)); !strings.Contains(got, "terminate") {
			t.Errorf("request %d at step 4: %q; want terminate", n, got)
		}
	}
}

func TestDefaultScript(t *testing.T) {
	var failures, types, keys int
	for i := range 60 {
		instr := fmt.Sprintf("Task number %d: do something on the desktop", i)
		ended := false
		for step := 0; step < 5 && !ended; step++ {
			reply := DefaultScript(Request{Instruction: instr, Step: step})
			if reply != DefaultScript(Request{Instruction: instr, Step: step}) {
				t.Fatalf("%q step %d: reply is not deterministic", instr, step)
			}
			calls, rest := extractToolCalls(reply, 0)
			if len(calls) != 1 || calls[0].Function.Name != "computer_use" {
				t.Fatalf("%q step %d: reply %q has %d computer_use calls, want 1", instr, step, reply, len(calls))
			}
			if !strings.HasPrefix(rest, "Action: ") {
				t.Errorf("%q step %d: text %q does not start with Action:", instr, step, rest)
			}
			var args struct {
				Action     string `json:"action"`
				Status     string `json:"status"`
				Coordinate []int  `json:"coordinate"`
			}
			if err := json.Unmarshal([]byte(calls[0].Function.Arguments), &args); err != nil {
				t.Fatalf("%q step %d: arguments %s: %v", instr, step, calls[0].Function.Arguments, err)
			}
			switch args.Action {
			case "terminate":
				ended = true
				if args.Status == "failure" {
					failures++
				}
			case "type":
				types++
			case "key":
				keys++
			case "left_click":
				for _, c := range args.Coordinate {
					if c < 0 || c > 999 {
						t.Errorf("%q step %d: coordinate %d off the 0-999 grid", instr, step, c)
					}
				}
			default:
				t.Errorf("%q step %d: unexpected action %q", instr, step, args.Action)
			}
		}
		if !ended {
			t.Errorf("%q: no terminate within 5 steps", instr)
		}
	}
	if failures == 0 || failures == 60 || types == 0 || keys == 0 {
		t.Errorf("over 60 tasks: %d failures, %d type actions, %d key actions; want some of each", failures, types, keys)
	}
}

// post sends body to the server's chat endpoint and returns the answer.
func post(t *testing.T, s *Server, header http.Header, body string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, s.URL()+"/chat/completions", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range header {
		req.Header[k] = v
	}
	res, err := s.Client().Do(req)
	if err != nil {
		t.Fatalf("POST: %v", err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatalf("read body: %v", err)
	}
	return res, b
}

const chatBody = `{"model": "m", "logprobs": true, "return_token_ids": true, "messages": [
	{"role": "system", "content": "You operate a Linux desktop. Answer with one tool call per step."},
	{"role": "user", "content": [{"type": "text", "text": "Open the terminal"}, {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]}`

func TestDialectGolden(t *testing.T) {
	reasoningScript := func(Request) string {
		return "<think>\nThe terminal icon is on the left.\n</think>\nAction: open it.\n<tool_call>\n" +
			`{"name": "computer_use", "arguments": {"action": "left_click", "coordinate": [12, 34]}}` + "\n</tool_call>"
	}
	// A short reply with a character that tokenizes as its bytes.
	shortScript := func(Request) string { return "It’s done." }
	noIDs := strings.Replace(chatBody, `"return_token_ids": true, `, "", 1)
	// What a client falls back to when return_token_ids is ignored.
	fallback := strings.Replace(chatBody, `"return_token_ids": true, `,
		`"return_tokens_as_token_ids": true, "return_meta_info": true, "return_prompt_token_ids": true, `, 1)
	tests := []struct {
		name string
		opts Options
		// bodies are sent in turn; the default is chatBody then fallback,
		// the second answer showing cached tokens.
		bodies []string
	}{
		{"vllm-0.10.1", Options{Dialect: VLLM, Version: VLLM0101}, nil},
		{"vllm-0.10.2", Options{Dialect: VLLM, Version: VLLM0102}, nil},
		{"vllm-latest", Options{Dialect: VLLM}, nil},
		{"vllm-no-cache-report", Options{Dialect: VLLM, NoCacheReport: true}, nil},
		{"vllm-reasoning-tool-calls", Options{Dialect: VLLM, SplitReasoning: true, ToolCalls: true, Script: reasoningScript}, []string{chatBody}},
		{"vllm-ignores-return-token-ids", Options{Dialect: VLLM, Faults: FaultAlways(FaultIgnoreField)}, []string{chatBody}},
		{"vllm-image-limit", Options{Dialect: VLLM, ImageLimit: 1}, []string{strings.Replace(chatBody, `]}]}`, `, {"type": "image_url", "image_url": {"url": "data:image/png;base64,BBBB"}}]}]}`, 1)}},
		{"vllm-0.10.1-image-limit", Options{Dialect: VLLM, Version: VLLM0101, ImageLimit: 1}, []string{strings.Replace(chatBody, `]}]}`, `, {"type": "image_url", "image_url": {"url": "data:image/png;base64,BBBB"}}]}]}`, 1)}},
		{"vllm-validation-400", Options{Dialect: VLLM, Faults: FaultAlways(FaultValidationError)}, []string{chatBody}},
		{"sglang-0.4", Options{Dialect: SGLang, Version: SGLang04}, nil},
		{"sglang-0.5.13", Options{Dialect: SGLang, Version: SGLang0513}, nil},
		{"sglang-latest", Options{Dialect: SGLang}, nil},
		{"sglang-no-cache-report", Options{Dialect: SGLang, NoCacheReport: true}, nil},
		{"sglang-reasoning", Options{Dialect: SGLang, SplitReasoning: true, Script: reasoningScript}, []string{chatBody}},
		{"sglang-validation-400", Options{Dialect: SGLang, Faults: FaultAlways(FaultValidationError)}, []string{chatBody}},
		{"openai", Options{Dialect: OpenAI}, []string{chatBody, noIDs, noIDs}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				tt.opts.NoLatency = true
				tt.opts.ImageTokens = 32
				if tt.opts.Script == nil {
					tt.opts.Script = shortScript
				}
				s := NewPipeServer(tt.opts)
				defer s.Close()
				var out bytes.Buffer
				bodies := tt.bodies
				if bodies == nil {
					bodies = []string{chatBody, fallback}
				}
				for i, req := range bodies {
					res, body := post(t, s, nil, req)
					fmt.Fprintf(&out, "# request %d: %d\n", i, res.StatusCode)
					var pretty bytes.Buffer
					if err := json.Indent(&pretty, body, "", "  "); err != nil {
						t.Fatalf("answer is not JSON: %v\n%s", err, body)
					}
					out.Write(numberLists.ReplaceAllFunc(pretty.Bytes(), func(m []byte) []byte {
						return spaces.ReplaceAll(m, nil)
					}))
					out.WriteString("\n")
				}
				golden(t, filepath.Join("testdata", tt.name+".golden"), out.Bytes())
			})
		})
	}
}

// numberLists and spaces fold the indented lists of numbers (token ids,
// bytes) of a golden answer onto one line each.
var (
	numberLists = regexp.MustCompile(`\[\n[-0-9.,\s]+\]`)
	spaces      = regexp.MustCompile(`\s+`)
)

func golden(t *testing.T, path string, got []byte) {
	t.Helper()
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if diff := cmp.Diff(string(want), string(got)); diff != "" {
		t.Errorf("%s (-want +got):\n%s", path, diff)
	}
}

func TestFaultAnswers(t *testing.T) {
	tests := []struct {
		name       string
		opts       Options
		fault      Fault
		wantStatus int
		// wantBody is a substring of the body; wantHeader a header value.
		wantBody   string
		wantHeader [2]string
	}{
		{"500", Options{}, FaultServerError, 500, `"error":{"code":500,"message":"scripted internal server error"`, [2]string{}},
		{"500 sglang is flat", Options{Dialect: SGLang}, FaultServerError, 500, `"object":"error"`, [2]string{}},
		{"429", Options{RetryAfter: 2500 * time.Millisecond}, FaultRateLimit, 429, "rate limit", [2]string{"Retry-After", "3"}},
		{"refuse field", Options{}, FaultRefuseField, 400, `"param":"return_token_ids"`, [2]string{}},
		{"ignore field", Options{}, FaultIgnoreField, 200, `"token_ids":null`, [2]string{}},
		{"flat error", Options{}, FaultFlatError, 500, `{"code":500,"message":"scripted internal server error","object":"error"`, [2]string{}},
		{"401 string", Options{}, FaultUnauthorizedString, 401, `{"error":"Unauthorized"}`, [2]string{}},
		{"malformed", Options{}, FaultMalformedJSON, 200, `"index": 0 "message"`, [2]string{}},
		{"no logprobs", Options{}, FaultNoLogprobs, 200, `"logprobs":null`, [2]string{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				tt.opts.NoLatency = true
				tt.opts.Faults = FaultAlways(tt.fault)
				s := NewPipeServer(tt.opts)
				defer s.Close()
				res, body := post(t, s, nil, chatBody)
				if res.StatusCode != tt.wantStatus || !strings.Contains(string(body), tt.wantBody) {
					t.Errorf("got %d %s\nwant %d with %s", res.StatusCode, body, tt.wantStatus, tt.wantBody)
				}
				if h := tt.wantHeader; h[0] != "" && res.Header.Get(h[0]) != h[1] {
					t.Errorf("%s = %q, want %q", h[0], res.Header.Get(h[0]), h[1])
				}
				if got := s.Stats().Faults; got != 1 {
					t.Errorf("Stats().Faults = %d, want 1", got)
				}
			})
		})
	}
}

func TestFaultTruncatedBody(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := NewPipeServer(Options{NoLatency: true, Faults: FaultAlways(FaultTruncatedBody)})
		defer s.Close()
		res, err := s.Client().Post(s.URL()+"/chat/completions", "application/json", strings.NewReader(chatBody))
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, err := io.ReadAll(res.Body)
		if !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Errorf("reading the body: err = %v after %d bytes, want unexpected EOF", err, len(b))
		}
	})
}

func TestFaultDelays(t *testing.T) {
	tests := []struct {
		name    string
		fault   Fault
		timeout time.Duration
		wantErr bool
		want    time.Duration
	}{
		{"slow first byte", FaultSlowFirstByte, time.Minute, false, 7 * time.Second},
		{"hang until the client gives up", FaultHang, 30 * time.Second, true, 30 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := NewPipeServer(Options{NoLatency: true, FirstByteDelay: 7 * time.Second, Faults: FaultAlways(tt.fault)})
				defer s.Close()
				ctx, cancel := context.WithTimeout(t.Context(), tt.timeout)
				defer cancel()
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.URL()+"/chat/completions", strings.NewReader(chatBody))
				start := time.Now()
				res, err := s.Client().Do(req)
				if err == nil {
					_, err = io.ReadAll(res.Body)
					res.Body.Close()
				}
				if (err != nil) != tt.wantErr {
					t.Errorf("err = %v, want error: %v", err, tt.wantErr)
				}
				if got := time.Since(start); got != tt.want {
					t.Errorf("answer after %v, want %v", got, tt.want)
				}
			})
		})
	}
}

func TestLatencyUnderLoad(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lat := Latency{Base: time.Second}
		s := NewPipeServer(Options{Latency: lat})
		defer s.Close()
		const n = 40
		done := make(chan time.Duration, n)
		start := time.Now()
		for range n {
			go func() {
				post(t, s, nil, chatBody)
				done <- time.Since(start)
			}()
		}
		var last time.Duration
		for range n {
			last = max(last, <-done)
		}
		// Requests arrive one by one, so the last sees all 40 in flight.
		if want := lat.Duration(n, 0, 0); last != want {
			t.Errorf("slowest request took %v, want %v (Slowdown(40) = %.2f)", last, want, lat.Slowdown(n))
		}
		st := s.Stats()
		if st.MaxInFlight != n || st.Completed != n || st.InFlight != 0 {
			t.Errorf("stats = %+v, want %d completed with %d in flight at most", st, n, n)
		}
	})
}

// TestWorkers: a server with two workers works on two requests at once
// and queues the rest; each request is answered.
func TestWorkers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		var entered, cur, most atomic.Int32
		script := func(Request) string {
			entered.Add(1)
			n := cur.Add(1)
			for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
			}
			<-release
			cur.Add(-1)
			return "done"
		}
		s := NewPipeServer(Options{NoLatency: true, Workers: 2, Script: script})
		defer s.Close()
		const n = 5
		errs := make(chan error, n)
		for range n {
			go func() { errs <- postErr(t.Context(), s, chatBody) }()
		}
		synctest.Wait() // every request blocked: in the script, or waiting for a worker
		if st := s.Stats(); entered.Load() != 2 || st.Working != 2 || st.InFlight != n {
			t.Errorf("with every request blocked: %d in the script, stats %+v; want 2 working of %d in flight", entered.Load(), st, n)
		}
		close(release)
		for range n {
			if err := <-errs; err != nil {
				t.Error(err)
			}
		}
		if st := s.Stats(); most.Load() != 2 || st.MaxWorking != 2 || st.Working != 0 || st.Completed != n {
			t.Errorf("at most %d scripts at once, stats %+v; want 2 at most, %d completed", most.Load(), st, n)
		}
	})
}

// TestWorkersFreeWhileWaiting: a request that hangs or waits to answer
// holds no worker, so a server with one answers the next request.
func TestWorkersFreeWhileWaiting(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		faults := func(n int, _ Request) Fault {
			return map[int]Fault{0: FaultHang, 1: FaultSlowFirstByte}[n]
		}
		s := NewPipeServer(Options{NoLatency: true, Workers: 1, Faults: faults, FirstByteDelay: time.Hour})
		defer s.Close()
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		waiting := make(chan error, 2)
		go func() { waiting <- postErr(ctx, s, chatBody) }()
		synctest.Wait() // request 0 hangs
		go func() { waiting <- postErr(ctx, s, chatBody) }()
		synctest.Wait() // request 1 waits to answer
		if st := s.Stats(); st.InFlight != 2 || st.Working != 0 {
			t.Errorf("stats %+v with a request hanging and one waiting: want 2 in flight, none working", st)
		}
		// Were a waiting request holding the only worker, this one would
		// never be answered (synctest reports the deadlock).
		if err := postErr(t.Context(), s, chatBody); err != nil {
			t.Fatal(err)
		}
		cancel()
		for range 2 {
			if err := <-waiting; err == nil {
				t.Error("a request given up was answered")
			}
		}
	})
}

// postErr is post for any goroutine: it returns an error where post fails
// the test, and for an answer other than 200.
func postErr(ctx context.Context, s *Server, body string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.URL()+"/chat/completions", strings.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	res, err := s.Client().Do(req)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		return err
	}
	if res.StatusCode != http.StatusOK {
		return fmt.Errorf("status %d: %s", res.StatusCode, b)
	}
	return nil
}

func TestRequestChecks(t *testing.T) {
	tests := []struct {
		name       string
		opts       Options
		header     http.Header
		body       string
		wantStatus int
		wantBody   string
	}{
		{"key missing", Options{APIKey: "k1"}, nil, chatBody, 401, `{"error":"Unauthorized"}`},
		{"key wrong openai", Options{APIKey: "k1", Dialect: OpenAI}, http.Header{"Authorization": {"Bearer k2"}}, chatBody, 401, "invalid_api_key"},
		{"key right", Options{APIKey: "k1"}, http.Header{"Authorization": {"Bearer k1"}}, chatBody, 200, `"finish_reason":"stop"`},
		{"unknown model", Options{Model: "served"}, nil, chatBody, 404, "The model `m` does not exist."},
		{"openai unknown fields", Options{Dialect: OpenAI}, nil, `{"model":"m","messages":[{"role":"user","content":"hi"}],"top_k":5,"return_token_ids":true}`, 400, "Unrecognized request argument supplied: return_token_ids, top_k"},
		{"vllm ignores unknown fields", Options{}, nil, `{"model":"m","messages":[{"role":"user","content":"hi"}],"top_k":5}`, 200, `"token_ids":null`},
		{"not json", Options{}, nil, `{"model":`, 400, "not a JSON object"},
		{"no messages", Options{}, nil, `{"model":"m","messages":[]}`, 400, "messages must not be empty"},
		{"stream", Options{}, nil, `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`, 400, "streaming"},
		{"text only", Options{TextOnly: true}, nil, chatBody, 400, "not a multimodal model"},
		{"max tokens", Options{}, nil, `{"model":"m","max_tokens":3,"messages":[{"role":"user","content":"hi"}]}`, 200, `"finish_reason":"length"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				tt.opts.NoLatency = true
				s := NewPipeServer(tt.opts)
				defer s.Close()
				res, body := post(t, s, tt.header, tt.body)
				if res.StatusCode != tt.wantStatus || !strings.Contains(string(body), tt.wantBody) {
					t.Errorf("got %d %s\nwant %d with %s", res.StatusCode, body, tt.wantStatus, tt.wantBody)
				}
			})
		})
	}
}

func TestModelsEndpoint(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := NewPipeServer(Options{Dialect: SGLang, Model: "qwen"})
		defer s.Close()
		res, err := s.Client().Get(s.URL() + "/models")
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		var got struct {
			Data []struct {
				ID      string `json:"id"`
				OwnedBy string `json:"owned_by"`
			} `json:"data"`
		}
		if err := json.NewDecoder(res.Body).Decode(&got); err != nil {
			t.Fatal(err)
		}
		want := []struct {
			ID      string `json:"id"`
			OwnedBy string `json:"owned_by"`
		}{{"qwen", "sglang"}}
		if diff := cmp.Diff(want, got.Data); diff != "" {
			t.Errorf("/v1/models (-want +got):\n%s", diff)
		}
	})
}

func TestListenLoopbackOnly(t *testing.T) {
	for _, addr := range []string{"0.0.0.0:0", ":0", "192.0.2.1:8000", "example.com:80"} {
		if s, err := Listen(addr, Options{}); err == nil {
			s.Close()
			t.Errorf("Listen(%q) succeeded, want a loopback error", addr)
		}
	}
}

func TestTCPServer(t *testing.T) {
	s := NewServer(Options{NoLatency: true, KeepRequests: true})
	defer s.Close()
	res, body := post(t, s, nil, chatBody)
	if res.StatusCode != 200 {
		t.Fatalf("status %d: %s", res.StatusCode, body)
	}
	reqs := s.Requests()
	if len(reqs) != 1 {
		t.Fatalf("Requests() has %d entries, want 1", len(reqs))
	}
	want := Request{
		Model: "m",
		Messages: []schema.Message{
			{Role: "system", Content: []schema.Part{schema.TextPart("You operate a Linux desktop. Answer with one tool call per step.")}},
			{Role: "user", Content: []schema.Part{schema.TextPart("Open the terminal"), schema.ImagePart("data:image/png;base64,AAAA")}},
		},
		Instruction:    "Open the terminal",
		Images:         1,
		Fields:         []string{"logprobs", "messages", "model", "return_token_ids"},
		Logprobs:       true,
		ReturnTokenIDs: true,
	}
	if diff := cmp.Diff(want, reqs[0]); diff != "" {
		t.Errorf("request (-want +got):\n%s", diff)
	}
}

// TestReleaseInvariants holds every release to what real servers do with
// the ids of a reply: the ids end with the end-of-turn id, which
// completion_tokens counts and the text leaves out; ids come back only in
// the forms the release knows; and a prompt that hit no cache gets details
// as the release sends them.
func TestReleaseInvariants(t *testing.T) {
	const reply = "It’s done."
	asks := map[string]string{
		"return_token_ids":           `"return_token_ids": true`,
		"return_tokens_as_token_ids": `"return_tokens_as_token_ids": true`,
		"return_meta_info":           `"return_meta_info": true, "return_prompt_token_ids": true`,
	}
	// forms lists, per release, the fields that give exact generated ids.
	forms := map[Dialect]map[Version][]string{
		VLLM: {
			VLLM0101: {"return_tokens_as_token_ids"},
			VLLM0102: {"return_token_ids", "return_tokens_as_token_ids"},
			Latest:   {"return_token_ids", "return_tokens_as_token_ids"},
		},
		SGLang: {
			SGLang04:   nil,
			SGLang0513: {"return_meta_info"},
			Latest:     {"return_token_ids", "return_meta_info"},
		},
		OpenAI: {Latest: nil},
	}
	for d, versions := range forms {
		if len(versions) != len(Versions(d)) {
			t.Errorf("%s: %d versions tested, %d exist", d, len(versions), len(Versions(d)))
		}
		for v, exact := range versions {
			for _, ask := range []string{"return_token_ids", "return_tokens_as_token_ids", "return_meta_info"} {
				t.Run(fmt.Sprintf("%s-%s-%s", d, v, ask), func(t *testing.T) {
					synctest.Test(t, func(t *testing.T) {
						s := NewPipeServer(Options{Dialect: d, Version: v, NoLatency: true, Script: func(Request) string { return reply }})
						defer s.Close()
						body := `{"model": "m", "logprobs": true, ` + asks[ask] + `, "messages": [{"role": "user", "content": "hi"}]}`
						res, b := post(t, s, nil, body)
						if d == OpenAI {
							if res.StatusCode != http.StatusBadRequest {
								t.Errorf("OpenAI answered %d to %s, want 400", res.StatusCode, ask)
							}
							return
						}
						var a answerIDs
						if err := json.Unmarshal(b, &a); err != nil || res.StatusCode != 200 {
							t.Fatalf("%d %s: %v", res.StatusCode, b, err)
						}
						ch := a.Choices[0]
						ids := a.exactIDs()
						if want := slices.Contains(exact, ask); (ids != nil) != want {
							t.Fatalf("exact ids for %s: %v, want them: %v\n%s", ask, ids, want, b)
						}
						if ids != nil {
							if ids[len(ids)-1] != EndOfTurn || len(ids) != a.Usage.CompletionTokens || len(ids) != len(ch.Logprobs.Content) {
								t.Errorf("ids %v: want %d of them ending with %d, one per logprob", ids, a.Usage.CompletionTokens, EndOfTurn)
							}
						}
						if ch.Message.Content != reply {
							t.Errorf("content %q, want %q (no end-of-turn text)", ch.Message.Content, reply)
						}
						// The first call of a server hits no cache.
						if null := string(a.Usage.Details) == "null"; d == VLLM && null != (v != Latest) {
							t.Errorf("prompt_tokens_details %s at 0 cached on vllm %s", a.Usage.Details, v)
						}
					})
				})
			}
		}
	}
}

// answerIDs is the part of an answer that carries generated ids, in every
// form.
type answerIDs struct {
	Choices []struct {
		Message struct {
			Content string `json:"content"`
		} `json:"message"`
		Logprobs struct {
			Content []struct {
				Token string `json:"token"`
			} `json:"content"`
		} `json:"logprobs"`
		TokenIDs []int64 `json:"token_ids"`
		MetaInfo *struct {
			OutputTokenLogprobs [][3]any `json:"output_token_logprobs"`
		} `json:"meta_info"`
	} `json:"choices"`
	Usage struct {
		CompletionTokens int             `json:"completion_tokens"`
		Details          json.RawMessage `json:"prompt_tokens_details"`
	} `json:"usage"`
}

// exactIDs returns the generated ids in whichever form the answer has
// them, or nil.
func (a *answerIDs) exactIDs() []int64 {
	ch := a.Choices[0]
	switch {
	case ch.TokenIDs != nil:
		return ch.TokenIDs
	case ch.MetaInfo != nil:
		var ids []int64
		for _, e := range ch.MetaInfo.OutputTokenLogprobs {
			ids = append(ids, int64(e[1].(float64)))
		}
		return ids
	case len(ch.Logprobs.Content) > 0 && strings.HasPrefix(ch.Logprobs.Content[0].Token, "token_id:"):
		var ids []int64
		for _, c := range ch.Logprobs.Content {
			var id int64
			fmt.Sscanf(c.Token, "token_id:%d", &id)
			ids = append(ids, id)
		}
		return ids
	}
	return nil
}

func TestOptionsValidate(t *testing.T) {
	tests := []struct {
		name string
		opts Options
		want string // "" for valid
	}{
		{"zero", Options{}, ""},
		{"sglang", Options{Dialect: SGLang, ImageTokens: 64}, ""},
		{"dialect", Options{Dialect: "tgi"}, `unknown dialect "tgi"`},
		{"image tokens", Options{ImageTokens: -1}, "ImageTokens -1"},
		{"cache blocks", Options{CacheBlocks: -5}, "CacheBlocks -5"},
		{"retry after", Options{RetryAfter: -time.Second}, "RetryAfter -1s"},
		{"first byte", Options{FirstByteDelay: -time.Second}, "FirstByteDelay -1s"},
		{"version", Options{Dialect: SGLang, Version: "0.10.2"}, `unknown sglang version "0.10.2": want one of 0.4, 0.5.13, latest`},
		{"image limit", Options{ImageLimit: -1}, "ImageLimit -1"},
		{"workers", Options{Workers: -1}, "Workers -1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.opts.Validate()
			if (err == nil) != (tt.want == "") || err != nil && !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Validate() = %v, want %q", err, tt.want)
			}
			if tt.want != "" {
				if _, err := Listen("127.0.0.1:0", tt.opts); err == nil {
					t.Error("Listen accepted options Validate refuses")
				}
			}
		})
	}
}

func TestCheckAddr(t *testing.T) {
	for addr, want := range map[string]string{
		"127.0.0.1:8000":  "",
		"[::1]:0":         "",
		"localhost:65535": "",
		"0.0.0.0:8000":    "not a loopback address",
		"127.0.0.1:65536": "want 0 (any free port) to 65535",
		"127.0.0.1:-1":    "want 0 (any free port) to 65535",
		"127.0.0.1":       "want HOST:PORT",
	} {
		err := CheckAddr(addr)
		if (err == nil) != (want == "") || err != nil && !strings.Contains(err.Error(), want) {
			t.Errorf("CheckAddr(%q) = %v, want %q", addr, err, want)
		}
	}
}

func TestFaultText(t *testing.T) {
	for _, f := range []Fault{NoFault, FaultServerError, FaultLogprobsMismatch} {
		b, err := f.MarshalText()
		if err != nil {
			t.Fatal(err)
		}
		var got Fault
		if err := got.UnmarshalText(b); err != nil || got != f {
			t.Errorf("UnmarshalText(%q) = %v, %v; want %v", b, got, err, f)
		}
	}
	var f Fault
	if err := f.UnmarshalText([]byte("explode")); err == nil || !strings.Contains(err.Error(), `unknown fault "explode"`) {
		t.Errorf("UnmarshalText(explode) = %v, want an unknown-fault error", err)
	}
}
