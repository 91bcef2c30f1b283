package grade

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// metricCase is a native metric call with hand-computed outcome. Result
// and expected are JSON; a file's content in resultFile / expectedFile
// makes that argument the file's path instead ("-" for a path that does
// not exist).
type metricCase struct {
	name         string
	metric       string
	result       string
	expected     string // "" for none
	options      string // "" for {}
	resultFile   *string
	expectedFile *string
	want         float64
	wantRaise    string // Python exception type, "" for a score
}

func text(s string) *string { return &s }

func (c metricCase) run(t *testing.T) (float64, error) {
	t.Helper()
	dir := t.TempDir()
	arg := func(jsonText string, file *string, name string) any {
		if file != nil {
			p := filepath.Join(dir, name)
			if *file != "-" {
				if err := os.WriteFile(p, []byte(*file), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			return p
		}
		v, err := decodePy([]byte(jsonText))
		if err != nil {
			t.Fatalf("bad JSON %q: %v", jsonText, err)
		}
		return v
	}
	result := arg(c.result, c.resultFile, "result.txt")
	var expected any
	hasExpected := c.expected != "" || c.expectedFile != nil
	if hasExpected {
		expected = arg(c.expected, c.expectedFile, "expected.txt")
	}
	opts := c.options
	if opts == "" {
		opts = "{}"
	}
	o, err := decodePy([]byte(opts))
	if err != nil {
		t.Fatal(err)
	}
	m, ok := nativeMetricFor(c.metric)
	if !ok {
		t.Fatalf("no native %s", c.metric)
	}
	return m.call(c.metric, result, expected, hasExpected, o.(*pyDict))
}

// metricCases are shared with the differential tests against Python.
var metricCases = []metricCase{
	// exact_match(result, rules)
	{name: "exact: same text", metric: "exact_match", result: `"100\n"`, expected: `{"expected":"100\n"}`, want: 1},
	{name: "exact: missing newline", metric: "exact_match", result: `"100"`, expected: `{"expected":"100\n"}`, want: 0},
	{name: "exact: int equals float", metric: "exact_match", result: `1`, expected: `{"expected":1.0}`, want: 1},
	{name: "exact: True equals 1", metric: "exact_match", result: `true`, expected: `{"expected":1}`, want: 1},
	{name: "exact: dict order ignored", metric: "exact_match", result: `{"a":1,"b":[2,3]}`, expected: `{"expected":{"b":[2,3],"a":1}}`, want: 1},
	{name: "exact: None", metric: "exact_match", result: `null`, expected: `{"expected":null}`, want: 1},
	{name: "exact: str is not int", metric: "exact_match", result: `"1"`, expected: `{"expected":1}`, want: 0},
	{name: "exact: no expected key", metric: "exact_match", result: `"x"`, expected: `{}`, wantRaise: "KeyError"},
	{name: "exact: rules a list", metric: "exact_match", result: `"x"`, expected: `["expected"]`, wantRaise: "TypeError"},
	{name: "exact: unknown option", metric: "exact_match", result: `"x"`, expected: `{"expected":"x"}`, options: `{"ignore_case":true}`, wantRaise: "TypeError"},
	{name: "exact: rules by keyword", metric: "exact_match", result: `"x"`, options: `{"rules":{"expected":"x"}}`, want: 1},
	{name: "exact: no rules at all", metric: "exact_match", result: `"x"`, wantRaise: "TypeError"},

	// check_include_exclude(result, rules)
	{name: "incl: included", metric: "check_include_exclude", result: `"use terminal\n"`, expected: `{"include":["use terminal"]}`, want: 1},
	{name: "incl: not included", metric: "check_include_exclude", result: `"use no terminal\n"`, expected: `{"include":["use terminal"]}`, want: 0},
	{name: "incl: real task passes", metric: "check_include_exclude", result: `"no libreoffice is running\nkilled from terminal\n"`,
		expected: `{"include":["no libreoffice is running","killed from terminal"],"exclude":["libreoffice is still running","not killed from terminal"]}`, want: 1},
	{name: "incl: excluded text present", metric: "check_include_exclude", result: `"no libreoffice is running\nnot killed from terminal\n"`,
		expected: `{"include":["no libreoffice is running","killed from terminal"],"exclude":["libreoffice is still running","not killed from terminal"]}`, want: 0},
	{name: "incl: None result", metric: "check_include_exclude", result: `null`, expected: `{"include":["x"]}`, want: 0},
	{name: "incl: a string include iterates characters", metric: "check_include_exclude", result: `"bca"`, expected: `{"include":"ab"}`, want: 1},
	{name: "incl: list result is membership", metric: "check_include_exclude", result: `["a","bc"]`, expected: `{"include":["a"],"exclude":["b"]}`, want: 1},
	{name: "incl: int result", metric: "check_include_exclude", result: `5`, expected: `{"include":["a"]}`, wantRaise: "TypeError"},
	{name: "incl: int in str", metric: "check_include_exclude", result: `"abc"`, expected: `{"include":[1]}`, wantRaise: "TypeError"},
	{name: "incl: empty rules", metric: "check_include_exclude", result: `""`, expected: `{}`, want: 1},
	{name: "incl: rules a list", metric: "check_include_exclude", result: `"x"`, expected: `["x"]`, wantRaise: "AttributeError"},
	{name: "incl: exclude not reached after a miss", metric: "check_include_exclude", result: `"abc"`, expected: `{"include":["z"],"exclude":[1]}`, want: 0},
	{name: "incl: null include", metric: "check_include_exclude", result: `"abc"`, expected: `{"include":null}`, wantRaise: "TypeError"},

	// match_in_list(result, rules): result in expected
	{name: "match: in list", metric: "match_in_list", result: `"Bing"`, expected: `{"expected":["Microsoft Bing","Bing"]}`, want: 1},
	{name: "match: not in list", metric: "match_in_list", result: `"Google"`, expected: `{"expected":["Microsoft Bing","Bing"]}`, want: 0},
	{name: "match: substring of a str", metric: "match_in_list", result: `"Bing"`, expected: `{"expected":"Microsoft Bing"}`, want: 1},
	{name: "match: None in a str", metric: "match_in_list", result: `null`, expected: `{"expected":"x"}`, wantRaise: "TypeError"},
	{name: "match: int in floats", metric: "match_in_list", result: `1`, expected: `{"expected":[1.0]}`, want: 1},

	// is_in_list(result, rules): expected in result
	{name: "isin: in list", metric: "is_in_list", result: `["/home/user/Desktop/helloExtension","/x"]`, expected: `{"expected":"/home/user/Desktop/helloExtension"}`, want: 1},
	{name: "isin: substring", metric: "is_in_list", result: `"abc"`, expected: `{"expected":"b"}`, want: 1},
	{name: "isin: None result", metric: "is_in_list", result: `null`, expected: `{"expected":"b"}`, wantRaise: "TypeError"},
	{name: "isin: dict key", metric: "is_in_list", result: `{"k":1}`, expected: `{"expected":"k"}`, want: 1},
	{name: "isin: list in dict is unhashable", metric: "is_in_list", result: `{"k":1}`, expected: `{"expected":["k"]}`, wantRaise: "TypeError"},

	// literal_match(result, expected, **options): str() comparison
	{name: "literal: same", metric: "literal_match", result: `"abc"`, expected: `"abc"`, want: 1},
	{name: "literal: case differs", metric: "literal_match", result: `"ABC"`, expected: `"abc"`, want: 0},
	{name: "literal: ignore case", metric: "literal_match", result: `"ABC"`, expected: `"abc"`, options: `{"ignore_case":true}`, want: 1},
	{name: "literal: int and its text", metric: "literal_match", result: `1`, expected: `"1"`, want: 1},
	{name: "literal: float keeps .0", metric: "literal_match", result: `1.0`, expected: `"1"`, want: 0},
	{name: "literal: float text", metric: "literal_match", result: `1.0`, expected: `"1.0"`, want: 1},
	{name: "literal: big float", metric: "literal_match", result: `1e16`, expected: `"1e+16"`, want: 1},
	{name: "literal: small float", metric: "literal_match", result: `0.0001`, expected: `"0.0001"`, want: 1},
	{name: "literal: tiny float", metric: "literal_match", result: `0.00001`, expected: `"1e-05"`, want: 1},
	{name: "literal: True", metric: "literal_match", result: `true`, expected: `"True"`, want: 1},
	{name: "literal: None", metric: "literal_match", result: `null`, expected: `"None"`, want: 1},
	{name: "literal: list repr", metric: "literal_match", result: `[1,"a",null]`, expected: `"[1, 'a', None]"`, want: 1},
	{name: "literal: dict repr with quote", metric: "literal_match", result: `{"b":"it's","a":2}`, expected: `"{'b': \"it's\", 'a': 2}"`, want: 1},
	{name: "literal: list type, ignore case", metric: "literal_match", result: `["A","b"]`, expected: `["a","B"]`, options: `{"type":"list","ignore_case":true}`, want: 1},
	{name: "literal: list type, lengths differ", metric: "literal_match", result: `["a"]`, expected: `["a","b"]`, options: `{"type":"list"}`, want: 0},
	{name: "literal: list type, not a list", metric: "literal_match", result: `"a"`, expected: `["a"]`, options: `{"type":"list"}`, want: 0},
	{name: "literal: list type, str of elements", metric: "literal_match", result: `[1,2]`, expected: `["1","2"]`, options: `{"type":"list"}`, want: 1},
	{name: "literal: final sigma, ignore case", metric: "literal_match", result: `"ΟΔΟΣ"`, expected: `"οδος"`, options: `{"ignore_case":true}`, want: 1},
	{name: "literal: final sigma is not σ", metric: "literal_match", result: `"ΟΔΟΣ"`, expected: `"οδοσ"`, options: `{"ignore_case":true}`, want: 0},
	{name: "literal: sigma before a letter", metric: "literal_match", result: `"ΣΑ"`, expected: `"σα"`, options: `{"ignore_case":true}`, want: 1},
	{name: "literal: dotted capital I lowers to two", metric: "literal_match", result: `"İ"`, expected: `"i\u0307"`, options: `{"ignore_case":true}`, want: 1},
	{name: "literal: lone surrogate in repr", metric: "literal_match", result: `["\ud800"]`, expected: `"['\\ud800']"`, want: 1},
	{name: "literal: unassigned in Unicode 14 is escaped", metric: "literal_match", result: `["\ud83d\udedc"]`, expected: `"['\\U0001f6dc']"`, want: 1},
	{name: "literal: list of sigmas", metric: "literal_match", result: `["ΟΔΟΣ","Σ"]`, expected: `["οδος","σ"]`, options: `{"type":"list","ignore_case":true}`, want: 1},
	{name: "literal: unknown type", metric: "literal_match", result: `"a"`, expected: `"a"`, options: `{"type":"dict"}`, wantRaise: "NotImplementedError"},

	// check_direct_json_object(result, rules)
	{name: "json: expected keys equal", metric: "check_direct_json_object", result: `{"a":1,"b":"x"}`, expected: `{"expected":{"a":1}}`, want: 1},
	{name: "json: a key differs", metric: "check_direct_json_object", result: `{"a":2}`, expected: `{"expected":{"a":1}}`, want: 0},
	{name: "json: a key missing", metric: "check_direct_json_object", result: `{"b":1}`, expected: `{"expected":{"a":1}}`, want: 0},
	{name: "json: text with single quotes", metric: "check_direct_json_object", result: `"  {'a': 1}\n"`, expected: `{"expected":{"a":1}}`, want: 1},
	{name: "json: text that is not JSON", metric: "check_direct_json_object", result: `"not json"`, expected: `{"expected":{"a":1}}`, wantRaise: "JSONDecodeError"},
	{name: "json: None", metric: "check_direct_json_object", result: `null`, expected: `{"expected":{"a":1}}`, want: 0},
	{name: "json: JSON null text", metric: "check_direct_json_object", result: `"null"`, expected: `{"expected":{"a":1}}`, want: 0},
	{name: "json: evaluation-failed marker", metric: "check_direct_json_object", result: `{"a":"__EVALUATION_FAILED__"}`, expected: `{"expected":{"a":"__EVALUATION_FAILED__"}}`, want: 0},
	{name: "json: ignore_list_order always fails, as in OSWorld", metric: "check_direct_json_object", result: `{"a":[2,1]}`, expected: `{"expected":{"a":[1,2],"ignore_list_order":true}}`, want: 0},
	{name: "json: in result, substring", metric: "check_direct_json_object", result: `{"time":"Mon, Jan 05, 2026"}`, expected: `{"expect_in_result":true,"expected":{"time":"Jan 05"}}`, want: 1},
	{name: "json: in result, one of a list", metric: "check_direct_json_object", result: `{"start":"SEA"}`, expected: `{"expect_in_result":true,"expected":{"start":["Seattle","SEA"]}}`, want: 1},
	{name: "json: in result, list member", metric: "check_direct_json_object", result: `{"tags":["x","y"]}`, expected: `{"expect_in_result":true,"expected":{"tags":["y"]}}`, want: 1},
	{name: "json: in result, none of a list", metric: "check_direct_json_object", result: `{"start":"NYC"}`, expected: `{"expect_in_result":true,"expected":{"start":["SEA"]}}`, want: 0},
	{name: "json: in result, missing key", metric: "check_direct_json_object", result: `{}`, expected: `{"expect_in_result":true,"expected":{"time":"Jan"}}`, want: 0},
	{name: "json: in result, number", metric: "check_direct_json_object", result: `{"n":1}`, expected: `{"expect_in_result":true,"expected":{"n":1}}`, want: 0},
	{name: "json: list result", metric: "check_direct_json_object", result: `[1]`, expected: `{"expected":{"a":1}}`, want: 0},
	{name: "json: list result, nothing expected", metric: "check_direct_json_object", result: `[1]`, expected: `{"expected":{}}`, want: 1},
	{name: "json: NaN text", metric: "check_direct_json_object", result: `"{'a': NaN}"`, expected: `{"expected":{"a":1}}`, want: 0},
	{name: "json: NaN in a list equals itself", metric: "check_direct_json_object", result: `"{'a': [NaN]}"`, expected: `{"expected":{"a":[1]}}`, want: 0},
	{name: "json: Infinity text", metric: "check_direct_json_object", result: `"{\"a\": -Infinity}"`, expected: `{"expected":{"b":null}}`, want: 1},
	{name: "json: int over 4300 digits", metric: "check_direct_json_object", result: `"` + strings.Repeat("9", 4301) + `"`, expected: `{"expected":{"a":1}}`, wantRaise: "ValueError"},
	{name: "json: strip takes Unicode space", metric: "check_direct_json_object", result: `"\u3000\u0085{'a': 1}\u2029"`, expected: `{"expected":{"a":1}}`, want: 1},
	{name: "json: lone surrogate key", metric: "check_direct_json_object", result: `"{'\\ud800': 1}"`, expected: `{"expected":{"\ud800":1}}`, want: 1},
	{name: "json: no expected", metric: "check_direct_json_object", result: `{"a":1}`, expected: `{}`, want: 0},

	// compare_text_file(actual, expected, **options)
	{name: "text: same", metric: "compare_text_file", resultFile: text("a\nb\n"), expectedFile: text("a\nb\n"), want: 1},
	{name: "text: differ", metric: "compare_text_file", resultFile: text("a\nb\n"), expectedFile: text("a\nc\n"), want: 0},
	{name: "text: universal newlines", metric: "compare_text_file", resultFile: text("a\r\nb\rc\n"), expectedFile: text("a\nb\nc\n"), want: 1},
	{name: "text: blanks differ", metric: "compare_text_file", resultFile: text("a  b\n\tc\n"), expectedFile: text("a b c"), want: 0},
	{name: "text: ignore blanks", metric: "compare_text_file", resultFile: text("a  b\n\tc\n"), expectedFile: text("a b c"), options: `{"ignore_blanks":true}`, want: 1},
	{name: "text: ignore blanks, unicode space", metric: "compare_text_file", resultFile: text("a\u00a0\u2003b\x1fc"), expectedFile: text(" a b c "), options: `{"ignore_blanks":true}`, want: 1},
	{name: "text: ignore case", metric: "compare_text_file", resultFile: text("ÄBC"), expectedFile: text("äbc"), options: `{"ignore_case":true}`, want: 1},
	{name: "text: ignore case, final sigma", metric: "compare_text_file", resultFile: text("ΟΔΟΣ ΟΔΟΣ.\n"), expectedFile: text("οδος οδος.\n"), options: `{"ignore_case":true}`, want: 1},
	{name: "text: ignore blanks, separators", metric: "compare_text_file", resultFile: text("a\x1c\x1db\u0085c"), expectedFile: text("a b c"), options: `{"ignore_blanks":true}`, want: 1},
	{name: "text: no result", metric: "compare_text_file", result: `null`, expectedFile: text("x"), want: 0},
	{name: "text: empty result path", metric: "compare_text_file", result: `""`, expectedFile: text("x"), want: 0},
	{name: "text: expected file missing", metric: "compare_text_file", resultFile: text("x"), expectedFile: text("-"), wantRaise: "FileNotFoundError"},
	{name: "text: result file missing", metric: "compare_text_file", resultFile: text("-"), expectedFile: text("x"), wantRaise: "FileNotFoundError"},
	{name: "text: not UTF-8", metric: "compare_text_file", resultFile: text("\xff\xfe"), expectedFile: text("x"), wantRaise: "UnicodeDecodeError"},
	{name: "text: expected None", metric: "compare_text_file", resultFile: text("x"), expected: `null`, wantRaise: "TypeError"},

	// diff_text_file(result, expect): difflib ratio over lines
	{name: "diff: identical", metric: "diff_text_file", resultFile: text("x\ny\nz\n"), expectedFile: text("x\ny\nz\n"), want: 1},
	{name: "diff: one line dropped", metric: "diff_text_file", resultFile: text("x\ny\nz\n"), expectedFile: text("x\nz\n"), want: 0.8},
	{name: "diff: swapped pair", metric: "diff_text_file", resultFile: text("a\nb\n"), expectedFile: text("b\na\n"), want: 0.5},
	{name: "diff: both empty", metric: "diff_text_file", resultFile: text(""), expectedFile: text(""), want: 1},
	{name: "diff: empty result", metric: "diff_text_file", resultFile: text(""), expectedFile: text("a\n"), want: 0},
	{name: "diff: CRLF is a line break", metric: "diff_text_file", resultFile: text("a\r\nb"), expectedFile: text("a\nb\n"), want: 1},
	{name: "diff: Unicode line boundaries", metric: "diff_text_file", resultFile: text("a\u2028b\x1ec\u0085d"), expectedFile: text("a\nb\nc\nd\n"), want: 1},
	{name: "diff: None", metric: "diff_text_file", result: `null`, expectedFile: text("a\n"), want: 0},
	{name: "diff: options refused", metric: "diff_text_file", resultFile: text("a"), expectedFile: text("a"), options: `{"x":1}`, wantRaise: "TypeError"},
	{name: "diff: missing result file", metric: "diff_text_file", resultFile: text("-"), expectedFile: text("a"), wantRaise: "FileNotFoundError"},

	// is_vlc_playing(actual_status_path, rule): VLC's status.xml
	{name: "vlc: playing the file", metric: "is_vlc_playing", resultFile: text(vlcStatusXML("playing", "tone.wav")), expected: `{"type":"file_name","file_name":"tone.wav"}`, want: 1},
	{name: "vlc: playing, full path", metric: "is_vlc_playing", resultFile: text(vlcStatusXML("playing", "/home/user/tone.wav")), expected: `{"type":"file_name","file_name":"tone.wav"}`, want: 1},
	{name: "vlc: playing, name's tail", metric: "is_vlc_playing", resultFile: text(vlcStatusXML("playing", "mytone.wav")), expected: `{"type":"file_name","file_name":"tone.wav"}`, want: 1},
	{name: "vlc: playing another file", metric: "is_vlc_playing", resultFile: text(vlcStatusXML("playing", "other.wav")), expected: `{"type":"file_name","file_name":"tone.wav"}`, want: 0},
	{name: "vlc: paused", metric: "is_vlc_playing", resultFile: text(vlcStatusXML("paused", "tone.wav")), expected: `{"type":"file_name","file_name":"tone.wav"}`, want: 0},
	{name: "vlc: no meta", metric: "is_vlc_playing", resultFile: text(`<root><state>playing</state></root>`), expected: `{"type":"file_name","file_name":"tone.wav"}`, want: 0},
	{name: "vlc: title when no filename", metric: "is_vlc_playing", resultFile: text(`<root><state>playing</state><information><category name="meta"><info name="title">tone.wav</info></category></information></root>`), expected: `{"type":"file_name","file_name":"tone.wav"}`, want: 1},
	{name: "vlc: url", metric: "is_vlc_playing", resultFile: text(`<root><state>playing</state><information><category name="meta"><info name="url">http://127.0.0.1:8000/live/s.m3u8</info></category></information></root>`), expected: `{"type":"url","url":"http://127.0.0.1:8000/live/s.m3u8"}`, want: 1},
	{name: "vlc: url shown as its file name", metric: "is_vlc_playing", resultFile: text(vlcStatusXML("playing", "s.m3u8")), expected: `{"type":"url","url":"http://127.0.0.1:8000/live/s.m3u8"}`, want: 1},
	{name: "vlc: url of another host", metric: "is_vlc_playing", resultFile: text(`<root><state>playing</state><information><category name="meta"><info name="url">http://10.0.0.1/live/s.mp4</info></category></information></root>`), expected: `{"type":"url","url":"http://127.0.0.1:8000/live/s.m3u8"}`, want: 0},
	{name: "vlc: unknown rule type", metric: "is_vlc_playing", resultFile: text(vlcStatusXML("playing", "tone.wav")), expected: `{"type":"title","title":"tone.wav"}`, want: 0},
	{name: "vlc: rule without type", metric: "is_vlc_playing", resultFile: text(vlcStatusXML("playing", "tone.wav")), expected: `{"file_name":"tone.wav"}`, wantRaise: "KeyError"},
	{name: "vlc: no state", metric: "is_vlc_playing", resultFile: text(`<root><volume>256</volume></root>`), expected: `{"type":"file_name","file_name":"tone.wav"}`, wantRaise: "AttributeError"},
	{name: "vlc: not XML", metric: "is_vlc_playing", resultFile: text(`<root><state>playing</root>`), expected: `{"type":"file_name","file_name":"tone.wav"}`, wantRaise: "ParseError"},
	{name: "vlc: None", metric: "is_vlc_playing", result: `null`, expected: `{"type":"file_name","file_name":"tone.wav"}`, want: 0},
	{name: "vlc: no status file", metric: "is_vlc_playing", resultFile: text("-"), expected: `{"type":"file_name","file_name":"tone.wav"}`, want: 0},

	// check_qt_* (actual_config_path, rule): the last line naming the key wins, commented or not
	{name: "vlcrc: commented default only", metric: "check_qt_bgcone", resultFile: text("[qt]\n#qt-bgcone=1\n"), expected: `{"expected_qt_bgcone":0}`, want: 0},
	{name: "vlcrc: set after the comment", metric: "check_qt_bgcone", resultFile: text("#qt-bgcone=1\nqt-bgcone=0\n"), expected: `{"expected_qt_bgcone":0}`, want: 1},
	{name: "vlcrc: absent is the default", metric: "check_qt_bgcone", resultFile: text("[qt]\n"), expected: `{"expected_qt_bgcone":1}`, want: 1},
	{name: "vlcrc: CRLF", metric: "check_qt_bgcone", resultFile: text("qt-bgcone=0\r\n"), expected: `{"expected_qt_bgcone":"0"}`, want: 1},
	{name: "vlcrc: True is not 1", metric: "check_qt_bgcone", resultFile: text("qt-bgcone=1\n"), expected: `{"expected_qt_bgcone":true}`, want: 0},
	{name: "vlcrc: a float is not a str", metric: "check_qt_bgcone", resultFile: text("qt-bgcone=0\n"), expected: `{"expected_qt_bgcone":0.0}`, want: 0},
	{name: "vlcrc: rule without the key", metric: "check_qt_bgcone", resultFile: text("qt-bgcone=0\n"), expected: `{}`, wantRaise: "KeyError"},
	{name: "vlcrc: None", metric: "check_qt_bgcone", result: `null`, expected: `{"expected_qt_bgcone":0}`, wantRaise: "TypeError"},
	{name: "vlcrc: no file", metric: "check_qt_bgcone", resultFile: text("-"), expected: `{"expected_qt_bgcone":0}`, wantRaise: "FileNotFoundError"},
	{name: "vlcrc: max volume default", metric: "check_qt_max_volume", resultFile: text(""), expected: `{"expected_qt_max_volume":125}`, want: 1},
	{name: "vlcrc: max volume set", metric: "check_qt_max_volume", resultFile: text("qt-max-volume=200\n"), expected: `{"expected_qt_max_volume":200}`, want: 1},
	{name: "vlcrc: minimal view", metric: "check_qt_minimal_view", resultFile: text("#qt-minimal-view=0\nqt-minimal-view=1\n"), expected: `{"expected_qt_minimal_view":1}`, want: 1},
	{name: "vlcrc: one instance", metric: "check_one_instance_when_started_from_file", resultFile: text("one-instance-when-started-from-file=0\n"), expected: `{"expected_one_instance_when_started_from_file":0}`, want: 1},
	{name: "vlcrc: global key empty", metric: "check_global_key_play_pause", resultFile: text("#global-key-play-pause=\n"), expected: `{"expected_global_key_play_pause":0}`, want: 1},
	{name: "vlcrc: global key set", metric: "check_global_key_play_pause", resultFile: text("#global-key-play-pause=\nglobal-key-play-pause=Ctrl+Space\n"), expected: `{"expected_global_key_play_pause":1}`, want: 1},
	{name: "vlcrc: global key set, want none", metric: "check_global_key_play_pause", resultFile: text("global-key-play-pause=Space\n"), expected: `{"expected_global_key_play_pause":"0"}`, want: 0},

	// check_config_status(actual_config_path, rule): GIMP's gimprc and sessionrc
	{name: "gimprc: key and value", metric: "check_config_status", resultFile: text("# GIMP gimprc\n\n(show-tooltips no)\n"), expected: `{"key":"show-tooltips","value":"no"}`, want: 1},
	{name: "gimprc: other value", metric: "check_config_status", resultFile: text("(show-tooltips yes)\n"), expected: `{"key":"show-tooltips","value":"no"}`, want: 0},
	{name: "gimprc: two-word key", metric: "check_config_status", resultFile: text("(default-grid (spacing 10))\n(undo-levels 5)\n"), expected: `{"key":["default-grid","(spacing"],"value":"10"}`, want: 1},
	{name: "gimprc: quoted value", metric: "check_config_status", resultFile: text("(theme \"Dark\")\n"), expected: `{"key":"theme","value":"\"Dark\""}`, want: 1},
	{name: "gimprc: no line", metric: "check_config_status", resultFile: text("(theme \"Dark\")\n"), expected: `{"key":"undo-levels","value":"5"}`, want: 0},
	{name: "gimprc: blank line with spaces", metric: "check_config_status", resultFile: text("  \n(undo-levels 5)\n"), expected: `{"key":"undo-levels","value":"5"}`, wantRaise: "IndexError"},
	{name: "gimprc: key matches, no value", metric: "check_config_status", resultFile: text("(undo-levels 5)\n"), expected: `{"key":"undo-levels"}`, wantRaise: "KeyError"},
	{name: "gimprc: None", metric: "check_config_status", result: `null`, expected: `{"key":"undo-levels","value":"5"}`, want: 0},

	// is_expected_tabs(open_tabs, rule)
	{name: "tabs: same set", metric: "is_expected_tabs", result: `[{"title":"A","url":"https://www.a.com/"},{"title":"B","url":"file:///home/user/b.html"}]`, expected: `{"type":"url","urls":["file:///home/user/b.html","https://a.com"]}`, want: 1},
	{name: "tabs: one more", metric: "is_expected_tabs", result: `[{"title":"A","url":"https://a.com"},{"title":"B","url":"https://b.com"}]`, expected: `{"type":"url","urls":["https://a.com"]}`, want: 0},
	{name: "tabs: duplicates count once", metric: "is_expected_tabs", result: `[{"title":"A","url":"https://a.com"},{"title":"B","url":"https://b.com"}]`, expected: `{"type":"url","urls":["https://a.com","https://a.com"]}`, want: 1},
	{name: "tabs: none", metric: "is_expected_tabs", result: `[]`, expected: `{"type":"url","urls":[]}`, want: 0},
	{name: "tabs: other rule type", metric: "is_expected_tabs", result: `[{"title":"A","url":"https://a.com"}]`, expected: `{"type":"title","titles":["A"]}`, want: 0},
	{name: "tabs: no urls", metric: "is_expected_tabs", result: `[{"title":"A","url":"https://a.com"}]`, expected: `{"type":"url"}`, wantRaise: "KeyError"},
	{name: "tabs: tab without url", metric: "is_expected_tabs", result: `[{"title":"A"}]`, expected: `{"type":"url","urls":["https://a.com"]}`, wantRaise: "KeyError"},

	// check_gnome_favorite_apps(apps_str, rule): gsettings get org.gnome.shell favorite-apps, read with eval()
	{name: "gnome apps: same set", metric: "check_gnome_favorite_apps", result: `"['thunderbird.desktop', 'org.gnome.Nautilus.desktop']\n"`, expected: `{"expected":["org.gnome.Nautilus.desktop","thunderbird.desktop"]}`, want: 1},
	{name: "gnome apps: one missing", metric: "check_gnome_favorite_apps", result: `"['thunderbird.desktop']\n"`, expected: `{"expected":["thunderbird.desktop","vim.desktop"]}`, want: 0},
	{name: "gnome apps: another app", metric: "check_gnome_favorite_apps", result: `"['thunderbird.desktop', 'gedit.desktop']\n"`, expected: `{"expected":["thunderbird.desktop","vim.desktop"]}`, want: 0},
	{name: "gnome apps: a duplicate counts in len", metric: "check_gnome_favorite_apps", result: `"['a.desktop', 'a.desktop']"`, expected: `{"expected":["a.desktop","b.desktop"]}`, want: 0},
	{name: "gnome apps: duplicates on both sides", metric: "check_gnome_favorite_apps", result: `"['a.desktop', 'b.desktop', 'a.desktop']"`, expected: `{"expected":["b.desktop","a.desktop","b.desktop"]}`, want: 1},
	{name: "gnome apps: double quotes, escapes, trailing comma", metric: "check_gnome_favorite_apps", result: `"[\"it's.desktop\", '\\x61\\u00e9\\q' r'\\n', \n'c'\n,]"`, expected: `{"expected":["it's.desktop","aé\\q\\n","c"]}`, want: 1},
	{name: "gnome apps: tuple", metric: "check_gnome_favorite_apps", result: `"('a.desktop', 'b.desktop')"`, expected: `{"expected":["b.desktop","a.desktop"]}`, want: 1},
	{name: "gnome apps: bare tuple", metric: "check_gnome_favorite_apps", result: `"'a.desktop', 'b.desktop',"`, expected: `{"expected":["b.desktop","a.desktop"]}`, want: 1},
	{name: "gnome apps: empty list", metric: "check_gnome_favorite_apps", result: `"[]"`, expected: `{"expected":[]}`, want: 1},
	{name: "gnome apps: empty as gsettings prints it", metric: "check_gnome_favorite_apps", result: `"@as []\n"`, expected: `{"expected":[]}`, wantRaise: "SyntaxError"},
	{name: "gnome apps: no schema", metric: "check_gnome_favorite_apps", result: `"No such schema 'org.gnome.shell'\n"`, expected: `{"expected":[]}`, wantRaise: "SyntaxError"},
	{name: "gnome apps: no output", metric: "check_gnome_favorite_apps", result: `""`, expected: `{"expected":[]}`, wantRaise: "SyntaxError"},
	{name: "gnome apps: unterminated", metric: "check_gnome_favorite_apps", result: `"['a.desktop', 'b"`, expected: `{"expected":[]}`, wantRaise: "SyntaxError"},
	{name: "gnome apps: indented second line", metric: "check_gnome_favorite_apps", result: `"['a']\n  "`, expected: `{"expected":["a"]}`, wantRaise: "IndentationError"},
	{name: "gnome apps: None", metric: "check_gnome_favorite_apps", result: `null`, expected: `{"expected":[]}`, wantRaise: "TypeError"},
	{name: "gnome apps: a str is its characters", metric: "check_gnome_favorite_apps", result: `"'abca'"`, expected: `{"expected":"cbaa"}`, want: 1},
	{name: "gnome apps: a str against a list", metric: "check_gnome_favorite_apps", result: `"'ab'"`, expected: `{"expected":["b","a"]}`, want: 1},
	{name: "gnome apps: dict keys", metric: "check_gnome_favorite_apps", result: `"['a']"`, expected: `{"expected":{"a":1}}`, want: 1},
	{name: "gnome apps: no expected", metric: "check_gnome_favorite_apps", result: `"['a']"`, expected: `{}`, wantRaise: "KeyError"},
	{name: "gnome apps: expected an int", metric: "check_gnome_favorite_apps", result: `"['a']"`, expected: `{"expected":1}`, wantRaise: "TypeError"},
	{name: "gnome apps: expected None", metric: "check_gnome_favorite_apps", result: `"['a']"`, expected: `{"expected":null}`, wantRaise: "TypeError"},
	{name: "gnome apps: unhashable expected", metric: "check_gnome_favorite_apps", result: `"['a']"`, expected: `{"expected":[["a"]]}`, wantRaise: "TypeError"},
	{name: "gnome apps: unhashable after a number", metric: "check_gnome_favorite_apps", result: `"['a', 'b']"`, expected: `{"expected":[1,{}]}`, wantRaise: "TypeError"},
	{name: "gnome apps: lengths differ before set", metric: "check_gnome_favorite_apps", result: `"['a']"`, expected: `{"expected":[["a"],["b"]]}`, want: 0},
	{name: "gnome apps: a number never equals a str", metric: "check_gnome_favorite_apps", result: `"['1']"`, expected: `{"expected":[1]}`, want: 0},
	{name: "gnome apps: rule a list", metric: "check_gnome_favorite_apps", result: `"['a']"`, expected: `["a"]`, wantRaise: "TypeError"},

	// check_text_enlarged(scaling_factor_str): gsettings get org.gnome.desktop.interface text-scaling-factor
	{name: "text scale: enlarged", metric: "check_text_enlarged", result: `"1.25\n"`, want: 1},
	{name: "text scale: default", metric: "check_text_enlarged", result: `"1.0\n"`, want: 0},
	{name: "text scale: smaller", metric: "check_text_enlarged", result: `"0.8\n"`, want: 0},
	{name: "text scale: just above", metric: "check_text_enlarged", result: `"1.0000000000000002"`, want: 1},
	{name: "text scale: rounds to 1", metric: "check_text_enlarged", result: `"1.00000000000000001"`, want: 0},
	{name: "text scale: underscores, Unicode space and digits", metric: "check_text_enlarged", result: `"\u3000\u0661_\u0665\u00a0\n"`, want: 1},
	{name: "text scale: infinity", metric: "check_text_enlarged", result: `" -Infinity\t"`, want: 0},
	{name: "text scale: inf", metric: "check_text_enlarged", result: `"INF"`, want: 1},
	{name: "text scale: nan", metric: "check_text_enlarged", result: `"nan"`, want: 0},
	{name: "text scale: empty", metric: "check_text_enlarged", result: `""`, wantRaise: "ValueError"},
	{name: "text scale: separator not stripped", metric: "check_text_enlarged", result: `"\u001c1.5"`, wantRaise: "ValueError"},
	{name: "text scale: hex", metric: "check_text_enlarged", result: `"0x1p1"`, wantRaise: "ValueError"},
	{name: "text scale: bad underscore", metric: "check_text_enlarged", result: `"1_.5"`, wantRaise: "ValueError"},
	{name: "text scale: gsettings error", metric: "check_text_enlarged", result: `"No such key 'text-scaling-factor'\n"`, wantRaise: "ValueError"},
	{name: "text scale: None", metric: "check_text_enlarged", result: `null`, wantRaise: "TypeError"},
	{name: "text scale: a number", metric: "check_text_enlarged", result: `2`, want: 1},
	{name: "text scale: True", metric: "check_text_enlarged", result: `true`, want: 0},
	{name: "text scale: huge int", metric: "check_text_enlarged", result: `1` + strings.Repeat("0", 400), wantRaise: "OverflowError"},
	{name: "text scale: a list", metric: "check_text_enlarged", result: `["1.5"]`, wantRaise: "TypeError"},
	{name: "text scale: no expected taken", metric: "check_text_enlarged", result: `"1.5"`, expected: `{"expected":1}`, wantRaise: "TypeError"},
}

// vlcStatusXML is a status.xml as VLC 3's HTTP interface writes it.
func vlcStatusXML(state, filename string) string {
	return `<?xml version="1.0" encoding="utf-8" standalone="yes" ?>
<root>
<fullscreen>false</fullscreen>
<volume>256</volume>
<state>` + state + `</state>
<information>
    <category name="meta">
    <info name='filename'>` + filename + `</info>
    </category>
  <category name='Stream 0'><info name='Type'>Audio</info></category>
</information>
</root>`
}

func TestNativeMetrics(t *testing.T) {
	for _, c := range metricCases {
		t.Run(c.name, func(t *testing.T) {
			got, err := c.run(t)
			if c.wantRaise != "" {
				var pe *PythonError
				if !errors.As(err, &pe) || pe.Type != c.wantRaise {
					t.Fatalf("%s = %v, %v; want it to raise %s", c.metric, got, err, c.wantRaise)
				}
				return
			}
			if err != nil {
				t.Fatalf("%s: %v", c.metric, err)
			}
			if got != c.want {
				t.Errorf("%s = %v, want %v", c.metric, got, c.want)
			}
		})
	}
}

// TestGnomeFavoriteAppsRefusesWhatItCannotEvaluate: Python the native eval
// does not read fails the grade, naming the text and what to do, rather
// than scoring what CPython might score otherwise.
func TestGnomeFavoriteAppsRefusesWhatItCannotEvaluate(t *testing.T) {
	m, _ := nativeMetricFor("check_gnome_favorite_apps")
	rule := newPyDict()
	rule.set("expected", []any{"a", "b"})
	for _, text := range []string{"['a'] + ['b']", "true\n", "[['a'], 'b']"} {
		got, err := m.call("check_gnome_favorite_apps", text, rule, true, newPyDict())
		var refused *errEvalUnsupported
		if !errors.As(err, &refused) {
			t.Errorf("eval(%q) scored %v, %v; want it refused", text, got, err)
			continue
		}
		for _, want := range []string{"eval(" + pyRepr(text) + ")", "--osworld", "--grader bridge"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("refusal %q does not say %q", err, want)
			}
		}
	}
}
