"""Our own implementations of OSWorld's general metrics, with the same
signatures and the same behaviour (including where OSWorld's raise), written
for legato's differential tests."""

import difflib
import json


def exact_match(result, rules):
    return 1.0 if result == rules["expected"] else 0.0


def match_in_list(result, rules):
    return 1.0 if result in rules["expected"] else 0.0


def is_in_list(result, rules):
    return 1.0 if rules["expected"] in result else 0.0


def check_include_exclude(result, rules):
    if result is None:
        return 0.0
    wanted = rules.get("include", [])
    banned = rules.get("exclude", [])
    ok = all(w in result for w in wanted) and all(b not in result for b in banned)
    return 1.0 if ok else 0.0


def literal_match(result, expected, **options):
    kind = options.get("type", "str")
    fold = options.get("ignore_case", False)

    def text(v):
        return str(v).lower() if fold else str(v)

    if kind == "str":
        return float(text(result) == text(expected))
    if kind == "list":
        if not isinstance(result, (list, tuple)) or not isinstance(expected, (list, tuple)):
            return 0.0
        if len(result) != len(expected):
            return 0.0
        return float([text(r) for r in result] == [text(e) for e in expected])
    raise NotImplementedError("literal_match: unknown type")


def check_direct_json_object(result, rules):
    if isinstance(result, str):
        result = json.loads(result.strip().replace("'", '"'))
    if result is None:
        return 0.0
    try:
        reference = rules.get("expected", {})
        if reference and any(v == "__EVALUATION_FAILED__" for v in reference.values()):
            return 0.0
    except Exception:
        return 0.0
    try:
        reference = rules["expected"]
        if not rules.get("expect_in_result", False):
            for key in reference.keys():
                want, got = reference.get(key), result.get(key)
                if reference.get("ignore_list_order", False):
                    want, got = sorted(want), sorted(result.get(key))
                if want != got:
                    return 0.0
            return 1.0
        for key in reference.keys():
            want = reference.get(key)
            if isinstance(want, list):
                hit = False
                for each in want:
                    got = result.get(key)
                    if (isinstance(got, list) and each in got) or (isinstance(got, str) and each == got):
                        hit = True
                        break
                if not hit:
                    return 0.0
            elif isinstance(want, str):
                if want not in result.get(key):
                    return 0.0
            else:
                return 0.0
        return 1.0
    except Exception:
        return 0.0


def diff_text_file(result, expect):
    if result is None:
        return 0.0
    with open(result) as f:
        mine = f.read().splitlines()
    with open(expect) as f:
        theirs = f.read().splitlines()
    return difflib.SequenceMatcher(a=mine, b=theirs).ratio()
