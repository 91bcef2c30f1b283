package schema

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
	"github.com/google/go-cmp/cmp"
)

// fill sets every field v reaches to a value other than its zero: strings,
// numbers, booleans, one element in each slice and map, every pointer
// allocated, raw JSON an object. seed varies the values.
func fill(v reflect.Value, seed int) {
	switch v.Kind() {
	case reflect.String:
		v.SetString("s<é>\"" + string(rune('a'+seed%26)))
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(int64(seed + 1))
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(uint64(seed + 1))
	case reflect.Float32, reflect.Float64:
		v.SetFloat(float64(seed) + 0.25)
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Pointer:
		v.Set(reflect.New(v.Type().Elem()))
		fill(v.Elem(), seed+1)
	case reflect.Slice:
		if v.Type() == reflect.TypeFor[json.RawMessage]() {
			v.SetBytes([]byte(`{"raw":[1,"x"]}`))
			return
		}
		v.Set(reflect.MakeSlice(v.Type(), 1, 1))
		fill(v.Index(0), seed+1)
	case reflect.Map:
		v.Set(reflect.MakeMap(v.Type()))
		k, e := reflect.New(v.Type().Key()).Elem(), reflect.New(v.Type().Elem()).Elem()
		fill(k, seed+1)
		fill(e, seed+2)
		v.SetMapIndex(k, e)
	case reflect.Struct:
		if v.Type() == reflect.TypeFor[Time]() {
			v.Set(reflect.ValueOf(Time{time.Date(2025, 3, 1, 12, 0, seed, 125_000_000, time.UTC)}))
			return
		}
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				fill(v.Field(i), seed+i)
			}
		}
	case reflect.Interface:
		v.Set(reflect.ValueOf("any"))
	}
}

// everyField returns a record with every field set (fill).
func everyField() Record {
	var every Record
	fill(reflect.ValueOf(&every).Elem(), 0)
	every.Schema = Version
	return every
}

// fixtureLines returns the lines of the export fixture runs' records.
func fixtureLines(t testing.TB) [][]byte {
	t.Helper()
	var lines [][]byte
	for _, f := range []string{"../export/testdata/run/rollouts.jsonl", "../export/testdata/run-loose/rollouts.jsonl"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		lines = append(lines, bytes.Split(bytes.TrimSpace(b), []byte("\n"))...)
	}
	return lines
}

// TestParseRecordAgrees: parseRecord (encoding/json/v2) reads a record
// encoding/json wrote into the same value encoding/json reads, for a record
// with every field set, fullRecord, and the records of the fixture runs.
func TestParseRecordAgrees(t *testing.T) {
	every := everyField()
	lines := [][]byte{[]byte(line(t, &every)), []byte(line(t, fullRecord("r-full")))}
	lines = append(lines, fixtureLines(t)...)
	requests := 0
	for i, line := range lines {
		var want Record
		if err := json.Unmarshal(line, &want); err != nil {
			t.Fatal(err)
		}
		got, err := parseRecord(line)
		if err != nil {
			t.Fatalf("line %d: %v", i, err)
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("line %d (-encoding/json +parseRecord):\n%s", i, diff)
		}
		got, _, err = parseRecordText(line, ReadOptions{})
		if err != nil {
			t.Fatalf("line %d: parseRecordText: %v", i, err)
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("line %d (-encoding/json +parseRecordText):\n%s", i, diff)
		}
		// With the last request only: the same record, each earlier
		// step's request nil.
		last := want
		last.Steps = slices.Clone(want.Steps)
		for k := range max(len(last.Steps)-1, 0) {
			last.Steps[k].Request = nil
		}
		lastOnly := ReadOptions{NoRequests: true, LastRequest: true}
		got, _, err = parseRecordText(line, lastOnly)
		if err != nil {
			t.Fatalf("line %d: parseRecordText with the last request: %v", i, err)
		}
		if diff := cmp.Diff(last, got); diff != "" {
			t.Errorf("line %d (-encoding/json with the last request +parseRecordText LastRequest):\n%s", i, diff)
		}
		if got, err = parseRecordOpts(line, lastOnly); err != nil {
			t.Fatalf("line %d: parseRecordOpts with the last request: %v", i, err)
		}
		if diff := cmp.Diff(last, got); diff != "" {
			t.Errorf("line %d (-encoding/json with the last request +parseRecordOpts LastRequest):\n%s", i, diff)
		}
		// Without requests: the same record, each step's request nil.
		got, _, err = parseRecordText(line, ReadOptions{NoRequests: true})
		if err != nil {
			t.Fatalf("line %d: parseRecordText without requests: %v", i, err)
		}
		for k := range want.Steps {
			requests += len(want.Steps[k].Request)
			want.Steps[k].Request = nil
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("line %d (-encoding/json without requests +parseRecordText NoRequests):\n%s", i, diff)
		}
		got, err = parseRecordOpts(line, ReadOptions{NoRequests: true})
		if err != nil {
			t.Fatalf("line %d: parseRecordOpts without requests: %v", i, err)
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("line %d (-encoding/json without requests +parseRecordOpts NoRequests):\n%s", i, diff)
		}
	}
	if requests == 0 {
		t.Error("no request to leave out")
	}
	if every.Env == nil || every.Steps[0].Response.TokenIDs == nil {
		t.Fatal("fill left fields empty")
	}
}

// TestNoRequestsChecksThem: a record read without its requests is refused
// where a request is not an array of strings, as it is when read whole; a
// request of strings with escapes and whitespace is skipped whole.
func TestNoRequestsChecksThem(t *testing.T) {
	for _, tt := range []struct {
		request string
		ok      bool
	}{
		{`[]`, true}, {`null`, true}, {`["a","b"]`, true}, {` [ "a" , "b" ] `, true},
		{`["a\"b]","c\\",  "\u005d"]`, true}, {`["[","]",","]`, true},
		{`[1]`, false}, {`["a",1]`, false}, {`[null]`, true}, {`["a", null]`, true}, {`["a",["b"]]`, false},
		{`{}`, false}, {`"a"`, false}, {`true`, false}, {`[{"a":"b"}]`, false},
	} {
		line := []byte(`{"schema":"` + Version + `","steps":[{"request":` + tt.request + `,"prompt_token_chunks":["x"]}],"task_id":"t"}`)
		whole, _, errWhole := parseRecordText(line, ReadOptions{})
		rec, _, err := parseRecordText(line, ReadOptions{NoRequests: true})
		plain, errPlain := parseRecordOpts(line, ReadOptions{NoRequests: true})
		if (errWhole == nil) != tt.ok || (err == nil) != tt.ok || (errPlain == nil) != tt.ok {
			t.Errorf("request %s: read whole: %v; without requests: %v, and without text: %v; want ok %v", tt.request, errWhole, err, errPlain, tt.ok)
			continue
		}
		if !tt.ok {
			continue
		}
		for _, rec := range []Record{rec, plain} {
			if rec.Steps[0].Request != nil || rec.TaskID != "t" || !slices.Equal(rec.Steps[0].PromptTokenChunks, []string{"x"}) {
				t.Errorf("request %s: read without requests as %+v", tt.request, rec.Steps[0])
			}
		}
		if tt.request != "null" && tt.request != "[]" && len(whole.Steps[0].Request) == 0 {
			t.Errorf("request %s: read whole as %q", tt.request, whole.Steps[0].Request)
		}
	}
}

// TestNumberArrays holds the record decoding's arrays of ids and logprobs
// to encoding/json: the same values, and an error where it gives one, on
// hand-picked edges (nulls, ranges, fractions in ids, whitespace) and on
// random arrays as encoding/json writes them.
func TestNumberArrays(t *testing.T) {
	type arrays struct {
		I []int64   `json:"i"`
		F []float64 `json:"f"`
	}
	var texts []string
	for _, a := range []string{
		`[]`, `[ ]`, `null`, `[0]`, `[-0]`, `[1,2,3]`, `[ 1 , 2 ]`, "[\n1,\t2\r]",
		`[9223372036854775807]`, `[-9223372036854775808]`, `[9223372036854775808]`,
		`[-9223372036854775809]`, `[18446744073709551616]`, `[99999999999999999999]`,
		`[1.5]`, `[1e3]`, `[1E+2]`, `[-1e-2]`, `[null]`, `[1,null,2]`, `["1"]`, `[[1]]`, `[{}]`,
		`[true]`, `[0.1,0.2]`, `[5e-324]`, `[2.4703282292062328e-324]`, `[1e400]`, `[-1e400]`,
		`[1.7976931348623157e308]`, `[-0.0]`, `[1e-400]`,
	} {
		texts = append(texts, `{"i":`+a+`}`, `{"f":`+a+`}`)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 500 {
		var a arrays
		for range rng.IntN(40) {
			a.I = append(a.I, rng.Int64()>>rng.IntN(64)*int64(1-2*rng.IntN(2)))
			a.F = append(a.F, -rng.ExpFloat64()*math.Pow(10, float64(rng.IntN(40)-20)))
		}
		b, err := json.Marshal(a)
		if err != nil {
			t.Fatal(err)
		}
		texts = append(texts, string(b))
	}
	for _, text := range texts {
		var want, got arrays
		wantErr := json.Unmarshal([]byte(text), &want)
		gotErr := jsonv2.Unmarshal([]byte(text), &got, recordDecoding)
		if (wantErr == nil) != (gotErr == nil) {
			t.Errorf("%s: encoding/json's error %v, record decoding's %v", text, wantErr, gotErr)
			continue
		}
		if wantErr != nil {
			continue
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("%s (-encoding/json +record decoding):\n%s", text, diff)
		}
		for i := range want.F {
			if math.Signbit(want.F[i]) != math.Signbit(got.F[i]) {
				t.Errorf("%s: element %d is %v, encoding/json's %v", text, i, got.F[i], want.F[i])
			}
		}
	}
}

// TestRecordText: the text a record keeps of each step's logprobs is what
// encoding/json writes for them (what export would format) and parses to
// their values, for records read in parallel batches; there is none for
// logprobs held otherwise (null elements, whitespace, empty, absent) or
// replaced after reading.
func TestRecordText(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	var lines bytes.Buffer
	var want [][][]float64 // per record, per step: the logprobs written
	for r := range 300 {
		rec := fullRecord(fmt.Sprintf("r-%d", r))
		rec.Steps = nil
		var steps [][]float64
		for range rng.IntN(6) + 1 {
			var lps []float64
			switch rng.IntN(5) {
			case 0: // none
			case 1:
				lps = []float64{}
			default:
				for range rng.IntN(30) + 1 {
					lps = append(lps, -rng.ExpFloat64()*math.Pow(10, float64(rng.IntN(30)-25)))
				}
			}
			steps = append(steps, lps)
			rec.Steps = append(rec.Steps, Step{Response: Response{Content: "x", TokenIDs: make([]int64, len(lps)), Logprobs: lps}})
		}
		b, err := json.Marshal(rec)
		if err != nil {
			t.Fatal(err)
		}
		lines.Write(b)
		lines.WriteByte('\n')
		want = append(want, steps)
	}
	n := 0
	texts := 0
	_, err := ReadRecordsText(&lines, func(rec Record, text *RecordText, line int) error {
		steps := want[line-1]
		for i, lps := range steps {
			got := text.Logprobs(&rec, i)
			if len(lps) == 0 {
				if got != nil {
					t.Errorf("line %d step %d: text %q for logprobs %v", line, i, got, lps)
				}
				continue
			}
			texts++
			canon, err := json.Marshal(lps)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != string(canon[1:len(canon)-1]) {
				t.Errorf("line %d step %d: text %q, want %s", line, i, got, canon)
			}
			var back []float64
			if err := json.Unmarshal([]byte("["+string(got)+"]"), &back); err != nil || !slices.Equal(back, rec.Steps[i].Response.Logprobs) {
				t.Errorf("line %d step %d: text %q parses to %v (%v), logprobs %v", line, i, got, back, err, rec.Steps[i].Response.Logprobs)
			}
		}
		n++
		return nil
	})
	if err != nil || n != len(want) || texts == 0 {
		t.Fatalf("read %d of %d records, %d texts: %v", n, len(want), texts, err)
	}

	held := func(lps string) (Record, *RecordText) {
		t.Helper()
		rec, text, err := parseRecordText([]byte(`{"schema":"`+Version+`","steps":[{"response":{"logprobs":`+lps+`}}]}`), ReadOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return rec, text
	}
	for _, lps := range []string{`[-0.5, -1]`, "[-0.5,\n-1]", `[-0.5,null]`, `[]`, `null`} {
		if rec, text := held(lps); text.Logprobs(&rec, 0) != nil {
			t.Errorf("logprobs %s: text %q, want none", lps, text.Logprobs(&rec, 0))
		}
	}
	rec, text := held(`[-0.5,-1e-7]`)
	if got := text.Logprobs(&rec, 0); string(got) != "-0.5,-1e-7" {
		t.Errorf("text %q, want -0.5,-1e-7", got)
	}
	if got := text.Logprobs(&rec, 1); got != nil {
		t.Errorf("text of a step past the record's: %q", got)
	}
	if got := (*RecordText)(nil).Logprobs(&rec, 0); got != nil {
		t.Errorf("nil RecordText: text %q", got)
	}
	rec.Steps[0].Response.Logprobs = slices.Clone(rec.Steps[0].Response.Logprobs)
	if got := text.Logprobs(&rec, 0); got != nil {
		t.Errorf("logprobs replaced after reading: text %q, want none", got)
	}
}

// TestRecordsOutliveTheirBatch: records and their texts kept past the read
// hold what their lines said, though the read's batches of lines are read
// into again (a string, raw call or text aliasing a batch would have been
// overwritten by a later line).
func TestRecordsOutliveTheirBatch(t *testing.T) {
	var lines bytes.Buffer
	var want []Record
	for r := 0; lines.Len() < 12*readBatchBytes; r++ {
		rec := fullRecord(fmt.Sprintf("r-%d", r))
		rec.TaskID = strings.Repeat(fmt.Sprintf("task %d ", r), 2000) // lines of ~20 KB
		rec.Steps[0].Actions[0].Call = json.RawMessage(fmt.Sprintf(`{"action":"left_click","coordinate":[%d,300]}`, r))
		rec.Steps[0].Response.Logprobs = []float64{-float64(r) - 1, -0.5}
		rec.Steps[0].Response.TokenIDs = []int64{int64(r), 7}
		b, err := json.Marshal(rec)
		if err != nil {
			t.Fatal(err)
		}
		lines.Write(b)
		lines.WriteByte('\n')
		var back Record // as encoding/json reads the line
		if err := json.Unmarshal(b, &back); err != nil {
			t.Fatal(err)
		}
		want = append(want, back)
	}
	var got []Record
	var texts []*RecordText
	if _, err := ReadRecordsText(bytes.NewReader(lines.Bytes()), func(rec Record, text *RecordText, _ int) error {
		got, texts = append(got, rec), append(texts, text)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("records kept past the read (-want +got):\n%s", diff)
	}
	for r := range got {
		if text, w := texts[r].Logprobs(&got[r], 0), fmt.Sprintf("%d,-0.5", -r-1); string(text) != w {
			t.Fatalf("record %d: logprobs text %q, want %q", r, text, w)
		}
	}
}

// TestLazyLogprobs: a record read with its logprobs left as text
// (ReadOptions.LazyLogprobs) holds NaNs where the text is kept, the same
// text, and after ParseLogprobs the values read without it, -0 included;
// a line read without it is refused with the same error. Arrays the text
// cannot stand for (null elements, whitespace, a number out of range, an
// exponent too large to be sure of) are decoded at once.
func TestLazyLogprobs(t *testing.T) {
	arrays := []string{
		`[]`, `[ ]`, `null`, `[0]`, `[-0]`, `[-0.0]`, `[1,2,3]`, `[ 1 , 2 ]`, "[\n1,\t2\r]", `[-0.5,-1e-7]`,
		`[1.5]`, `[1e3]`, `[1E+2]`, `[-1e-2]`, `[null]`, `[1,null,2]`, `["1"]`, `[[1]]`, `[{}]`, `[true]`,
		`[5e-324]`, `[2.4703282292062328e-324]`, `[1e400]`, `[-1e400]`, `[1e308]`, `[9e307]`, `[99e307]`,
		`[1.7976931348623157e308]`, `[1.8e308]`, `[1e-400]`, `[0.000e999]`, `[1e0999]`, `[-1e-99999]`,
		`[` + strings.Repeat("9", 308) + `]`, `[` + strings.Repeat("9", 309) + `]`, `[` + strings.Repeat("9", 400) + `.5]`,
	}
	rng := rand.New(rand.NewPCG(7, 8))
	for range 300 {
		var lps []float64
		for range rng.IntN(20) + 1 {
			lps = append(lps, -rng.ExpFloat64()*math.Pow(10, float64(rng.IntN(40)-30)))
		}
		b, err := json.Marshal(lps)
		if err != nil {
			t.Fatal(err)
		}
		arrays = append(arrays, string(b))
	}
	lazy := 0
	for _, a := range arrays {
		line := []byte(`{"schema":"` + Version + `","rollout_id":"r","steps":[{"response":{"token_ids":[1],"logprobs":` + a + `}},{"response":{"logprobs":[-2]}}]}`)
		want, wantText, wantErr := parseRecordText(line, ReadOptions{})
		got, text, err := parseRecordText(line, ReadOptions{LazyLogprobs: true})
		if fmt.Sprint(err) != fmt.Sprint(wantErr) {
			t.Errorf("logprobs %s: error %v, want %v", a, err, wantErr)
			continue
		}
		if err != nil {
			continue
		}
		for i := range want.Steps {
			if g, w := text.Logprobs(&got, i), wantText.Logprobs(&want, i); string(g) != string(w) {
				t.Errorf("logprobs %s step %d: text %q, want %q", a, i, g, w)
			}
		}
		lp := got.Steps[0].Response.Logprobs
		if slices.ContainsFunc(lp, math.IsNaN) {
			lazy++
			if slices.ContainsFunc(lp, func(f float64) bool { return !math.IsNaN(f) }) || text.Logprobs(&got, 0) == nil {
				t.Errorf("logprobs %s: %v left unparsed in part, or without their text", a, lp)
			}
		}
		for range 2 { // the second time does nothing
			if err := text.ParseLogprobs(&got); err != nil {
				t.Fatalf("logprobs %s: %v", a, err)
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("logprobs %s, parsed after reading (-at once +after):\n%s", a, diff)
			}
		}
		for i, f := range got.Steps[0].Response.Logprobs {
			if math.Signbit(f) != math.Signbit(want.Steps[0].Response.Logprobs[i]) {
				t.Errorf("logprobs %s: element %d is %v, want %v", a, i, f, want.Steps[0].Response.Logprobs[i])
			}
		}
	}
	if lazy < 300 {
		t.Errorf("%d of %d arrays left as text, want the plain ones (300 or more)", lazy, len(arrays))
	}
	if err := (*RecordText)(nil).ParseLogprobs(&Record{}); err != nil {
		t.Errorf("nil RecordText: %v", err)
	}
}

// FuzzLazyNumbers: an array lazyNumbers takes as text parses, number by
// number, to finite values, as many as it said, which the decoder reads
// too: leaving it unparsed never hides an error or a count.
func FuzzLazyNumbers(f *testing.F) {
	for _, seed := range []string{"1", "-0.5,-1e-7", "1e308", "9e307", "1e-99999", "1,2,", " 1", "1e+308", "0.1E2", "99e307"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, body string) {
		raw := []byte("[" + body + "]")
		if !jsontext.Value(raw).IsValid() {
			return
		}
		n, ok := lazyNumbers(raw)
		if !ok {
			return
		}
		var vals []float64
		if err := jsonv2.Unmarshal(raw, &vals); err != nil || len(vals) != n {
			t.Fatalf("%s: taken as %d numbers, decoded to %v (%v)", raw, n, vals, err)
		}
		for i, num := range strings.Split(body, ",") {
			f, err := strconv.ParseFloat(num, 64)
			if err != nil || math.IsInf(f, 0) || f != vals[i] {
				t.Fatalf("%s: number %d %q parses to %v (%v), decoded %v", raw, i, num, f, err, vals[i])
			}
		}
	})
}
