package grade

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"testing"

	"legato/rl/desktop"
	"legato/rl/desktop/osworld/grade/pystr"
)

// Fuzz targets, one per native metric, comparing it with CPython running
// the same metric on the same inputs: the fixture checkout's Python
// versions of OSWorld's metrics (standard library only), or those of the
// OSWorld checkout in LEGATO_OSWORLD_DIR when it imports them. One bridge
// process per fuzz worker is the oracle.
//
//	go test -run '^$' -fuzz FuzzLiteralMatch ./desktop/osworld/grade/

// metricOracle grades natively and through CPython.
type metricOracle struct {
	native, python *Grader
}

func newMetricOracle(f *testing.F, metric string) *metricOracle {
	python := needPython(f)
	dir := fixtureDir(f)
	if d := os.Getenv("LEGATO_OSWORLD_DIR"); d != "" {
		dir = d
	}
	o := &metricOracle{
		native: newNativeGrader(f, GraderConfig{Mode: NativeOnly}),
		python: newNativeGrader(f, GraderConfig{OSWorldDir: dir, Python: python}),
	}
	cat, err := o.python.loadCatalog(context.Background())
	if err != nil {
		f.Fatal(err)
	}
	if reason, ok := cat.metrics[metric]; !ok || reason != "" {
		f.Skipf("%s does not import from %s: %s", metric, dir, reason)
	}
	return o
}

// compare grades c both ways and fails on any difference in score or in
// the exception raised.
func (o *metricOracle) compare(t *testing.T, c metricCase) {
	task := caseTask(t, c)
	if _, err := ParseEvaluator(task.Evaluator); err != nil {
		t.Skip("not an evaluator:", err)
	}
	ctx := context.Background()
	ns, nerr := o.native.Grade(ctx, task, desktop.DoneAction)
	ps, perr := o.python.Grade(ctx, task, desktop.DoneAction)
	if got, want := outcomeOf(t, ns, nerr), outcomeOf(t, ps, perr); got != want {
		t.Fatalf("%s(result=%s, expected=%s, options=%s): native %+v (%v), python %+v (%v)",
			c.metric, c.result, c.expected, c.options, got, nerr, want, perr)
	}
}

// fuzzText turns fuzz bytes into a Python str: bytes that are not UTF-8
// become the Greek letters at U+0380 + byte, where the final sigma is.
func fuzzText(data string) string {
	var b []byte
	for i := 0; i < len(data); {
		r, n := pystr.DecodeRune(data[i:])
		if r == 0xFFFD && n == 1 {
			r = 0x300 + rune(data[i])
		}
		b = pystr.AppendRune(b, r)
		i += n
	}
	return string(b)
}

// jsonValue is data when it is a JSON text (as a task can hold), else data
// as a JSON string.
func jsonValue(data string) string {
	if json.Valid([]byte(data)) {
		return data
	}
	return jsonString(fuzzText(data))
}

// fuzzJSONMetric fuzzes a metric(result, rules, **options) of JSON values.
func fuzzJSONMetric(f *testing.F, metric string, seeds ...[3]string) {
	o := newMetricOracle(f, metric)
	for _, c := range metricCases {
		if c.metric == metric && c.resultFile == nil && c.expectedFile == nil {
			f.Add(c.result, c.expected, c.options)
		}
	}
	for _, s := range seeds {
		f.Add(s[0], s[1], s[2])
	}
	f.Fuzz(func(t *testing.T, result, rules, options string) {
		c := metricCase{metric: metric, result: jsonValue(result), expected: jsonValue(rules)}
		if options != "" && json.Valid([]byte(options)) {
			c.options = options
		}
		o.compare(t, c)
	})
}

func FuzzExactMatch(f *testing.F) {
	fuzzJSONMetric(f, "exact_match",
		[3]string{`"ΟΔΟΣ"`, `{"expected":"ΟΔΟΣ"}`, ""}, [3]string{`[NaN]`, `{"expected":[1]}`, ""},
		[3]string{`"\ud800"`, `{"expected":"\ud800"}`, ""})
}

func FuzzMatchInList(f *testing.F) {
	fuzzJSONMetric(f, "match_in_list",
		[3]string{`"Σ"`, `{"expected":"ΟΔΟΣ"}`, ""}, [3]string{`"\udc00"`, `{"expected":["\udc00"]}`, ""})
}

func FuzzIsInList(f *testing.F) {
	fuzzJSONMetric(f, "is_in_list",
		[3]string{`"ΟΔΟΣ"`, `{"expected":"Σ"}`, ""}, [3]string{`{"Σ":1}`, `{"expected":"Σ"}`, ""})
}

func FuzzCheckIncludeExclude(f *testing.F) {
	o := newMetricOracle(f, "check_include_exclude")
	f.Add(`"ΟΔΟΣ οδος"`, "οδος", "ΟΔΟΣ", "")
	f.Fuzz(func(t *testing.T, result, include, exclude, rules string) {
		r := fmt.Sprintf(`{"include":[%s],"exclude":[%s]}`, jsonString(fuzzText(include)), jsonString(fuzzText(exclude)))
		if rules != "" && json.Valid([]byte(rules)) {
			r = rules
		}
		o.compare(t, metricCase{metric: "check_include_exclude", result: jsonValue(result), expected: r})
	})
}

func FuzzLiteralMatch(f *testing.F) {
	o := newMetricOracle(f, "literal_match")
	f.Add("ΟΔΟΣ", "οδος", true, false)
	f.Add("İΣ", "i̇ς", true, true)
	f.Add("ΑΣ\u0345Α", "ασ\u0345α", true, false)
	f.Fuzz(func(t *testing.T, result, expected string, ignoreCase, list bool) {
		c := metricCase{metric: "literal_match", result: jsonValue(result), expected: jsonValue(expected),
			options: fmt.Sprintf(`{"ignore_case":%v}`, ignoreCase)}
		if list {
			c.result, c.expected = "["+jsonString(fuzzText(result))+"]", "["+jsonString(fuzzText(expected))+"]"
			c.options = fmt.Sprintf(`{"type":"list","ignore_case":%v}`, ignoreCase)
		}
		o.compare(t, c)
	})
}

func FuzzCheckDirectJSONObject(f *testing.F) {
	o := newMetricOracle(f, "check_direct_json_object")
	f.Add(`{'a': 'ΟΔΟΣ'}`, `{"expected":{"a":"ΟΔΟΣ"}}`)
	f.Add(`  {"a": [NaN, 1e400]} `, `{"expected":{"a":[1]},"ignore_list_order":true}`)
	f.Add(`{"a": "\ud800x"}`, `{"expect_in_result":true,"expected":{"a":"\ud800"}}`)
	f.Fuzz(func(t *testing.T, text, rules string) {
		if !json.Valid([]byte(rules)) {
			rules = `{"expected":{"a":` + jsonString(fuzzText(rules)) + `}}`
		}
		o.compare(t, metricCase{metric: "check_direct_json_object", result: jsonString(fuzzText(text)), expected: rules})
	})
}

func FuzzCompareTextFile(f *testing.F) {
	o := newMetricOracle(f, "compare_text_file")
	f.Add([]byte("ΟΔΟΣ\r\nx\x1c y"), []byte("οδος\nx y"), true, true)
	f.Add([]byte("\xed\xa0\x80"), []byte("x"), false, false)
	f.Fuzz(func(t *testing.T, actual, expected []byte, ignoreBlanks, ignoreCase bool) {
		a, e := string(actual), string(expected)
		o.compare(t, metricCase{metric: "compare_text_file", resultFile: &a, expectedFile: &e,
			options: fmt.Sprintf(`{"ignore_blanks":%v,"ignore_case":%v}`, ignoreBlanks, ignoreCase)})
	})
}

func FuzzDiffTextFile(f *testing.F) {
	o := newMetricOracle(f, "diff_text_file")
	f.Add([]byte("a\u2028b\rc\r\nd"), []byte("a\nb\nc\nd\n"))
	f.Fuzz(func(t *testing.T, result, expected []byte) {
		r, e := string(result), string(expected)
		o.compare(t, metricCase{metric: "diff_text_file", resultFile: &r, expectedFile: &e})
	})
}

// FuzzCheckGnomeFavoriteApps fuzzes the text eval() reads; a text the
// native eval refuses (Python it does not evaluate) is skipped.
func FuzzCheckGnomeFavoriteApps(f *testing.F) {
	o := newMetricOracle(f, "check_gnome_favorite_apps")
	for _, s := range evalInputs {
		f.Add(s, `["a"]`)
	}
	f.Add("['a', \"b\",\n]", `["b","a"]`)
	f.Fuzz(func(t *testing.T, text, expected string) {
		text = fuzzText(text)
		var refused *errEvalUnsupported
		if _, err := pyEvalStrings(text); errors.As(err, &refused) {
			t.Skip("refused natively:", err)
		}
		o.compare(t, metricCase{metric: "check_gnome_favorite_apps", result: jsonString(text),
			expected: `{"expected":` + jsonValue(expected) + `}`})
	})
}

func FuzzCheckTextEnlarged(f *testing.F) {
	o := newMetricOracle(f, "check_text_enlarged")
	for _, s := range []string{"1.25\n", "\u3000\u0661_\u0665\u00a0", "-iNf", "1e1_0", "0x1p3", "\x1c1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, text string) {
		o.compare(t, metricCase{metric: "check_text_enlarged", result: jsonValue(text)})
	})
}
