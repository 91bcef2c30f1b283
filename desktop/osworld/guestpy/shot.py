"""The screenshot the executor hands back with a settle (x11.py comes first).

It must show what the guest server's GET /screenshot shows for the same screen, pixel for
pixel, so that a trainer's data does not depend on which of the two took it: the X screen,
read from the server with GetImage, with the pointer drawn in the way that server draws it.
The desktop compares the two once per desktop and keeps to /screenshot when they differ.

Pointer styles (POINTER):
  legato   legato's test guest server (testdata/guest/server.py): a black and white arrow
           whose tip is at the pointer.
  none     the server draws no pointer (legato's server with --no-pointer or --pointer none).
  osworld  OSWorld's own server (its desktop_env/server/main.py), and legato's with
           --pointer osworld: the X cursor image pasted at the pointer (draw_cursor).
  unknown  any other server: the executor takes no screenshots, and says why.
The style is found from the guest server's command line and script (the executor's parent,
see screen_of). Where legato's server reads Xvfb's framebuffer file (--xwd), so does this;
with the osworld style both read the screen with GetImage, as OSWorld's server does.

The PNG is RGB, 8 bits, filter None on every row, one zlib stream at a given level, made in
bands on two threads (encode_png): the same pixels give the same bytes (one zlib build), and
under software emulation the row filters cost more in Python than the size they save.
"""
import re
import threading
import zlib

# The styles this draws; "unknown" is not one.
STYLES = ("legato", "none", "osworld")

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


# legato's guest server says so in the first lines of its script.
LEGATO_MARK = b"legato's OSWorld-compatible guest server"

# OSWorld's server: its script (upstream's desktop_env/server/main.py) is a Flask app whose
# GET /screenshot is capture_screen_with_cursor, which on Linux reads the cursor image with
# pyxcursor's getCursorImageArrayFast and pastes it at the pointer with itself as the mask.
# All of them must be there: a server that draws the pointer otherwise is unknown.
OSWORLD_MARKS = [re.compile(p) for p in (
    rb"\bFlask\(",
    rb"\.route\(\s*['\"]/screenshot['\"]",
    rb"\bdef capture_screen_with_cursor\(",
    rb"\.getCursorImageArrayFast\(\)",
    rb"\.paste\(\s*cursor_img\s*,\s*\(\s*cursor_x\s*,\s*cursor_y\s*\)\s*,\s*cursor_img\s*\)",
)]

SCRIPT_MAX = 1 << 20  # bytes of the server's script read; upstream's main.py is ~60 KB


def server_screen(pid):
    """(pointer style, XWD file or None, why the style is unknown) of the guest server of
    process pid, from its command line and its script (relative paths from its directory)."""
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            argv = f.read().decode("utf-8", "replace").split("\0")
    except OSError as e:
        return "unknown", None, "cannot read the guest server's command line: %s" % e
    script = next((a for a in argv if a.endswith(".py")), "")
    text = None
    if script:
        try:
            with open(os.path.join("/proc/%d/cwd" % pid, script), "rb") as f:
                text = f.read(SCRIPT_MAX)
        except OSError:
            pass
    return screen_of(argv, script, text)


def screen_of(argv, script, text):
    """(pointer style, XWD file or None, why) of a guest server run as argv, whose script is
    script, with text its contents (None: unreadable). legato's server is known by the line
    its script starts with, and draws as its flags say (--pointer STYLE, --pointer=STYLE,
    --no-pointer; it takes no abbreviations); it reads Xvfb's framebuffer file when given
    --xwd, a file that holds the X server's own pointer sprite, which GetImage leaves out, so
    the screenshot must come from the same file, except with --pointer osworld, where it
    reads the screen with GetImage as OSWorld's server does. OSWorld's server is known by
    OSWORLD_MARKS; its screen is GetImage's."""
    if text is None:
        return "unknown", None, "cannot read the guest server's script %r" % script
    if LEGATO_MARK not in text[:200]:
        if all(m.search(text) for m in OSWORLD_MARKS):
            return "osworld", None, ""
        return "unknown", None, ("the guest server (%s) is neither legato's nor OSWorld's: "
                                 "how it draws the pointer is not known" % script)
    style, xwd = "legato", None
    for i, a in enumerate(argv):
        nxt = argv[i + 1] if i + 1 < len(argv) else None
        if a == "--xwd" and nxt is not None:
            xwd = nxt
        elif a.startswith("--xwd="):
            xwd = a[len("--xwd="):]
        elif a == "--no-pointer":
            style = "none"
        elif a == "--pointer" and nxt is not None:
            style = nxt
        elif a.startswith("--pointer="):
            style = a[len("--pointer="):]
    if style not in STYLES:
        return "unknown", None, "legato's guest server draws the pointer as %r, unknown here" % style
    return style, None if style == "osworld" else xwd, ""


class Shooter:
    """Takes screenshots over one X connection of its own."""

    def __init__(self, style, xwd=None, why=""):
        self.style = style
        self.xwd = xwd
        self.why = why  # why the style is unknown
        self.x = None

    def connect(self):
        if self.x is None:
            self.x = X()
            if self.x.image_byte_order != 0 or self.x.root_depth not in (24, 32):
                raise XError("screen format not handled: byte order %d, depth %d"
                             % (self.x.image_byte_order, self.x.root_depth))
        return self.x

    def check(self):
        """Makes sure the osworld style can be drawn here: without the X cursor image (the
        server has no XFIXES) the style is unknown."""
        if self.style != "osworld":
            return
        try:
            self.connect().cursor_image()
        except (OSError, struct.error) as e:  # XError is an OSError
            self.style = "unknown"
            self.why = "OSWorld's guest server pastes the X cursor image, which cannot be read here: %s" % e
            self.drop()

    def drop(self):
        if self.x is not None:
            self.x.close()
            self.x = None

    def shot(self, level):
        """(png bytes, width, height, capture seconds, encode seconds)."""
        if self.style not in STYLES:
            raise XError(self.why or "the guest server draws the pointer in a way this does not (%s)" % self.style)
        t0 = time.monotonic()
        cursor = None
        try:
            x = self.connect()
            if self.xwd:
                w, h, raw = read_xwd(self.xwd)
            else:
                w, h = x.width, x.height
                raw = x.image(0, 0, w, h)
            px, py, _ = x.pointer()
            if self.style == "osworld":
                cursor = x.cursor_image()
        except (OSError, struct.error):
            self.drop()
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
        elif cursor is not None:
            draw_cursor(rgb, w, h, px, py, *cursor)
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


def draw_cursor(rgb, w, h, px, py, cw, ch, argb):
    """OSWorld's pointer, as its server's capture_screen_with_cursor draws it on Linux: the X
    cursor image (cw x ch, argb as x11.cursor_image gives it: B, G, R, A bytes, the colour
    premultiplied by A) with its top-left corner at the pointer (the hot spot ignored), cut
    at the screen's edges. Its server reads each pixel's bytes B, G, R, A as R, G, B, A (red
    and blue swap) and pastes the image with itself as the mask, as PIL does: each channel
    (dst * (255 - A) + C * A) / 255, rounded to the nearest (PIL's DIV255), with C the colour
    as it is, already premultiplied. A = 0 leaves the pixel as it is."""
    for cy in range(max(0, -py), min(ch, h - py)):
        row = (py + cy) * w + px
        for cx in range(max(0, -px), min(cw, w - px)):
            o = (cy * cw + cx) * 4
            a = argb[o + 3]
            if a == 0:
                continue
            i = (row + cx) * 3
            for k in range(3):  # the screen's R, G, B from the image's B, G, R
                t = rgb[i + k] * (255 - a) + argb[o + k] * a + 128
                rgb[i + k] = (t + (t >> 8)) >> 8


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
