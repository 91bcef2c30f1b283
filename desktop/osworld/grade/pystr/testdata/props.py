"""Prints, as JSON, the character properties pystr's tables hold, read from
the running interpreter's behaviour one code point at a time.

A character's class in the final sigma rule comes from lower() of probes:
x + "\u03a3" ends in "\u03c2" exactly when x is cased and not
case-ignorable; "A" + x + "\u03a3" ends in "\u03c2" when x is either (an
ignorable x is skipped, reaching the cased "A")."""

import json
import sys
import unicodedata

SIGMA, FINAL = "\u03a3", "\u03c2"
lower, cased, ignorable, space, lines, printable, decimal = {}, [], [], [], [], [], {}
for c in range(0x110000):
    x = chr(c)
    low = x.lower()
    if low != x:
        lower[c] = [ord(y) for y in low]
    if (x + SIGMA).lower()[-1] == FINAL:
        cased.append(c)
    elif ("A" + x + SIGMA).lower()[-1] == FINAL:
        ignorable.append(c)
    if x.isspace():
        space.append(c)
    if len(("a" + x + "b").splitlines()) == 2:
        lines.append(c)
    if x.isprintable():
        printable.append(c)
    if x.isdecimal():
        decimal[c] = int(x)
json.dump({"python": sys.version.split()[0], "unicode": unicodedata.unidata_version,
           "lower": lower, "cased": cased, "ignorable": ignorable, "space": space,
           "lines": lines, "printable": printable, "decimal": decimal}, sys.stdout)
