"""tinyvl: the small vision policy of the learning example, shared by its
model server (policy_server.py) and its trainer (train.py).

Both sides must compute the same thing from the same inputs, so everything
that turns a prompt into token ids and a screenshot into a distribution over
actions lives here, once:

- ``prompt_ids``: the chat template. A message is IM_START, its role, a
  newline, its content and IM_END; text is its UTF-8 bytes (one token per
  byte), an image is VISION_START, IMAGE_TOKENS placeholder tokens and
  VISION_END, as a vision-language model's processor expands it. The prompt
  ends with the generation prompt (IM_START "assistant\\n").
- ``decode_png`` and ``features``: the policy's input, from the PNG bytes
  the server was sent (8-bit greyscale, RGB, RGBA or palette; every PNG
  filter).
- ``Policy``: a small convolutional network over the screenshot scaled down
  to a grid-aligned square; its logits are one per cell of the task's grid.
- ``reply``: the action token of a cell and the text the Qwen harness parses
  into a click at the cell's centre followed by "terminate".

Only PyTorch (Debian's python3-torch) and the standard library are used.
"""

from __future__ import annotations

import base64
import struct
import zlib
from typing import Any, Dict, List, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

# Token ids. Bytes are BYTE_BASE + byte; an action is ACTION_BASE + cell.
# An image's placeholder is Qwen-VL's <|image_pad|> id, which legato looks
# for to give each image its token span.
PAD, BOS, EOS, IM_START, IM_END, VISION_START, VISION_END = range(7)
IMAGE_PAD = 151655
BYTE_BASE = 16
ACTION_BASE = 300
IMAGE_TOKENS = 64  # placeholder tokens per image, like a processor's patches
# How legato's stream names a stored screenshot in a step's messages.
IMAGE_REF = "legato-image://"
DATA_URL = "data:image/png;base64,"


def _text(s: str) -> List[int]:
    return [BYTE_BASE + b for b in s.encode("utf-8")]


def parts(content: Any) -> List[Dict[str, Any]]:
    """A message's content as a list of parts: a plain string (how legato
    sends a text-only message) is one text part."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return list(content or [])


def prompt_ids(messages: Sequence[Dict[str, Any]]) -> Tuple[List[int], List[Tuple[int, int]]]:
    """The prompt's token ids and, per image in order, the span [start, end)
    of its placeholder tokens."""
    ids = [BOS]
    spans: List[Tuple[int, int]] = []
    for m in messages:
        ids.append(IM_START)
        ids += _text(m["role"] + "\n")
        for p in parts(m.get("content")):
            if p.get("type") == "text":
                ids += _text(p.get("text", ""))
            elif p.get("type") == "image_url":
                ids.append(VISION_START)
                spans.append((len(ids), len(ids) + IMAGE_TOKENS))
                ids += [IMAGE_PAD] * IMAGE_TOKENS
                ids.append(VISION_END)
            else:
                raise ValueError(f"unknown content part type {p.get('type')!r}")
        ids.append(IM_END)
        ids += _text("\n")
    ids.append(IM_START)
    ids += _text("assistant\n")
    return ids, spans


def image_urls(messages: Sequence[Dict[str, Any]]) -> List[str]:
    """The image URLs of a prompt, in order."""
    return [p["image_url"]["url"] for m in messages for p in parts(m.get("content"))
            if p.get("type") == "image_url"]


def png_from_data_url(url: str) -> bytes:
    if not url.startswith(DATA_URL):
        raise ValueError(f"image URL {url[:40]!r}...: want a {DATA_URL} URL")
    return base64.b64decode(url[len(DATA_URL):], validate=True)


# -- PNG ------------------------------------------------------------------------

def _paeth(a: int, b: int, c: int) -> int:
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    if pa <= pb and pa <= pc:
        return a
    return b if pb <= pc else c


class PNG:
    """A decoded PNG: its rows (filters undone) and what reads them."""

    def __init__(self, width: int, height: int, ctype: int, channels: int,
                 plte: "torch.Tensor | None", pix: torch.Tensor) -> None:
        self.width, self.height = width, height
        self.ctype, self.channels, self.plte = ctype, channels, plte
        self.pix = pix  # (height, width * channels) uint8

    def rgb(self, ys: torch.Tensor, xs: torch.Tensor) -> torch.Tensor:
        """The pixels at rows ys and columns xs, as a (3, len(ys), len(xs))
        uint8 tensor (alpha dropped)."""
        rows = self.pix.index_select(0, ys).view(len(ys), self.width, self.channels)
        px = rows.index_select(1, xs)
        if self.ctype == 3:
            px = self.plte[px[:, :, 0].long()]
        elif self.ctype in (0, 4):
            px = px[:, :, :1].expand(len(ys), len(xs), 3)
        else:
            px = px[:, :, :3]
        return px.permute(2, 0, 1).contiguous()


def decode_png(data: bytes) -> PNG:
    """A PNG's rows, filters undone: 8-bit greyscale, RGB, RGBA or palette,
    not interlaced. Rows without a filter (legato's fake screens: every
    row) are taken as they are, in one tensor operation; filtered rows go
    through the filters of the PNG specification, section 9."""
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG: bad signature")
    pos, idat, plte = 8, [], None
    width = height = depth = ctype = interlace = None
    while pos < len(data):
        if pos + 8 > len(data):
            raise ValueError("PNG cut short in a chunk header")
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        if len(body) != n:
            raise ValueError(f"PNG cut short in chunk {kind!r}")
        pos += 12 + n
        if kind == b"IHDR":
            width, height, depth, ctype, _, _, interlace = struct.unpack(">IIBBBBB", body)
        elif kind == b"PLTE":
            plte = torch.frombuffer(bytearray(body), dtype=torch.uint8).view(-1, 3)
        elif kind == b"IDAT":
            idat.append(body)
        elif kind == b"IEND":
            break
    if width is None:
        raise ValueError("PNG without IHDR")
    if depth != 8 or interlace != 0:
        raise ValueError(f"PNG of bit depth {depth}, interlace {interlace}: want 8-bit, not interlaced")
    channels = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}.get(ctype)
    if channels is None or (ctype == 3 and plte is None):
        raise ValueError(f"PNG colour type {ctype}: unsupported or without a palette")
    raw = zlib.decompress(b"".join(idat))
    stride = width * channels
    if len(raw) != height * (stride + 1):
        raise ValueError(f"PNG data of {len(raw)} bytes: want {height * (stride + 1)} for {width}x{height}")
    rows = torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(height, stride + 1)
    filters = rows[:, 0]
    pix = rows[:, 1:]
    if bool((filters != 0).any()):
        pix = _unfilter(pix, filters.tolist(), channels)
    return PNG(width, height, ctype, channels, plte, pix)


def _unfilter(pix: torch.Tensor, filters: List[int], bpp: int) -> torch.Tensor:
    out = pix.to(torch.int64)
    prev = torch.zeros(out.shape[1], dtype=torch.int64)
    for y, f in enumerate(filters):
        row = out[y]
        if f == 1:  # Sub: a running sum per channel
            row = row.view(-1, bpp).cumsum(0).view(-1) % 256
        elif f == 2:  # Up
            row = (row + prev) % 256
        elif f in (3, 4):  # Average, Paeth: each byte needs the one before
            r, b = row.tolist(), prev.tolist()
            for i in range(len(r)):
                a = r[i - bpp] if i >= bpp else 0
                if f == 3:
                    r[i] = (r[i] + (a + b[i]) // 2) % 256
                else:
                    c = b[i - bpp] if i >= bpp else 0
                    r[i] = (r[i] + _paeth(a, b[i], c)) % 256
            row = torch.tensor(r, dtype=torch.int64)
        elif f != 0:
            raise ValueError(f"PNG row {y}: unknown filter {f}")
        out[y] = row
        prev = row
    return out.to(torch.uint8)


# -- the policy ---------------------------------------------------------------

CELL_PIXELS = 6  # a grid cell's side in the policy's input
SAMPLES = 4      # pixels sampled per input pixel and side


def features(png: PNG, grid: int) -> torch.Tensor:
    """The policy's input: the screenshot scaled down to a (3, S, S) float
    tensor, S = grid · CELL_PIXELS, so that every cell of the task's grid
    becomes a square of its own. Each input pixel is the mean of SAMPLES²
    pixels spread evenly over its area (a few thousand pixels read of a
    two-million-pixel screen)."""
    side = grid * CELL_PIXELS
    n = side * SAMPLES
    ys = (torch.arange(n) * png.height + png.height // 2) // n
    xs = (torch.arange(n) * png.width + png.width // 2) // n
    x = png.rgb(ys, xs).to(torch.float32).unsqueeze(0) / 255.0
    return F.avg_pool2d(x, SAMPLES).squeeze(0)


class Policy(nn.Module):
    """Two convolutions see colours and edges; a 1×1 convolution scores each
    place; each cell's logit is the mean score over the cell. The same
    weights score every cell, so what it learns in one cell holds in all."""

    def __init__(self, grid: int = 4, width: int = 16) -> None:
        super().__init__()
        self.grid = grid
        self.conv1 = nn.Conv2d(3, width, 3, padding=1)
        self.conv2 = nn.Conv2d(width, width, 3, padding=1)
        self.score = nn.Conv2d(width, 1, 1)
        # Every cell starts equally likely: chance is the baseline.
        nn.init.zeros_(self.score.weight)
        nn.init.zeros_(self.score.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.conv1(x))
        h = F.relu(self.conv2(h))
        return F.adaptive_avg_pool2d(self.score(h), self.grid).flatten(1)


def logprobs(model: Policy, x: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Log-probabilities of the cells, (N, grid²), of the distribution the
    server samples from."""
    return F.log_softmax(model(x) / temperature, dim=-1)


# -- replies ------------------------------------------------------------------

def cell_of(token_id: int, grid: int) -> int:
    cell = token_id - ACTION_BASE
    if not 0 <= cell < grid * grid:
        raise ValueError(f"token {token_id} is not an action of a {grid}x{grid} grid")
    return cell


def reply(cell: int, grid: int) -> Tuple[int, str]:
    """The action token of a cell and its text: a click at the cell's centre
    on Qwen3-VL's 0-999 grid, then terminate."""
    col, row = cell % grid, cell // grid
    x = min(999, round((col + 0.5) * 1000 / grid))
    y = min(999, round((row + 0.5) * 1000 / grid))
    text = (f"Action: click cell {cell}.\n"
            '<tool_call>\n{"name": "computer_use", "arguments": {"action": "left_click", '
            f'"coordinate": [{x}, {y}]}}}}\n</tool_call>\n'
            '<tool_call>\n{"name": "computer_use", "arguments": {"action": "terminate", '
            '"status": "success"}}\n</tool_call>')
    return ACTION_BASE + cell, text


def token_text(token_id: int) -> str:
    return f"<cell_{token_id - ACTION_BASE}>"
