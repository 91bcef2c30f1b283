package grade

// Native versions of OSWorld's os-task metrics that read GNOME settings
// through gsettings (desktop_env/evaluators/metrics/basic_os.py).

// checkGnomeFavoriteApps: the dock's favorite apps, gsettings' output
// read with eval(), are as many as rule["expected"] lists and the same set.
func checkGnomeFavoriteApps(args []any, _ *pyDict) (float64, error) {
	apps, err := pyEvalStrings(args[0])
	if err != nil {
		return 0, err
	}
	expected, err := subscript(args[1], "expected")
	if err != nil {
		return 0, err
	}
	n, err := pyLen(apps)
	if err != nil {
		return 0, err
	}
	m, err := pyLen(expected)
	if err != nil || n != m {
		return 0, err
	}
	have, err := pyStrSet(apps)
	if err != nil {
		return 0, err
	}
	want, err := pyStrSet(expected)
	if err != nil || want == nil || len(have) != len(want) {
		return 0, err
	}
	for s := range have {
		if !want[s] {
			return 0, nil
		}
	}
	return 1, nil
}

// checkTextEnlarged: float(text-scaling-factor) > 1.0.
func checkTextEnlarged(args []any, _ *pyDict) (float64, error) {
	f, err := pyFloat(args[0])
	return score(f > 1), err
}

// pyLen is len(v).
func pyLen(v any) (int, error) {
	switch x := v.(type) {
	case string, []any, *pyDict:
		items, err := pyIter(x)
		return len(items), err
	}
	return 0, raise("TypeError", "object of type '%s' has no len()", pyTypeName(v))
}

// pyStrSet is set(v) when every element is a str; nil when one is another
// hashable value (such a set equals no set of strs).
func pyStrSet(v any) (map[string]bool, error) {
	items, err := pyIter(v)
	if err != nil {
		return nil, err
	}
	set, other := make(map[string]bool, len(items)), false
	for _, e := range items {
		switch x := e.(type) {
		case string:
			set[x] = true
		case []any, *pyDict:
			return nil, raise("TypeError", "unhashable type: '%s'", pyTypeName(e))
		default:
			other = true
		}
	}
	if other {
		return nil, nil
	}
	return set, nil
}
