"""Our own implementation of OSWorld's compare_text_file."""

import re


def compare_text_file(actual, expected, **options):
    if not actual:
        return 0.0
    with open(actual) as f:
        mine = f.read()
    with open(expected) as f:
        theirs = f.read()
    if options.get("ignore_blanks", False):
        mine = re.sub(r"\s+", " ", re.sub(r"[\t\n]", " ", mine).strip())
        theirs = re.sub(r"\s+", " ", re.sub(r"[\t\n]", " ", theirs).strip())
    if options.get("ignore_case", False):
        mine, theirs = mine.lower(), theirs.lower()
    return 1.0 if mine == theirs else 0.0
