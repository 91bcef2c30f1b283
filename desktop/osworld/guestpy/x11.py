"""Enough of the X11 protocol for legato's in-guest tools, spoken over the display's local
socket with the Python standard library alone: a guest needs no xdotool, wmctrl or xprop, and
a tool does in one connection what would otherwise take a program start per question (a tenth
of a second each under software emulation). The desktop sends this text ahead of each tool.
"""
import os
import socket
import struct


class XError(OSError):
    """The X server refused a request, or cannot be reached."""


def xpad(n):
    return (4 - n % 4) % 4


def display_number(display):
    host, _, rest = display.rpartition(":")
    if host not in ("", "unix") or not rest:
        raise XError("DISPLAY %r is not a local display" % display)
    return rest.split(".")[0]


def xauth_cookie(number):
    """The MIT-MAGIC-COOKIE-1 for display number in the user's Xauthority file, if any."""
    path = os.environ.get("XAUTHORITY") or os.path.expanduser("~/.Xauthority")
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return b"", b""
    i, found = 0, (b"", b"")

    def field():
        nonlocal i
        n = struct.unpack(">H", data[i:i + 2])[0]
        v = data[i + 2:i + 2 + n]
        i += 2 + n
        return v

    while i + 2 <= len(data):
        family = struct.unpack(">H", data[i:i + 2])[0]
        i += 2
        _, num, name, value = field(), field(), field(), field()
        # FamilyLocal (256) or FamilyWild (65535): the entries for local sockets.
        if name == b"MIT-MAGIC-COOKIE-1" and family in (256, 65535) and num in (b"", number.encode()):
            found = (name, value)
            if num:
                break
    return found


class X:
    """One connection to the X server of display (default: $DISPLAY). Requests run one at a
    time; events that arrive meanwhile go to on_event."""

    def __init__(self, display=None, timeout=5):
        display = display or os.environ.get("DISPLAY", "")
        number = display_number(display)
        self.on_event = None
        self.atoms = {}
        self.xfixes = None  # XFIXES's major opcode once its version was asked
        self.next_id = 1
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(timeout)
        try:
            s.connect("\0/tmp/.X11-unix/X" + number)  # the abstract socket; Xorg listens there
        except OSError:
            s.close()
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(timeout)
            try:
                s.connect("/tmp/.X11-unix/X" + number)
            except OSError as e:
                s.close()
                raise XError("connect to display %s: %s" % (display, e))
        self.sock = s
        name, value = xauth_cookie(number)
        s.sendall(struct.pack("<BxHHHHxx", 0x6C, 11, 0, len(name), len(value))
                  + name + b"\0" * xpad(len(name)) + value + b"\0" * xpad(len(value)))
        head = self.recv(8)
        data = self.recv(struct.unpack("<H", head[6:8])[0] * 4)
        if head[0] != 1:
            s.close()
            raise XError("display %s refused the connection: %s" % (display, data[:head[1]].decode("latin-1")))
        self.base = struct.unpack("<I", data[4:8])[0]
        vendor = struct.unpack("<H", data[16:18])[0]
        off = 32 + vendor + xpad(vendor) + 8 * data[21]
        self.root = struct.unpack("<I", data[off:off + 4])[0]
        self.width, self.height = struct.unpack("<HH", data[off + 20:off + 24])
        self.root_depth = data[off + 38]
        self.image_byte_order = data[22]  # 0: LSB first

    def close(self):
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def recv(self, n):
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise XError("the X server closed the connection")
            buf += chunk
        return buf

    def packet(self):
        """The next error, reply or event."""
        b = self.recv(32)
        if b[0] == 1:
            b += self.recv(struct.unpack("<I", b[4:8])[0] * 4)
        return b

    def image(self, x, y, w, h):
        """The pixels of an area of the root window (GetImage, ZPixmap), read into one buffer:
        megabytes, which recv() would copy again and again."""
        self.sock.sendall(struct.pack("<BBHIhhHHI", 73, 2, 5, self.root, x, y, w, h, 0xFFFFFFFF))
        while True:
            b = self.recv(32)
            if b[0] == 0:
                raise XError("X error %d (request %d)" % (b[1], b[10]))
            if b[0] == 1:
                break
            if self.on_event:
                self.on_event(b)
        buf = bytearray(struct.unpack("<I", b[4:8])[0] * 4)
        view, got = memoryview(buf), 0
        while got < len(buf):
            n = self.sock.recv_into(view[got:])
            if not n:
                raise XError("the X server closed the connection")
            got += n
        return buf

    def request(self, data):
        """Sends a request and returns its reply."""
        self.sock.sendall(data)
        return self.reply()

    def reply(self):
        while True:
            b = self.packet()
            if b[0] == 0:
                raise XError("X error %d (request %d)" % (b[1], b[10]))
            if b[0] == 1:
                return b
            if self.on_event:
                self.on_event(b)

    def send(self, data):
        """Sends a request that has no reply, and waits until the server handled it."""
        self.sock.sendall(data)
        self.sync()

    def sync(self):
        self.request(struct.pack("<BxH", 43, 1))  # GetInputFocus

    def new_id(self):
        i = self.base | self.next_id
        self.next_id += 1
        return i

    def atom(self, name):
        if name not in self.atoms:
            n = name.encode()
            r = self.request(struct.pack("<BBHH2x", 16, 0, 2 + (len(n) + xpad(len(n))) // 4, len(n))
                             + n + b"\0" * xpad(len(n)))
            self.atoms[name] = struct.unpack("<I", r[8:12])[0]
        return self.atoms[name]

    def prop(self, win, name, words=1 << 16):
        """(type, format, value bytes) of a window property; format 0 when it is unset."""
        r = self.request(struct.pack("<BBHIIIII", 20, 0, 6, win, self.atom(name), 0, 0, words))
        fmt, n = r[1], struct.unpack("<I", r[16:20])[0]
        return struct.unpack("<I", r[8:12])[0], fmt, r[32:32 + n * fmt // 8]

    def cards(self, win, name):
        _, fmt, v = self.prop(win, name)
        return list(struct.unpack("<%dI" % (len(v) // 4), v)) if fmt == 32 else []

    def text(self, win, *names):
        for name in names:
            _, fmt, v = self.prop(win, name)
            if fmt == 8:
                return v.decode("utf-8", "replace")
        return ""

    def extension(self, name):
        """(major opcode, first event) of an extension, or None."""
        n = name.encode()
        r = self.request(struct.pack("<BxHHxx", 98, 2 + (len(n) + xpad(len(n))) // 4, len(n)) + n + b"\0" * xpad(len(n)))
        return (r[9], r[10]) if r[8] else None

    # ---- what the tools ask -------------------------------------------------------------

    def windows(self):
        """The window manager's windows: {"0x%08x": {desktop, pid, geometry, class, title}}.
        Without a window manager (no _NET_CLIENT_LIST) this raises XError."""
        _, fmt, _ = self.prop(self.root, "_NET_SUPPORTING_WM_CHECK", 1)
        if fmt != 32:
            raise XError("no window manager runs (no _NET_SUPPORTING_WM_CHECK on the root window)")
        out = {}
        for w in self.cards(self.root, "_NET_CLIENT_LIST"):
            try:
                g = self.request(struct.pack("<BxHI", 14, 2, w))  # GetGeometry
                t = self.request(struct.pack("<BxHIIhh", 40, 4, w, self.root, 0, 0))  # TranslateCoordinates
                x, y = struct.unpack("<hh", t[12:16])
                width, height = struct.unpack("<HH", g[16:20])
                pid = self.cards(w, "_NET_WM_PID")
                desk = self.cards(w, "_NET_WM_DESKTOP")
                cls = self.text(w, "WM_CLASS").rstrip("\0").replace("\0", ".")
                title = self.text(w, "_NET_WM_NAME", "WM_NAME")
            except XError:
                continue  # it went away meanwhile
            out["0x%08x" % w] = {"desktop": desk[0] if desk else None, "pid": pid[0] if pid else 0,
                                 "geometry": "%d %d %d %d" % (x, y, width, height), "class": cls, "title": title}
        return out

    def active_window(self):
        a = self.cards(self.root, "_NET_ACTIVE_WINDOW")
        return "0x%08x" % a[0] if a and a[0] else None

    def pointer(self):
        """(x, y, buttons held: a list of button numbers)."""
        r = self.request(struct.pack("<BxHI", 38, 2, self.root))  # QueryPointer
        x, y = struct.unpack("<hh", r[16:20])
        mask = struct.unpack("<H", r[24:26])[0]
        return x, y, [b for b in range(1, 6) if mask & (1 << (7 + b))]

    def cursor_image(self):
        """The pointer's cursor as the X server shows it (XFIXES GetCursorImage): (width,
        height, pixels). The pixels are ARGB with the colour premultiplied by alpha, one 32-bit
        word each, row by row, least significant byte first as this client speaks: the bytes
        of a pixel are B, G, R, A. XError when the server has no XFIXES (of version 1 or
        later: GetCursorImage is version 1's)."""
        if self.xfixes is None:
            ext = self.extension("XFIXES")
            if not ext:
                raise XError("the X server has no XFIXES extension")
            # QueryVersion comes first: XFIXES answers nothing else before it.
            r = self.request(struct.pack("<BBHII", ext[0], 0, 3, 5, 0))
            if struct.unpack("<I", r[8:12])[0] < 1:
                raise XError("the X server's XFIXES is version %d, without GetCursorImage"
                             % struct.unpack("<I", r[8:12])[0])
            self.xfixes = ext[0]
        r = self.request(struct.pack("<BBH", self.xfixes, 4, 1))  # GetCursorImage
        w, h = struct.unpack("<HH", r[12:16])
        pixels = r[32:32 + w * h * 4]
        if len(pixels) < w * h * 4:
            raise XError("short cursor image: %d bytes for %dx%d" % (len(pixels), w, h))
        return w, h, pixels

    def warp(self, x, y):
        self.send(struct.pack("<BxHIIhhHHhh", 41, 6, 0, self.root, 0, 0, 0, 0, x, y))

    def keys_held(self):
        r = self.request(struct.pack("<BxH", 44, 1))  # QueryKeymap
        return [i * 8 + b for i, byte in enumerate(r[8:40]) for b in range(8) if byte & (1 << b)]

    def release(self, keys, buttons):
        """Releases keys (keycodes) and buttons with the XTEST extension, as a real keyboard
        and mouse would; returns False when the server has no XTEST."""
        ext = self.extension("XTEST")
        if not ext:
            return False
        for kind, codes in ((3, keys), (5, buttons)):  # KeyRelease, ButtonRelease
            for c in codes:
                self.sock.sendall(struct.pack("<BBHBBHIIIIhhIHBB", ext[0], 2, 9, kind, c, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0))
        self.sync()
        return True

    def client_message(self, win, name, data):
        """Sends an EWMH request about win to the window manager (as wmctrl does)."""
        data = (list(data) + [0] * 5)[:5]
        event = struct.pack("<BBHII5I", 33, 32, 0, win, self.atom(name), *data)
        # SubstructureRedirect | SubstructureNotify on the root: what window managers listen to.
        self.send(struct.pack("<BBHII", 25, 0, 11, self.root, (1 << 20) | (1 << 19)) + event)

    def close_window(self, wid):
        self.client_message(int(wid, 16), "_NET_CLOSE_WINDOW", [0, 2])

    def activate(self, wid):
        self.client_message(int(wid, 16), "_NET_ACTIVE_WINDOW", [2, 0, 0])
