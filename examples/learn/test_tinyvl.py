"""Tests of tinyvl's PNG reading, chat template and replies
(python3 -m unittest discover -s examples/learn; TestLearnSmoke runs them)."""

import random
import struct
import unittest
import zlib

import torch

import tinyvl


def chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def paeth(a, b, c):
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    return a if pa <= pb and pa <= pc else (b if pb <= pc else c)


def encode(rows, width, ctype, channels, filters, plte=b""):
    """A PNG of rows (lists of bytes) with the given filter per row, written
    the way the specification defines each filter."""
    bpp, out, prev = channels, bytearray(), [0] * (width * channels)
    for row, f in zip(rows, filters):
        out.append(f)
        for i, x in enumerate(row):
            a = row[i - bpp] if i >= bpp else 0
            b = prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            pred = [0, a, b, (a + b) // 2, paeth(a, b, c)][f]
            out.append((x - pred) % 256)
        prev = row
    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, len(rows), 8, ctype, 0, 0, 0))
    if plte:
        png += chunk(b"PLTE", plte)
    return png + chunk(b"IDAT", zlib.compress(bytes(out))) + chunk(b"IEND", b"")


class PNGTest(unittest.TestCase):
    def test_every_filter(self):
        rnd = random.Random(7)
        width, height = 13, 10
        for ctype, channels in ((2, 3), (6, 4), (0, 1)):
            rows = [[rnd.randrange(256) for _ in range(width * channels)] for _ in range(height)]
            filters = [y % 5 for y in range(height)]
            png = tinyvl.decode_png(encode(rows, width, ctype, channels, filters))
            got = png.rgb(torch.arange(height), torch.arange(width))
            for y in range(height):
                for x in range(width):
                    px = rows[y][x * channels:(x + 1) * channels]
                    want = px[:3] if channels >= 3 else px * 3
                    self.assertEqual(got[:, y, x].tolist(), want, f"colour type {ctype}, pixel ({x}, {y})")

    def test_palette(self):
        plte = bytes([10, 20, 30, 200, 100, 0])
        png = tinyvl.decode_png(encode([[0, 1, 1], [1, 0, 0]], 3, 3, 1, [0, 0], plte))
        got = png.rgb(torch.arange(2), torch.arange(3))
        self.assertEqual(got[:, 0, 1].tolist(), [200, 100, 0])
        self.assertEqual(got[:, 1, 1].tolist(), [10, 20, 30])

    def test_damaged(self):
        good = encode([[1, 2, 3]], 1, 2, 3, [0])
        for bad in (b"GIF89a", good[:30], good.replace(b"IHDR", b"IHDx")):
            with self.assertRaises((ValueError, zlib.error)):
                tinyvl.decode_png(bad)


class TemplateTest(unittest.TestCase):
    def test_spans_in_order(self):
        img = {"type": "image_url", "image_url": {"url": "legato-image://a"}}
        msgs = [{"role": "system", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "one"}, img]},
                {"role": "assistant", "content": "ok"},
                {"role": "user", "content": [img]}]
        ids, spans = tinyvl.prompt_ids(msgs)
        self.assertEqual(len(spans), 2)
        for start, end in spans:
            self.assertEqual(ids[start - 1], tinyvl.VISION_START)
            self.assertEqual(ids[start:end], [tinyvl.IMAGE_PAD] * tinyvl.IMAGE_TOKENS)
            self.assertEqual(ids[end], tinyvl.VISION_END)
        self.assertLess(spans[0][1], spans[1][0])
        # A text-only message sent as a string is the same tokens as one
        # text part.
        as_parts = [dict(m, content=[{"type": "text", "text": m["content"]}]) if isinstance(m["content"], str) else m
                    for m in msgs]
        self.assertEqual(tinyvl.prompt_ids(as_parts)[0], ids)

    def test_reply_clicks_the_cell_centre(self):
        for grid in (1, 4, 16):
            for cell in range(grid * grid):
                tok, text = tinyvl.reply(cell, grid)
                self.assertEqual(tinyvl.cell_of(tok, grid), cell)
                self.assertIn('"action": "left_click"', text)
                self.assertIn('"action": "terminate"', text)
        with self.assertRaises(ValueError):
            tinyvl.cell_of(tinyvl.ACTION_BASE + 16, 4)


if __name__ == "__main__":
    unittest.main()
