"""The screenshot the executor hands back with a settle (x11.py comes first).

It must show what the guest server's GET /screenshot shows for the same screen, pixel for
pixel, so that a trainer's data does not depend on which of the two took it: the X screen,
read from the server with GetImage, with the pointer drawn in the way that server draws it.
The desktop compares the two once per desktop and keeps to /screenshot when they differ.

Pointer styles (POINTER):
  legato  legato's test guest server (testdata/guest/server.py): a black and white arrow
          whose tip is at the pointer.
  none    the server draws no pointer (legato's server with --no-pointer).
The style is found from the guest server's command line (the executor's parent): OSWorld's
own server pastes the X cursor image with PIL, which this does not draw; there the style is
"unknown", and the desktop does not ask for screenshots. Where legato's server reads Xvfb's
framebuffer file (--xwd), so does this (see server_screen).

The PNG is RGB, 8 bits, filter None on every row, one zlib stream at a given level, made in
bands on two threads (encode_png): the same pixels give the same bytes (one zlib build), and
under software emulation the row filters cost more in Python than the size they save.
"""
import threading
import zlib

# The arrow of legato's test guest server, 'X' black, '.' white, its tip the top-left corner.
# It must stay the same as that server's (ARROW in testdata/guest/server.py): the desktop's
# check that both screenshots agree fails otherwise.
ARROW = [
    "X",
    "XX",
    "X.X",
    "X..X",
    "X...X",
    "X....X",
    "X.....X",
    "X......X",
    "X.......X",
    "X........X",
    "X.....XXXXX",
    "X..X..X",
    "X.X X..X",
    "XX  X..X",
    "X    X..X",
    "     X..X",
    "      XX",
]


def server_screen(pid):
    """(pointer style, XWD file or None) of the guest server of process pid, from its command
    line. legato's server reads Xvfb's framebuffer file when given --xwd: that file holds the
    X server's own pointer sprite, which GetImage leaves out, so the screenshot must come from
    the same file."""
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            argv = f.read().decode("utf-8", "replace").split("\0")
    except OSError:
        return "unknown", None
    script = next((a for a in argv if a.endswith(".py")), "")
    try:
        with open(script, "rb") as f:
            head = f.read(200)
    except OSError:
        return "unknown", None
    if b"legato's OSWorld-compatible guest server" not in head:
        return "unknown", None
    xwd = None
    for i, a in enumerate(argv):
        if a == "--xwd" and i + 1 < len(argv):
            xwd = argv[i + 1]
        elif a.startswith("--xwd="):
            xwd = a[len("--xwd="):]
    return ("none" if "--no-pointer" in argv else "legato"), xwd


class Shooter:
    """Takes screenshots over one X connection of its own."""

    def __init__(self, style, xwd=None):
        self.style = style
        self.xwd = xwd
        self.x = None

    def connect(self):
        if self.x is None:
            self.x = X()
            if self.x.image_byte_order != 0 or self.x.root_depth not in (24, 32):
                raise XError("screen format not handled: byte order %d, depth %d"
                             % (self.x.image_byte_order, self.x.root_depth))
        return self.x

    def shot(self, level):
        """(png bytes, width, height, capture seconds, encode seconds)."""
        if self.style not in ("legato", "none"):
            raise XError("the guest server draws the pointer in a way this does not (%s)" % self.style)
        t0 = time.monotonic()
        try:
            x = self.connect()
            if self.xwd:
                w, h, raw = read_xwd(self.xwd)
            else:
                w, h = x.width, x.height
                raw = x.image(0, 0, w, h)
            px, py, _ = x.pointer()
        except (OSError, struct.error):
            if self.x is not None:
                self.x.close()
                self.x = None
            raise
        if len(raw) < w * h * 4:
            raise XError("short image: %d bytes for %dx%d" % (len(raw), w, h))
        # B,G,R,X in memory (LSB first, 32 bits per pixel): three strided copies make R,G,B.
        rgb = bytearray(w * h * 3)
        rgb[0::3] = raw[2::4]
        rgb[1::3] = raw[1::4]
        rgb[2::3] = raw[0::4]
        del raw
        if self.style == "legato":
            draw_arrow(rgb, w, h, px, py)
        t1 = time.monotonic()
        png = encode_png(rgb, w, h, level)
        return png, w, h, t1 - t0, time.monotonic() - t1


def read_xwd(path):
    """(width, height, B,G,R,X pixels) of an XWD file of Xvfb's (-fbdir)."""
    with open(path, "rb") as f:
        head = f.read(100)
        fields = struct.unpack(">25I", head)
        size, version, w, h = fields[0], fields[1], fields[4], fields[5]
        order, bpp, bpl = fields[7], fields[11], fields[12]
        masks, ncolors = fields[14:17], fields[19]
        if version != 7 or bpp != 32 or order != 0 or masks != (0xFF0000, 0xFF00, 0xFF):
            raise XError("XWD file %s: a format not handled (version %d, %d bits, byte order %d)"
                         % (path, version, bpp, order))
        f.seek(size + ncolors * 12)
        raw = f.read(bpl * h)
    if len(raw) < bpl * h:
        raise XError("XWD file %s is truncated" % path)
    if bpl != w * 4:
        raw = b"".join(raw[y * bpl:y * bpl + w * 4] for y in range(h))
    return w, h, raw


def draw_arrow(rgb, w, h, px, py):
    for dy, row in enumerate(ARROW):
        y = py + dy
        if y < 0 or y >= h:
            continue
        for dx, c in enumerate(row):
            x = px + dx
            if c == " " or x < 0 or x >= w:
                continue
            i = (y * w + x) * 3
            rgb[i:i + 3] = b"\x00\x00\x00" if c == "X" else b"\xff\xff\xff"


def png_part(tag, data):
    body = tag + data
    return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body) & 0xFFFFFFFF)


# The image is compressed in ENCODE_PARTS bands of rows, each on a thread of its own (zlib
# lets go of the GIL while it deflates), joined into one zlib stream as pigz does: each band a
# raw deflate stream of its own that ends on a byte boundary (a sync flush), the last one
# final, one Adler-32 over all. A fixed count, not the guest's CPUs: the same pixels give the
# same bytes on every guest.
ENCODE_PARTS = 2


def zlib_header(level):
    """The two bytes zlib starts a stream of this level with (FLEVEL as zlib sets it)."""
    flevel = 0 if level < 2 else 1 if level < 6 else 2 if level == 6 else 3
    cmf = 0x78
    flg = flevel << 6
    return bytes((cmf, flg + 31 - ((cmf << 8) + flg) % 31))


def encode_png(rgb, w, h, level):
    stride = w * 3
    mv = memoryview(rgb)
    bands = [(i * h // ENCODE_PARTS, (i + 1) * h // ENCODE_PARTS) for i in range(ENCODE_PARTS)]
    raws, out = [None] * len(bands), [None] * len(bands)

    def band(i):
        lo, hi = bands[i]
        raw = bytearray((hi - lo) * (stride + 1))  # each row: filter type 0, then the row
        for y in range(lo, hi):
            o = (y - lo) * (stride + 1) + 1
            raw[o:o + stride] = mv[y * stride:(y + 1) * stride]
        z = zlib.compressobj(level, zlib.DEFLATED, -15)
        last = i == len(bands) - 1
        out[i] = z.compress(raw) + z.flush(zlib.Z_FINISH if last else zlib.Z_SYNC_FLUSH)
        raws[i] = raw

    threads = [threading.Thread(target=band, args=(i,)) for i in range(1, len(bands))]
    for t in threads:
        t.start()
    band(0)
    for t in threads:
        t.join()
    if any(o is None for o in out):
        raise XError("a band of the screenshot was not encoded")
    adler = 1
    for raw in raws:
        adler = zlib.adler32(raw, adler)
    idat = b"".join([zlib_header(level)] + out + [struct.pack(">I", adler & 0xFFFFFFFF)])
    ihdr = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    return b"".join([b"\x89PNG\r\n\x1a\n", png_part(b"IHDR", ihdr), png_part(b"IDAT", idat),
                     png_part(b"IEND", b"")])
