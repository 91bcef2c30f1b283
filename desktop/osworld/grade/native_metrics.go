package grade

// Native Go versions of OSWorld's simplest and most used metrics. Each one
// follows the Python function it stands for, including where that function
// raises (which fails the grade) rather than scoring 0, because a different
// outcome from the same inputs would be a different reward. Differences that
// remain are listed in the package documentation.

import (
	"errors"
	"io/fs"
	"os"
	"slices"
	"strings"
	"unicode/utf8"

	"legato/rl/desktop/osworld/grade/pystr"
)

// nativeMetric is a metric with its Python signature: required positional
// parameters, and whether it takes **options.
type nativeMetric struct {
	params []string
	varKW  bool
	run    func(args []any, kw *pyDict) (float64, error)
}

// NativeMetrics lists the metrics the grader implements in Go.
func NativeMetrics() []string {
	return []string{
		"check_config_status",
		"check_direct_json_object",
		"check_global_key_play_pause",
		"check_gnome_favorite_apps",
		"check_include_exclude",
		"check_one_instance_when_started_from_file",
		"check_qt_bgcone",
		"check_qt_max_volume",
		"check_qt_minimal_view",
		"check_text_enlarged",
		"compare_text_file",
		"diff_text_file",
		"exact_match",
		"is_expected_tabs",
		"is_in_list",
		"is_vlc_playing",
		"literal_match",
		"match_in_list",
	}
}

func nativeMetricFor(name string) (nativeMetric, bool) {
	switch name {
	case "exact_match":
		return nativeMetric{params: []string{"result", "rules"}, run: exactMatch}, true
	case "check_include_exclude":
		return nativeMetric{params: []string{"result", "rules"}, run: checkIncludeExclude}, true
	case "match_in_list":
		return nativeMetric{params: []string{"result", "rules"}, run: matchInList}, true
	case "is_in_list":
		return nativeMetric{params: []string{"result", "rules"}, run: isInList}, true
	case "literal_match":
		return nativeMetric{params: []string{"result", "expected"}, varKW: true, run: literalMatch}, true
	case "check_direct_json_object":
		return nativeMetric{params: []string{"result", "rules"}, run: checkDirectJSONObject}, true
	case "compare_text_file":
		return nativeMetric{params: []string{"actual", "expected"}, varKW: true, run: compareTextFile}, true
	case "diff_text_file":
		return nativeMetric{params: []string{"result", "expect"}, run: diffTextFile}, true
	case "is_vlc_playing":
		return nativeMetric{params: []string{"actual_status_path", "rule"}, run: isVLCPlaying}, true
	case "check_qt_bgcone":
		return vlcMetric(vlcrcSetting("qt-bgcone", "expected_qt_bgcone", "1")), true
	case "check_qt_max_volume":
		return vlcMetric(vlcrcSetting("qt-max-volume", "expected_qt_max_volume", "125")), true
	case "check_qt_minimal_view":
		return vlcMetric(vlcrcSetting("qt-minimal-view", "expected_qt_minimal_view", "0")), true
	case "check_one_instance_when_started_from_file":
		return vlcMetric(vlcrcSetting("one-instance-when-started-from-file", "expected_one_instance_when_started_from_file", "1")), true
	case "check_global_key_play_pause":
		return vlcMetric(checkGlobalKeyPlayPause), true
	case "check_config_status":
		return nativeMetric{params: []string{"actual_config_path", "rule"}, run: checkConfigStatus}, true
	case "is_expected_tabs":
		return nativeMetric{params: []string{"open_tabs", "rule"}, run: isExpectedTabs}, true
	case "check_gnome_favorite_apps":
		return nativeMetric{params: []string{"apps_str", "rule"}, run: checkGnomeFavoriteApps}, true
	case "check_text_enlarged":
		return nativeMetric{params: []string{"scaling_factor_str"}, run: checkTextEnlarged}, true
	}
	return nativeMetric{}, false
}

// call binds arguments as Python does for metric(result, expected,
// **options) or metric(result, **options) and runs the metric.
func (m nativeMetric) call(name string, result, expected any, hasExpected bool, options *pyDict) (float64, error) {
	args := []any{result}
	if hasExpected {
		args = append(args, expected)
	}
	if len(args) > len(m.params) {
		return 0, raise("TypeError", "%s() takes %d positional arguments but %d were given", name, len(m.params), len(args))
	}
	bound := make([]bool, len(m.params))
	for i := range args {
		bound[i] = true
	}
	args = append(args, make([]any, len(m.params)-len(args))...)
	kw := newPyDict()
	for _, k := range options.keysOrNil() {
		v, _ := options.get(k)
		if i := slices.Index(m.params, k); i >= 0 {
			if bound[i] {
				return 0, raise("TypeError", "%s() got multiple values for argument '%s'", name, k)
			}
			args[i], bound[i] = v, true
			continue
		}
		if !m.varKW {
			return 0, raise("TypeError", "%s() got an unexpected keyword argument '%s'", name, k)
		}
		kw.set(k, v)
	}
	for i, ok := range bound {
		if !ok {
			return 0, raise("TypeError", "%s() missing 1 required positional argument: '%s'", name, m.params[i])
		}
	}
	return m.run(args, kw)
}

func vlcMetric(run func(args []any, kw *pyDict) (float64, error)) nativeMetric {
	return nativeMetric{params: []string{"actual_config_path", "rule"}, run: run}
}

func (d *pyDict) keysOrNil() []string {
	if d == nil {
		return nil
	}
	return d.keys
}

func score(ok bool) float64 {
	if ok {
		return 1
	}
	return 0
}

// subscript is v[key] for a string key.
func subscript(v any, key string) (any, error) {
	switch x := v.(type) {
	case *pyDict:
		if e, ok := x.get(key); ok {
			return e, nil
		}
		return nil, raise("KeyError", "%s", pystr.Repr(key))
	case []any:
		return nil, raise("TypeError", "list indices must be integers or slices, not str")
	case string:
		return nil, raise("TypeError", "string indices must be integers, not 'str'")
	}
	return nil, raise("TypeError", "'%s' object is not subscriptable", pyTypeName(v))
}

// dictGet is v.get(key, def).
func dictGet(v any, key string, def any) (any, error) {
	d, ok := v.(*pyDict)
	if !ok {
		return nil, raise("AttributeError", "'%s' object has no attribute 'get'", pyTypeName(v))
	}
	return d.getOr(key, def), nil
}

// exactMatch: result == rules["expected"].
func exactMatch(args []any, _ *pyDict) (float64, error) {
	expect, err := subscript(args[1], "expected")
	if err != nil {
		return 0, err
	}
	return score(pyEqual(args[0], expect)), nil
}

// matchInList: result in rules["expected"].
func matchInList(args []any, _ *pyDict) (float64, error) {
	expect, err := subscript(args[1], "expected")
	if err != nil {
		return 0, err
	}
	ok, err := pyContains(expect, args[0])
	return score(ok), err
}

// isInList: rules["expected"] in result.
func isInList(args []any, _ *pyDict) (float64, error) {
	expect, err := subscript(args[1], "expected")
	if err != nil {
		return 0, err
	}
	ok, err := pyContains(args[0], expect)
	return score(ok), err
}

// checkIncludeExclude: every rules["include"] is in result and no
// rules["exclude"] is; 0 for a None result.
func checkIncludeExclude(args []any, _ *pyDict) (float64, error) {
	result, rules := args[0], args[1]
	if result == nil {
		return 0, nil
	}
	include, err := dictGet(rules, "include", []any{})
	if err != nil {
		return 0, err
	}
	exclude, err := dictGet(rules, "exclude", []any{})
	if err != nil {
		return 0, err
	}
	// all() stops at the first miss, and the exclusions are only looked at
	// when every inclusion holds, so errors surface in the same cases.
	all := func(items any, want bool) (bool, error) {
		list, err := pyIter(items)
		if err != nil {
			return false, err
		}
		for _, r := range list {
			in, err := pyContains(result, r)
			if err != nil {
				return false, err
			}
			if in != want {
				return false, nil
			}
		}
		return true, nil
	}
	ok, err := all(include, true)
	if err != nil || !ok {
		return 0, err
	}
	ok, err = all(exclude, false)
	return score(ok), err
}

// literalMatch compares str(result) with str(expected), or two lists
// element by element as strings, optionally ignoring case.
func literalMatch(args []any, options *pyDict) (float64, error) {
	result, expected := args[0], args[1]
	typ := options.getOr("type", "str")
	ignoreCase := pyTruthy(options.getOr("ignore_case", false))
	conv := pyStr
	if ignoreCase {
		conv = func(v any) string { return pystr.Lower(pyStr(v)) }
	}
	switch {
	case pyEqual(typ, "str"):
		return score(conv(result) == conv(expected)), nil
	case pyEqual(typ, "list"):
		r, ok1 := result.([]any)
		e, ok2 := expected.([]any)
		if !ok1 || !ok2 || len(r) != len(e) {
			return 0, nil
		}
		for i := range r {
			if conv(r[i]) != conv(e[i]) {
				return 0, nil
			}
		}
		return 1, nil
	}
	// OSWorld formats the builtin `type` here, not the option.
	return 0, raise("NotImplementedError", "Type <class 'type'> not supported")
}

// checkDirectJSONObject compares a JSON object (or its text) with
// rules["expected"]: every expected key equal, or with expect_in_result,
// contained. OSWorld wraps the comparison in a catch-all that scores 0, so
// only a result text that is not JSON raises.
func checkDirectJSONObject(args []any, _ *pyDict) (float64, error) {
	result, rules := args[0], args[1]
	if s, ok := result.(string); ok {
		// OSWorld turns Python-style quotes into JSON ones before parsing.
		v, err := decodePy([]byte(strings.ReplaceAll(pystr.Strip(s), "'", `"`)))
		if err != nil {
			return 0, err
		}
		result = v
	}
	if result == nil {
		return 0, nil
	}
	if failed, err := expectsEvaluationFailure(rules); err != nil || failed {
		return 0, nil
	}
	s, err := compareJSONObject(result, rules)
	if err != nil {
		return 0, nil
	}
	return s, nil
}

// expectsEvaluationFailure reports whether an expected value is OSWorld's
// marker for a reference that could not be computed.
func expectsEvaluationFailure(rules any) (bool, error) {
	expected, err := dictGet(rules, "expected", newPyDict())
	if err != nil || !pyTruthy(expected) {
		return false, err
	}
	d, ok := expected.(*pyDict)
	if !ok {
		return false, raise("AttributeError", "'%s' object has no attribute 'items'", pyTypeName(expected))
	}
	for _, k := range d.keys {
		if pyEqual(d.vals[k], "__EVALUATION_FAILED__") {
			return true, nil
		}
	}
	return false, nil
}

func compareJSONObject(result, rules any) (float64, error) {
	expectInResult, err := dictGet(rules, "expect_in_result", false)
	if err != nil {
		return 0, err
	}
	expectedV, err := subscript(rules, "expected")
	if err != nil {
		return 0, err
	}
	expected, ok := expectedV.(*pyDict)
	if !ok {
		return 0, raise("AttributeError", "'%s' object has no attribute 'keys'", pyTypeName(expectedV))
	}
	for _, key := range expected.keys {
		want := expected.vals[key]
		got, err := dictGet(result, key, nil)
		if err != nil {
			return 0, err
		}
		if !pyTruthy(expectInResult) {
			// Every key is compared after sorting when "ignore_list_order"
			// is set, that flag's own value included, as OSWorld does.
			if pyTruthy(expected.getOr("ignore_list_order", false)) {
				w, err := pySorted(want)
				if err != nil {
					return 0, err
				}
				g, err := pySorted(got)
				if err != nil {
					return 0, err
				}
				want, got = w, g
			}
			if !pyEqual(want, got) {
				return 0, nil
			}
			continue
		}
		switch w := want.(type) {
		case []any:
			found := false
			for _, each := range w {
				if list, ok := got.([]any); ok {
					if in, _ := pyContains(list, each); in {
						found = true
						break
					}
				} else if s, ok := got.(string); ok && pyEqual(each, s) {
					found = true
					break
				}
			}
			if !found {
				return 0, nil
			}
		case string:
			in, err := pyContains(got, w)
			if err != nil {
				return 0, err
			}
			if !in {
				return 0, nil
			}
		default:
			return 0, nil
		}
	}
	return 1, nil
}

// compareTextFile reads two text files and compares them, optionally with
// runs of white space collapsed and case ignored; 0 when there is no result
// file.
func compareTextFile(args []any, options *pyDict) (float64, error) {
	if !pyTruthy(args[0]) {
		return 0, nil
	}
	actual, err := readText(args[0])
	if err != nil {
		return 0, err
	}
	expected, err := readText(args[1])
	if err != nil {
		return 0, err
	}
	if pyTruthy(options.getOr("ignore_blanks", false)) {
		actual, expected = collapseBlanks(actual), collapseBlanks(expected)
	}
	if pyTruthy(options.getOr("ignore_case", false)) {
		actual, expected = pystr.Lower(actual), pystr.Lower(expected)
	}
	return score(actual == expected), nil
}

// collapseBlanks does OSWorld's re.sub(r'[\t\n]', ' ', s).strip() followed
// by re.sub(r'\s+', ' ', s), with Python's notion of white space.
func collapseBlanks(s string) string {
	s = pystr.Strip(strings.NewReplacer("\t", " ", "\n", " ").Replace(s))
	var b strings.Builder
	inSpace := false
	for i := 0; i < len(s); {
		r, n := pystr.DecodeRune(s[i:])
		if pystr.IsSpace(r) {
			if !inSpace {
				b.WriteByte(' ')
			}
			inSpace = true
		} else {
			inSpace = false
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	return b.String()
}

// diffTextFile is difflib's similarity ratio of the two files' lines; 0
// when there is no result file.
func diffTextFile(args []any, _ *pyDict) (float64, error) {
	if args[0] == nil {
		return 0, nil
	}
	result, err := readText(args[0])
	if err != nil {
		return 0, err
	}
	expected, err := readText(args[1])
	if err != nil {
		return 0, err
	}
	return matchRatio(pystr.SplitLines(result), pystr.SplitLines(expected)), nil
}

// readText is open(path).read() in text mode: UTF-8, strict, with
// universal newlines.
func readText(path any) (string, error) {
	s, err := readBytesText(path)
	if err != nil {
		return "", err
	}
	s = strings.ReplaceAll(s, "\r\n", "\n")
	return strings.ReplaceAll(s, "\r", "\n"), nil
}

// readBytesText is open(path, 'rb').read().decode('utf-8'): no newline
// translation (VLC's metrics read vlcrc so).
func readBytesText(path any) (string, error) {
	p, ok := path.(string)
	if !ok {
		return "", raise("TypeError", "expected str, bytes or os.PathLike object, not %s", pyTypeName(path))
	}
	data, err := os.ReadFile(p)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return "", raise("FileNotFoundError", "[Errno 2] No such file or directory: %s", pystr.Repr(p))
	case err != nil:
		return "", raise("OSError", "%v", err)
	case !utf8.Valid(data):
		return "", raise("UnicodeDecodeError", "'utf-8' codec can't decode %s", pystr.Repr(p))
	}
	return string(data), nil
}
