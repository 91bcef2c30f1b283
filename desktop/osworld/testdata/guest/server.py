#!/usr/bin/env python3
"""legato's OSWorld-compatible guest server, for test guests (Python 3 stdlib only).

It speaks the HTTP API of OSWorld's in-guest server (same paths, methods, form and JSON
fields, response shapes and status codes) so that legato's Go client and setup controller
can be tested on the host under Xvfb, and inside a small Debian test VM, without Flask,
pyatspi or pyautogui. It is not OSWorld's server: users run OSWorld's own image.

Endpoints (OSWorld's shapes):
  GET  /screenshot                 PNG of the X screen, pointer drawn in (like OSWorld)
  POST /execute, /setup/execute    {"command": [..] | "..", "shell": bool}
                                   -> 200 {"status": "success", "output", "error", "returncode"}
                                   -> 500 {"status": "error", "message"} (timeout 120 s, spawn error)
  POST /execute_with_verification, /setup/execute_with_verification
                                   + {"verification": {"window_exists", "command_success"},
                                      "max_wait_time", "check_interval"}
  POST /setup/launch               {"command", "shell"} -> 200 text, 500 {"status": "error", ...}
  POST /setup/open_file            {"path", "window_name"?, "timeout_seconds"?} -> waits for a window
  POST /setup/upload               multipart: file_path (field), file_data (file)
  POST /setup/activate_window      {"window_name", "strict", "by_class"} (wmctrl, like OSWorld)
  POST /setup/close_window         {"window_name", "strict", "by_class"}
  POST /setup/change_wallpaper     {"path"}
  POST /file                       form file_path -> the file as an attachment
  GET  /accessibility              {"AT": xml}
  GET  /terminal                   {"output": str | null, "status": "success"}
  POST /screen_size                {"width", "height"}
  GET  /platform, GET /cursor_position, POST /wallpaper, POST /desktop_path,
  POST /list_directory, POST /window_size (form app_class_name)

Differences from OSWorld's server, all because a test guest has no AT-SPI and no GNOME:
  * /accessibility has no AT-SPI: it returns a well-formed tree in OSWorld's namespaces built
    from the window manager's client list: <desktop-frame> holding one <application> per
    WM_CLASS with one <frame> per window (name, st:active, st:showing, st:visible,
    cp:screencoord, cp:size).
  * /terminal cannot read a terminal's text without AT-SPI: "output" is always null.
  * /setup/change_wallpaper uses gsettings when present, else remembers the path, which
    POST /wallpaper then serves.
  * /setup/open_file opens files with --opener (default xdg-open).

The pointer on /screenshot (--pointer): "legato" (the default) draws a black and white arrow
with its tip at the pointer; "none" (or --no-pointer) draws none; "osworld" draws it as
OSWorld's server does on Linux: the X cursor image (XFIXES, through libXfixes as OSWorld
reads it, red and blue swapped) pasted with its top-left corner at the pointer, blended as
PIL blends it, on the screen read with GetImage (--xwd is not read then: Xvfb's framebuffer
file holds the X server's own pointer sprite, which GetImage leaves out).

Run: server.py [--host 127.0.0.1] [--port 5000] [--xwd /run/xvfb/Xvfb_screen0] [--opener CMD]
               [--pointer legato|none|osworld]
With --port 0 it picks a free port; it always prints "listening on HOST:PORT" on stdout once
it accepts connections. DISPLAY comes from the environment. SIGTERM kills every program it
launched, then exits.
"""
import argparse
import array
import ctypes
import ctypes.util
import json
import mmap
import os
import shlex
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import zlib
import xml.etree.ElementTree as ET
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

EXECUTE_TIMEOUT = 120  # seconds; OSWorld's /execute limit
OPEN_FILE_TIMEOUT = 1800  # seconds; OSWorld's default wait for an opened file's window
CHUNK = 256 * 1024

NS = {
    "st": "https://accessibility.ubuntu.example.org/ns/state",
    "attr": "https://accessibility.ubuntu.example.org/ns/attributes",
    "cp": "https://accessibility.ubuntu.example.org/ns/component",
    "doc": "https://accessibility.ubuntu.example.org/ns/document",
    "docattr": "https://accessibility.ubuntu.example.org/ns/document/attributes",
    "txt": "https://accessibility.ubuntu.example.org/ns/text",
    "val": "https://accessibility.ubuntu.example.org/ns/value",
    "act": "https://accessibility.ubuntu.example.org/ns/action",
}


class BadRequest(Exception):
    """A request the server refuses with 400 and a message."""


class State:
    """What the server remembers between requests."""

    def __init__(self, args):
        self.args = args
        self.lock = threading.Lock()
        self.launched = []  # Popen objects of programs started by launch/open_file
        self.wallpaper = None

    def track(self, proc):
        with self.lock:
            self.launched = [p for p in self.launched if p.poll() is None]
            self.launched.append(proc)

    def reap(self):
        """Reap the launched programs that ended, so none lingers as a zombie.

        Every request does it first: a program that quit (GIMP after Ctrl+Q) must be gone
        from the process table when a grader's command looks for it, as with OSWorld's
        server, whose Python reaps its dropped children at each new subprocess."""
        with self.lock:
            self.launched = [p for p in self.launched if p.poll() is None]

    def kill_launched(self):
        with self.lock:
            procs, self.launched = self.launched, []
        for p in procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except OSError:
                    pass
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass


# ---- screenshots -------------------------------------------------------------------------

def png_chunk(tag, data):
    body = tag + data
    return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body) & 0xFFFFFFFF)


def xwd_to_image(buf):
    """Returns (width, height, channels, pixels) from an XWD image of 32 bits per pixel:
    RGBA (alpha 255) on the common little-endian BGRX layout, RGB otherwise."""
    fields = struct.unpack(">25I", bytes(buf[:100]))
    header_size, version, depth, width, height = fields[0], fields[1], fields[3], fields[4], fields[5]
    byte_order, bpp, bpl = fields[7], fields[11], fields[12]
    rmask, gmask, bmask, ncolors = fields[14], fields[15], fields[16], fields[19]
    if version != 7 or bpp != 32:
        raise ValueError("unsupported XWD image: version %d, %d bits per pixel, depth %d"
                         % (version, bpp, depth))
    start = header_size + ncolors * 12
    raw = bytes(buf[start:start + bpl * height])
    if len(raw) < bpl * height:
        raise ValueError("truncated XWD image")
    if bpl != width * 4:
        raw = b"".join(raw[y * bpl:y * bpl + width * 4] for y in range(height))
    if (byte_order == 0 and sys.byteorder == "little"
            and (rmask, gmask, bmask) == (0xFF0000, 0xFF00, 0xFF)):
        # Pixels are B,G,R,X in memory: swapping each 32-bit word gives X,R,G,B, so the
        # bytes from offset 1 read R,G,B,X; setting every X to 255 makes RGBA. One strided
        # write instead of six strided copies: several times faster in pure Python.
        words = array.array("I", raw)
        words.byteswap()
        rgba = bytearray(words.tobytes()[1:] + b"\x00")
        rgba[3::4] = b"\xff" * (width * height)
        return width, height, 4, rgba

    def index(mask):
        shift = (mask & -mask).bit_length() - 1
        i = shift // 8
        return i if byte_order == 0 else 3 - i

    rgb = bytearray(width * height * 3)
    rgb[0::3] = raw[index(rmask)::4]
    rgb[1::3] = raw[index(gmask)::4]
    rgb[2::3] = raw[index(bmask)::4]
    return width, height, 3, rgb


# How /screenshot draws the pointer (--pointer): "legato", the arrow below with its tip at the
# pointer; "none", no pointer; "osworld", as OSWorld's own server does (screenshot_osworld).
POINTER_STYLES = ("legato", "none", "osworld")

# An arrow pointer, 'X' black outline, '.' white fill; its hot spot is the top-left corner.
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


def draw_pointer(width, height, channels, pix, px, py):
    for dy, row in enumerate(ARROW):
        y = py + dy
        if y < 0 or y >= height:
            continue
        for dx, c in enumerate(row):
            x = px + dx
            if c == " " or x < 0 or x >= width:
                continue
            v = 0 if c == "X" else 255
            i = (y * width + x) * channels
            pix[i:i + 3] = bytes((v, v, v))


def encode_png(width, height, channels, pix):
    stride = width * channels
    mv = memoryview(pix)
    scan = b"".join(b"\x00" + mv[y * stride:(y + 1) * stride] for y in range(height))
    color_type = 6 if channels == 4 else 2
    ihdr = struct.pack(">IIBBBBB", width, height, 8, color_type, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr)
            + png_chunk(b"IDAT", zlib.compress(scan, 1)) + png_chunk(b"IEND", b""))


def pointer_position():
    out = run_quiet(["xdotool", "getmouselocation", "--shell"])
    if out is None:
        return None
    vals = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    try:
        return int(vals["X"]), int(vals["Y"])
    except (KeyError, ValueError):
        return None


# ---- OSWorld's way (--pointer osworld) -------------------------------------------------------
#
# OSWorld's server, on Linux, takes the screen with pyautogui (the X server's GetImage of the
# root window, without the X server's own pointer sprite), reads the X cursor image through
# libXfixes with ctypes, and pastes it with PIL. Done here the same way, through the same C
# libraries, with the paste written out: it is the reference the executor's own drawing
# (guestpy/shot.py, over the X protocol) is tested against, so it shares none of its code.


class XImage(ctypes.Structure):
    """The head of Xlib's XImage, as far as it is read here."""
    _fields_ = [("width", ctypes.c_int), ("height", ctypes.c_int), ("xoffset", ctypes.c_int),
                ("format", ctypes.c_int), ("data", ctypes.c_void_p), ("byte_order", ctypes.c_int),
                ("bitmap_unit", ctypes.c_int), ("bitmap_bit_order", ctypes.c_int),
                ("bitmap_pad", ctypes.c_int), ("depth", ctypes.c_int),
                ("bytes_per_line", ctypes.c_int), ("bits_per_pixel", ctypes.c_int),
                ("red_mask", ctypes.c_ulong), ("green_mask", ctypes.c_ulong),
                ("blue_mask", ctypes.c_ulong)]


class XFixesCursorImage(ctypes.Structure):
    """libXfixes' XFixesCursorImage: each pixel an unsigned long holding 0xAARRGGBB."""
    _fields_ = [("x", ctypes.c_short), ("y", ctypes.c_short), ("width", ctypes.c_ushort),
                ("height", ctypes.c_ushort), ("xhot", ctypes.c_ushort), ("yhot", ctypes.c_ushort),
                ("cursor_serial", ctypes.c_ulong), ("pixels", ctypes.POINTER(ctypes.c_ulong))]


XLIBS = []


def xlibs():
    """(libX11, libXfixes), loaded once, their functions typed."""
    if XLIBS:
        return XLIBS[0]
    libs = []
    for name, package in (("X11", "libx11-6"), ("Xfixes", "libxfixes3")):
        path = ctypes.util.find_library(name)
        if not path:
            raise RuntimeError("--pointer osworld needs lib%s (Debian package %s)" % (name, package))
        libs.append(ctypes.CDLL(path))
    x11, xfixes = libs
    vp = ctypes.c_void_p
    x11.XOpenDisplay.restype, x11.XOpenDisplay.argtypes = vp, [ctypes.c_char_p]
    x11.XCloseDisplay.argtypes = [vp]
    x11.XDefaultRootWindow.restype, x11.XDefaultRootWindow.argtypes = ctypes.c_ulong, [vp]
    x11.XDisplayWidth.argtypes = x11.XDisplayHeight.argtypes = [vp, ctypes.c_int]
    x11.XGetImage.restype = ctypes.POINTER(XImage)
    x11.XGetImage.argtypes = [vp, ctypes.c_ulong, ctypes.c_int, ctypes.c_int, ctypes.c_uint,
                              ctypes.c_uint, ctypes.c_ulong, ctypes.c_int]
    x11.XDestroyImage.argtypes = [ctypes.POINTER(XImage)]
    x11.XQueryPointer.restype = ctypes.c_int
    x11.XQueryPointer.argtypes = [vp, ctypes.c_ulong] + [ctypes.POINTER(ctypes.c_ulong)] * 2 + [
        ctypes.POINTER(ctypes.c_int)] * 4 + [ctypes.POINTER(ctypes.c_uint)]
    x11.XFree.argtypes = [vp]
    xfixes.XFixesGetCursorImage.restype = ctypes.POINTER(XFixesCursorImage)
    xfixes.XFixesGetCursorImage.argtypes = [vp]
    XLIBS.append((x11, xfixes))
    return XLIBS[0]


def cursor_rgba(raw, count, word):
    """The cursor image as OSWorld's server hands it to PIL: of each pixel's unsigned long
    (word bytes, native order) the first four bytes, taken as R, G, B, A. On a little-endian
    machine those are 0xAARRGGBB's B, G, R, A: red and blue end up swapped."""
    out = bytearray(count * 4)
    for i in range(count):
        out[i * 4:i * 4 + 4] = raw[i * word:i * word + 4]
    return out


def paste_cursor(width, height, channels, pix, cw, ch, rgba, x, y):
    """PIL's Image.paste(cursor, (x, y), cursor) onto the screen: the box cut to the screen,
    then every channel blended by the cursor's alpha as PIL rounds it, the cursor's colour
    taken as it is (premultiplied already, yet multiplied again)."""
    x0, y0 = max(x, 0), max(y, 0)
    x1, y1 = min(x + cw, width), min(y + ch, height)
    for sy in range(y0, y1):
        for sx in range(x0, x1):
            c = ((sy - y) * cw + (sx - x)) * 4
            alpha = rgba[c + 3]
            p = (sy * width + sx) * channels
            for k in range(3):
                v = pix[p + k] * (255 - alpha) + rgba[c + k] * alpha
                pix[p + k] = (2 * v + 255) // 510  # v / 255 rounded half up, as PIL's DIV255


def screenshot_osworld():
    """The screen as OSWorld's server shows it: (width, height, channels, pixels)."""
    x11, xfixes = xlibs()
    dpy = x11.XOpenDisplay(None)
    if not dpy:
        raise RuntimeError("cannot open the X display %r" % os.environ.get("DISPLAY"))
    try:
        root = x11.XDefaultRootWindow(dpy)
        width, height = x11.XDisplayWidth(dpy, 0), x11.XDisplayHeight(dpy, 0)
        img = x11.XGetImage(dpy, root, 0, 0, width, height, 0xFFFFFFFF, 2)  # ZPixmap
        if not img:
            raise RuntimeError("XGetImage of the root window failed")
        try:
            im = img.contents
            if (im.bits_per_pixel != 32 or im.byte_order != 0
                    or (im.red_mask, im.green_mask, im.blue_mask) != (0xFF0000, 0xFF00, 0xFF)):
                raise RuntimeError("screen format not handled: %d bits, byte order %d"
                                   % (im.bits_per_pixel, im.byte_order))
            bgrx = ctypes.string_at(im.data, im.bytes_per_line * height)
            bpl = im.bytes_per_line
        finally:
            x11.XDestroyImage(img)
        pix = bytearray(width * height * 3)
        for row in range(height):
            line = bgrx[row * bpl:row * bpl + width * 4]
            o = row * width * 3
            pix[o:o + width * 3:3] = line[2::4]
            pix[o + 1:o + width * 3:3] = line[1::4]
            pix[o + 2:o + width * 3:3] = line[0::4]
        cur = xfixes.XFixesGetCursorImage(dpy)
        if not cur:
            # No XFIXES: OSWorld's server (of late) then shows the screen without the pointer.
            return width, height, 3, pix
        try:
            c = cur.contents
            cw, ch = c.width, c.height
            word = ctypes.sizeof(ctypes.c_ulong)
            rgba = cursor_rgba(ctypes.string_at(c.pixels, cw * ch * word), cw * ch, word)
        finally:
            x11.XFree(cur)
        # pyautogui.position(): the pointer's place on the root window.
        win = [ctypes.c_ulong() for _ in range(2)]
        pos = [ctypes.c_int() for _ in range(4)]
        mask = ctypes.c_uint()
        if not x11.XQueryPointer(dpy, root, *map(ctypes.byref, win + pos), ctypes.byref(mask)):
            raise RuntimeError("the pointer is on another screen")
        px, py = pos[0].value, pos[1].value
    finally:
        x11.XCloseDisplay(dpy)
    paste_cursor(width, height, 3, pix, cw, ch, rgba, px, py)
    return width, height, 3, pix


def screenshot(args):
    if args.pointer == "osworld":
        return encode_png(*screenshot_osworld())
    if args.xwd:
        with open(args.xwd, "rb") as f:
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
                img = xwd_to_image(m)
    else:
        r = subprocess.run(["xwd", "-root", "-silent"], capture_output=True, timeout=30,
                           stdin=subprocess.DEVNULL)
        if r.returncode != 0:
            raise RuntimeError("xwd failed: %s" % r.stderr.decode("utf-8", "replace").strip())
        img = xwd_to_image(r.stdout)
    if args.pointer == "legato":
        pos = pointer_position()
        if pos is not None:
            draw_pointer(*img, pos[0], pos[1])
    return encode_png(*img)


# ---- X helpers ------------------------------------------------------------------------------

def run_quiet(argv, timeout=10):
    """Runs argv and returns its stdout, or None if it could not run or failed."""
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                           stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout if r.returncode == 0 else None


def list_windows():
    """Returns the window manager's client list as dicts (wmctrl -lGpx)."""
    out = run_quiet(["wmctrl", "-lGpx"])
    wins = []
    for line in (out or "").splitlines():
        parts = line.split(None, 9)
        if len(parts) < 9:
            continue
        wid, _desk, pid, x, y, w, h, wmclass, _host = parts[:9]
        wins.append({"id": int(wid, 16), "pid": pid, "x": int(x), "y": int(y), "w": int(w),
                     "h": int(h), "class": wmclass, "title": parts[9] if len(parts) > 9 else ""})
    return wins


def active_window():
    out = run_quiet(["xdotool", "getactivewindow"])
    try:
        return int(out.strip()) if out else None
    except ValueError:
        return None


def screen_size():
    out = run_quiet(["xdotool", "getdisplaygeometry"])
    if not out:
        raise RuntimeError("cannot read the display size (is DISPLAY set and xdotool installed?)")
    w, h = out.split()
    return int(w), int(h)


def accessibility_tree():
    for prefix, uri in NS.items():
        ET.register_namespace(prefix, uri)
    st, cp = "{%s}" % NS["st"], "{%s}" % NS["cp"]
    root = ET.Element("desktop-frame", {"name": "main"})
    active = active_window()
    apps = {}
    for win in list_windows():
        app_name = win["class"].split(".")[0] or "unknown"
        app = apps.get(app_name)
        if app is None:
            app = apps[app_name] = ET.SubElement(root, "application", {"name": app_name})
        is_active = "true" if win["id"] == active else "false"
        ET.SubElement(app, "frame", {
            "name": win["title"],
            st + "active": is_active,
            st + "focused": is_active,
            st + "showing": "true",
            st + "visible": "true",
            cp + "screencoord": "(%d, %d)" % (win["x"], win["y"]),
            cp + "size": "(%d, %d)" % (win["w"], win["h"]),
        })
    # Declare every OSWorld namespace on the root even when unused, as OSWorld's tree does.
    xml = ET.tostring(root, encoding="unicode")
    decls = "".join(' xmlns:%s="%s"' % (p, u) for p, u in NS.items() if ' xmlns:%s="' % p not in xml)
    return xml.replace("<desktop-frame", "<desktop-frame" + decls, 1)


def wmctrl_window_action(action, name, strict, by_class):
    flags = "-" + ("x" if by_class else "") + ("F" if strict else "") + action
    try:
        subprocess.run(["wmctrl", flags, name], stdin=subprocess.DEVNULL,
                       capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        pass  # like OSWorld's server, a failed wmctrl is not reported


# ---- request parsing ----------------------------------------------------------------------

def normalize_command(data):
    shell = data.get("shell", False)
    command = data.get("command", "" if shell else [])
    if isinstance(command, str) and not shell:
        command = shlex.split(command)
    if isinstance(command, list):
        command = [os.path.expanduser(a) if isinstance(a, str) and a.startswith("~/") else a
                   for a in command]
    return command, shell


def expand_path(p):
    return os.path.expandvars(os.path.expanduser(p))


class MultipartReader:
    """Streams the parts of a multipart/form-data body of known length."""

    def __init__(self, rfile, length, boundary):
        self.rfile = rfile
        self.left = length
        self.buf = bytearray()
        self.delim = b"--" + boundary

    def _fill(self):
        if self.left <= 0:
            return False
        data = self.rfile.read(min(CHUNK, self.left))
        if not data:
            self.left = 0
            return False
        self.left -= len(data)
        self.buf += data
        return True

    def _read_until(self, marker, sink, limit=None):
        """Passes the bytes before marker to sink and consumes marker; False at EOF."""
        seen = 0
        while True:
            i = self.buf.find(marker)
            if i >= 0:
                sink(bytes(self.buf[:i]))
                del self.buf[:i + len(marker)]
                return True
            keep = len(marker) - 1
            if len(self.buf) > keep:
                n = len(self.buf) - keep
                seen += n
                if limit is not None and seen > limit:
                    raise BadRequest("multipart part headers too long")
                sink(bytes(self.buf[:n]))
                del self.buf[:n]
            if not self._fill():
                return False

    def _take(self, n):
        while len(self.buf) < n:
            if not self._fill():
                break
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    def drain(self):
        """Reads what is left of the body, so the connection can serve the next request."""
        while self.left > 0:
            data = self.rfile.read(min(CHUNK, self.left))
            if not data:
                break
            self.left -= len(data)

    def parts(self, open_file):
        """Yields (name, filename, value) per part; a file part's data goes to open_file()'s
        writable object, which is yielded as value; other parts yield their bytes."""
        if not self._read_until(self.delim, lambda b: None):
            raise BadRequest("multipart body has no boundary")
        while True:
            tail = self._take(2)
            if tail == b"--":
                return
            if tail != b"\r\n":
                raise BadRequest("malformed multipart body")
            head = bytearray()
            if not self._read_until(b"\r\n\r\n", head.extend, limit=16384):
                raise BadRequest("truncated multipart part headers")
            name, filename = None, None
            for line in head.decode("utf-8", "replace").split("\r\n"):
                key, _, value = line.partition(":")
                if key.strip().lower() != "content-disposition":
                    continue
                for item in value.split(";")[1:]:
                    k, _, v = item.strip().partition("=")
                    v = v.strip().strip('"')
                    if k == "name":
                        name = v
                    elif k == "filename":
                        filename = v
            if filename is not None:
                target = open_file()
                ok = self._read_until(b"\r\n" + self.delim, target.write)
                yield name, filename, target
            else:
                value = bytearray()
                ok = self._read_until(b"\r\n" + self.delim, value.extend)
                yield name, None, bytes(value)
            if not ok:
                raise BadRequest("truncated multipart body")


# ---- the handler ----------------------------------------------------------------------------

class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "legato-guest/0"
    state = None  # set in main

    def log_message(self, fmt, *args):
        if self.state.args.verbose:
            sys.stderr.write("guest: %s\n" % (fmt % args))

    # -- responses
    def send(self, code, body, ctype="application/json"):
        if isinstance(body, str):
            body, ctype = body.encode("utf-8"), "text/html; charset=utf-8"
        elif not isinstance(body, (bytes, bytearray)):
            body = json.dumps(body).encode("utf-8")
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def send_path(self, path, ctype="application/octet-stream", attachment=True):
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            self.send_response(200)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(size))
            if attachment:
                self.send_header("Content-Disposition",
                                 "attachment; filename=%s" % json.dumps(os.path.basename(path)))
            self.end_headers()
            shutil.copyfileobj(f, self.wfile, CHUNK)

    # -- request bodies
    def body(self):
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n > 0 else b""

    def json_body(self):
        raw = self.body()
        try:
            data = json.loads(raw or b"{}")
        except ValueError as e:
            raise BadRequest("request body is not JSON: %s" % e)
        if not isinstance(data, dict):
            raise BadRequest("request body must be a JSON object")
        return data

    def form(self, upload_dir=None):
        """Returns the form fields; with upload_dir, file parts are stored there and
        returned as temporary file paths."""
        ctype = self.headers.get("Content-Type", "")
        length = int(self.headers.get("Content-Length") or 0)
        if ctype.startswith("multipart/form-data"):
            boundary = None
            for item in ctype.split(";")[1:]:
                k, _, v = item.strip().partition("=")
                if k == "boundary":
                    boundary = v.strip('"').encode("latin-1")
            if not boundary:
                raise BadRequest("multipart/form-data without a boundary")
            reader = MultipartReader(self.rfile, length, boundary)
            fields, files = {}, {}
            temps = []

            def open_temp():
                f = tempfile.NamedTemporaryFile(dir=upload_dir or None, prefix=".upload-",
                                                delete=False)
                temps.append(f)
                return f

            try:
                for name, filename, value in reader.parts(open_temp):
                    if filename is None:
                        fields[name] = value.decode("utf-8", "replace")
                    else:
                        value.close()
                        files[name] = value.name
            except BaseException:
                for f in temps:
                    f.close()
                    try:
                        os.unlink(f.name)
                    except OSError:
                        pass
                raise
            finally:
                reader.drain()
            return fields, files
        raw = self.rfile.read(length) if length > 0 else b""
        parsed = urllib.parse.parse_qs(raw.decode("utf-8", "replace"), keep_blank_values=True)
        return {k: v[0] for k, v in parsed.items()}, {}

    # -- dispatch
    def do_GET(self):
        self.dispatch({
            "/screenshot": self.h_screenshot,
            "/accessibility": self.h_accessibility,
            "/terminal": self.h_terminal,
            "/platform": lambda: self.send(200, "Linux"),
            "/cursor_position": self.h_cursor_position,
        })

    def do_POST(self):
        self.dispatch({
            "/execute": self.h_execute,
            "/setup/execute": self.h_execute,
            "/execute_with_verification": self.h_execute_verify,
            "/setup/execute_with_verification": self.h_execute_verify,
            "/setup/launch": self.h_launch,
            "/setup/open_file": self.h_open_file,
            "/setup/upload": self.h_upload,
            "/setup/activate_window": self.h_activate_window,
            "/setup/close_window": self.h_close_window,
            "/setup/change_wallpaper": self.h_change_wallpaper,
            "/file": self.h_file,
            "/screen_size": self.h_screen_size,
            "/wallpaper": self.h_wallpaper,
            "/desktop_path": self.h_desktop_path,
            "/list_directory": self.h_list_directory,
            "/window_size": self.h_window_size,
        })

    def dispatch(self, routes):
        self.state.reap()
        path = urllib.parse.urlsplit(self.path).path
        handler = routes.get(path)
        if handler is None:
            self.close_connection = True  # the body, if any, is left unread
            known = path in ("/screenshot", "/accessibility", "/terminal", "/platform",
                             "/cursor_position") or path.startswith("/setup/") or path in (
                "/execute", "/execute_with_verification", "/file", "/screen_size",
                "/wallpaper", "/desktop_path", "/list_directory", "/window_size")
            return self.send(405 if known else 404,
                             {"error": "%s %s is not served here" % (self.command, path)})
        try:
            handler()
        except BadRequest as e:
            self.close_connection = True
            self.send(400, {"status": "error", "message": str(e)})
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception as e:  # noqa: BLE001 - every failure becomes a 500 with its reason
            self.close_connection = True
            self.send(500, {"status": "error", "message": "%s: %s" % (type(e).__name__, e)})

    # -- endpoints
    def h_screenshot(self):
        self.send(200, screenshot(self.state.args), "image/png")

    def h_execute(self):
        command, shell = normalize_command(self.json_body())
        try:
            r = subprocess.run(command, shell=shell, capture_output=True, text=True,
                               timeout=EXECUTE_TIMEOUT, stdin=subprocess.DEVNULL)
        except Exception as e:  # noqa: BLE001 - OSWorld reports any failure this way
            return self.send(500, {"status": "error", "message": str(e)})
        self.send(200, {"status": "success", "output": r.stdout, "error": r.stderr,
                        "returncode": r.returncode})

    def h_execute_verify(self):
        data = self.json_body()
        command, shell = normalize_command(data)
        verification = data.get("verification") or {}
        max_wait = float(data.get("max_wait_time", 10))
        interval = float(data.get("check_interval", 1))
        try:
            r = subprocess.run(command, shell=shell, capture_output=True, text=True,
                               timeout=EXECUTE_TIMEOUT, stdin=subprocess.DEVNULL)
        except Exception as e:  # noqa: BLE001
            return self.send(500, {"status": "error", "message": str(e)})
        result = {"output": r.stdout, "error": r.stderr, "returncode": r.returncode}
        if not verification:
            return self.send(200, dict(result, status="success"))
        start = time.time()
        while time.time() - start < max_wait:
            ok = True
            if "window_exists" in verification:
                want = str(verification["window_exists"]).lower()
                if not any(want in w["title"].lower() for w in list_windows()):
                    ok = False
            if ok and "command_success" in verification:
                try:
                    v = subprocess.run(verification["command_success"], shell=True,
                                       capture_output=True, timeout=5, stdin=subprocess.DEVNULL)
                    ok = v.returncode == 0
                except (OSError, subprocess.TimeoutExpired):
                    ok = False
            if ok:
                return self.send(200, dict(result, status="success", verification="passed",
                                           wait_time=time.time() - start))
            time.sleep(interval)
        self.send(500, dict(result, status="verification_failed", verification="failed",
                            wait_time=max_wait))

    def h_launch(self):
        command, shell = normalize_command(self.json_body())
        try:
            proc = subprocess.Popen(command, shell=shell, stdin=subprocess.DEVNULL,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                    start_new_session=True)
        except Exception as e:  # noqa: BLE001
            return self.send(500, {"status": "error", "message": str(e)})
        self.state.track(proc)
        shown = command if shell or isinstance(command, str) else " ".join(command)
        self.send(200, "%s launched successfully" % shown)

    def h_open_file(self):
        data = self.json_body()
        path = data.get("path")
        if not path:
            return self.send(400, "Path not supplied!")
        try:
            timeout = float(data.get("timeout_seconds", OPEN_FILE_TIMEOUT))
        except (TypeError, ValueError):
            return self.send(400, "Invalid timeout_seconds: %r" % data.get("timeout_seconds"))
        full = expand_path(path)
        is_file = os.path.exists(full)
        if not is_file and not shutil.which(path):
            return self.send(404, "Application/file not found: %s" % path)
        if is_file:
            argv = shlex.split(self.state.args.opener) + [full]
            base = os.path.basename(full)
            candidates = [data.get("window_name")] if data.get("window_name") else [
                base, os.path.splitext(base)[0]]
        else:
            argv = [path]
            candidates = [data.get("window_name") or path]
        candidates = [c for c in candidates if c]
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL, start_new_session=True)
        except Exception as e:  # noqa: BLE001
            return self.send(500, "Failed to open %s. Error: %s" % (path, e))
        self.state.track(proc)
        deadline = time.time() + timeout
        while True:
            for win in list_windows():
                if any(c in win["title"] for c in candidates):
                    run_quiet(["wmctrl", "-i", "-a", "0x%08x" % win["id"]])
                    return self.send(200, "File opened and window activated successfully")
            if time.time() >= deadline:
                return self.send(500, "Failed to find window for %s within %g seconds."
                                 % (candidates, timeout))
            time.sleep(0.25)

    def h_upload(self):
        fields, files = self.form(upload_dir=self.state.args.upload_tmp)
        tmp = files.get("file_data")
        path = fields.get("file_path")
        if not tmp or not path:
            if tmp:
                os.unlink(tmp)
            return self.send(400, {"error": "file_path and file_data are required"})
        target = expand_path(path)
        try:
            if os.path.dirname(target):
                os.makedirs(os.path.dirname(target), exist_ok=True)
            shutil.move(tmp, target)
            os.chmod(target, 0o644)
        except Exception as e:  # noqa: BLE001
            if os.path.exists(tmp):
                os.unlink(tmp)
            return self.send(500, {"error": "Failed to upload file: %s" % e})
        self.send(200, "File Uploaded: %d bytes" % os.path.getsize(target))

    def h_activate_window(self):
        data = self.json_body()
        name = data.get("window_name")
        if not name:
            return self.send(400, "window_name required")
        wmctrl_window_action("a", name, bool(data.get("strict")), bool(data.get("by_class")))
        self.send(200, "Window activated successfully")

    def h_close_window(self):
        data = self.json_body()
        if "window_name" not in data:
            return self.send(400, "window_name required")
        wmctrl_window_action("c", data["window_name"], bool(data.get("strict")),
                             bool(data.get("by_class")))
        self.send(200, "Window closed successfully.")

    def h_change_wallpaper(self):
        path = self.json_body().get("path")
        if not path:
            return self.send(400, "Path not supplied!")
        full = expand_path(path)
        if not os.path.exists(full):
            return self.send(404, "File not found: %s" % full)
        if shutil.which("gsettings"):
            subprocess.run(["gsettings", "set", "org.gnome.desktop.background", "picture-uri",
                            "file://" + full], capture_output=True, stdin=subprocess.DEVNULL)
        self.state.wallpaper = full
        self.send(200, "Wallpaper changed successfully")

    def h_file(self):
        fields, _ = self.form()
        if "file_path" not in fields:
            return self.send(400, {"error": "file_path is required"})
        path = expand_path(fields["file_path"])
        if not os.path.isfile(path):
            return self.send(404, {"error": "File not found"})
        self.send_path(path)

    def h_accessibility(self):
        self.send(200, {"AT": accessibility_tree()})

    def h_terminal(self):
        self.send(200, {"output": None, "status": "success"})

    def h_screen_size(self):
        self.body()
        w, h = screen_size()
        self.send(200, {"width": w, "height": h})

    def h_cursor_position(self):
        pos = pointer_position()
        if pos is None:
            raise RuntimeError("cannot read the pointer position")
        self.send(200, list(pos))

    def h_wallpaper(self):
        self.body()
        path = self.state.wallpaper
        if not path or not os.path.isfile(path):
            return self.send(404, "Wallpaper file not found")
        self.send_path(path, "image/png", attachment=False)

    def h_desktop_path(self):
        self.body()
        path = os.path.join(os.path.expanduser("~"), "Desktop")
        if not os.path.isdir(path):
            return self.send(404, {"error": "Unsupported operating system or desktop path not found"})
        self.send(200, {"desktop_path": path})

    def h_list_directory(self):
        data = self.json_body()
        if "path" not in data:
            return self.send(400, {"error": "Missing 'path' parameter"})
        start = data["path"]
        if not os.path.isdir(start):
            return self.send(400, {"error": "The provided path is not a directory"})

        def tree(d):
            node = {"type": "directory", "name": os.path.basename(d), "children": []}
            try:
                for entry in os.listdir(d):
                    full = os.path.join(d, entry)
                    if os.path.isdir(full):
                        node["children"].append(tree(full))
                    else:
                        node["children"].append({"type": "file", "name": entry})
            except OSError as e:
                return {"error": str(e)}
            return node

        self.send(200, {"directory_tree": tree(start)})

    def h_window_size(self):
        fields, _ = self.form()
        name = fields.get("app_class_name")
        if not name:
            return self.send(400, {"error": "app_class_name is required"})
        for win in list_windows():
            if name.lower() in [c.lower() for c in win["class"].split(".")]:
                return self.send(200, {"width": win["w"], "height": win["h"]})
        self.send(404, {"error": "no window of class %s" % name})


def main():
    # No abbreviated flags: the executor reads this command line (guestpy/shot.py) and knows
    # the flags only as they are spelled here.
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    ap.add_argument("--host", default="127.0.0.1",
                    help="address to bind (0.0.0.0 inside a VM reached only through a forward)")
    ap.add_argument("--port", type=int, default=5000, help="port; 0 picks a free one")
    ap.add_argument("--xwd", default=os.environ.get("LEGATO_GUEST_XWD", ""),
                    help="Xvfb -fbdir screen file to read screenshots from (else runs xwd)")
    ap.add_argument("--opener", default="xdg-open", help="command that opens a file")
    ap.add_argument("--upload-tmp", default="", help="directory for uploads in flight")
    ap.add_argument("--pointer", choices=POINTER_STYLES, default="legato",
                    help="how /screenshot draws the pointer (see the top of this file)")
    ap.add_argument("--no-pointer", dest="pointer", action="store_const", const="none",
                    help="--pointer none")
    ap.add_argument("--verbose", action="store_true", help="log every request on stderr")
    args = ap.parse_args()

    state = State(args)
    Handler.state = state

    def stop(signum, frame):
        state.kill_launched()
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)

    srv = ThreadingHTTPServer((args.host, args.port), Handler)
    srv.daemon_threads = True
    host, port = srv.server_address[:2]
    print("listening on %s:%d" % (host, port), flush=True)
    srv.serve_forever(poll_interval=0.2)


if __name__ == "__main__":
    main()
