"""Qwen's smart-resize rule in Python, to check the Go SmartResize against
Python's own float and rounding semantics (round() rounds halves to even).

Reads a JSON list of [height, width, factor, min_pixels, max_pixels] on
stdin and writes the list of [height, width] results.
"""

import json
import math
import sys


def smart_resize(height, width, factor, min_pixels, max_pixels):
    h = max(factor, round(height / factor) * factor)
    w = max(factor, round(width / factor) * factor)
    if h * w > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h = max(factor, math.floor(height / beta / factor) * factor)
        w = max(factor, math.floor(width / beta / factor) * factor)
    elif h * w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h = math.ceil(height * beta / factor) * factor
        w = math.ceil(width * beta / factor) * factor
    return [h, w]


json.dump([smart_resize(*c) for c in json.load(sys.stdin)], sys.stdout)
