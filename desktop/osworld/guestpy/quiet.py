"""legato's in-guest quiet probe (Python 3 standard library only).

  python3 -c TEXT SECONDS

Watches the guest for SECONDS and prints one JSON object: "load", the busy share of its CPUs
(from /proc/stat), and "damage", the screen area in pixels that X reported as redrawn in that
time (the X DAMAGE extension on the root window, spoken directly over the X socket), or null
with "why" when it cannot watch the screen. A quiet guest with no damage has a settled screen:
one screenshot then shows it.
"""
import json
import os
import socket
import struct
import sys
import time


def cpu():
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]
    idle = v[3] + v[4]
    return sum(v) - idle, sum(v)


def pad(n):
    return (4 - n % 4) % 4


def display_number():
    d = os.environ.get("DISPLAY", "")
    host, _, rest = d.rpartition(":")
    if host not in ("", "unix") or not rest:
        raise OSError("DISPLAY %r is not a local display" % d)
    return rest.split(".")[0]


def cookie(number):
    """The MIT-MAGIC-COOKIE-1 of the display in the user's Xauthority file, if any."""
    path = os.environ.get("XAUTHORITY") or os.path.expanduser("~/.Xauthority")
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return b"", b""
    i = 0

    def field():
        nonlocal i
        n = struct.unpack(">H", data[i:i + 2])[0]
        v = data[i + 2:i + 2 + n]
        i += 2 + n
        return v

    found = (b"", b"")
    while i + 2 <= len(data):
        family = struct.unpack(">H", data[i:i + 2])[0]
        i += 2
        _, num, name, value = field(), field(), field(), field()
        if name == b"MIT-MAGIC-COOKIE-1" and family in (256, 65535) and num in (b"", number.encode()):
            found = (name, value)
            if num:
                break
    return found


def recv_exact(s, n):
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise OSError("the X server closed the connection")
        buf += chunk
    return buf


def connect():
    number = display_number()
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(5)
    try:
        s.connect("\0/tmp/.X11-unix/X" + number)  # the abstract socket, where Xorg listens too
    except OSError:
        s.close()
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(5)
        s.connect("/tmp/.X11-unix/X" + number)
    name, value = cookie(number)
    s.sendall(struct.pack("<BxHHHHxx", 0x6C, 11, 0, len(name), len(value))
              + name + b"\0" * pad(len(name)) + value + b"\0" * pad(len(value)))
    head = recv_exact(s, 8)
    data = recv_exact(s, struct.unpack("<H", head[6:8])[0] * 4)
    if head[0] != 1:
        raise OSError("the X server refused the connection: %s" % data[:head[1]].decode("latin-1"))
    base = struct.unpack("<I", data[4:8])[0]
    vendor = struct.unpack("<H", data[16:18])[0]
    formats = data[21]
    off = 32 + vendor + pad(vendor) + 8 * formats
    root = struct.unpack("<I", data[off:off + 4])[0]
    return s, base, root


def reply(s):
    """Reads until the reply to the last request, dropping events; an X error raises."""
    while True:
        b = recv_exact(s, 32)
        if b[0] == 0:
            raise OSError("X error %d on request %d" % (b[1], b[10]))
        if b[0] == 1:
            extra = struct.unpack("<I", b[4:8])[0]
            return b + recv_exact(s, extra * 4)


def watch_damage(seconds):
    """Returns the damaged area of the screen over the next seconds."""
    s, base, root = connect()
    try:
        name = b"DAMAGE"
        s.sendall(struct.pack("<BxHHxx", 98, 2 + (len(name) + pad(len(name))) // 4, len(name))
                  + name + b"\0" * pad(len(name)))
        r = reply(s)
        if not r[8]:
            raise OSError("the X server has no DAMAGE extension")
        major, first_event = r[9], r[10]
        s.sendall(struct.pack("<BBHII", major, 0, 3, 1, 1))  # QueryVersion comes first
        reply(s)
        # RawRectangles: an event per drawn rectangle, none to acknowledge. A new damage
        # object starts with the whole window damaged: a round trip (GetInputFocus) after it
        # brings that event in first, to be dropped.
        s.sendall(struct.pack("<BBHIIBxxx", major, 1, 4, base | 1, root, 0) + struct.pack("<BxH", 43, 1))
        reply(s)
        area = 0
        end = time.monotonic() + seconds
        while True:
            left = end - time.monotonic()
            if left <= 0:
                break
            s.settimeout(left)
            try:
                b = recv_exact(s, 32)
            except socket.timeout:
                break
            if b[0] == 0:
                raise OSError("X error %d on request %d" % (b[1], b[10]))
            if b[0] == 1:
                recv_exact(s, struct.unpack("<I", b[4:8])[0] * 4)
            elif b[0] & 0x7F == first_event:
                w, h = struct.unpack("<HH", b[20:24])
                area += w * h
        return area
    finally:
        s.close()


def main():
    seconds = float(sys.argv[1])
    out = {"damage": None}
    busy0, total0 = cpu()
    start = time.monotonic()
    try:
        out["damage"] = watch_damage(seconds)
    except (OSError, ValueError, struct.error, IndexError) as e:
        out["why"] = str(e)
    left = seconds - (time.monotonic() - start)
    if left > 0:
        time.sleep(left)
    busy1, total1 = cpu()
    out["load"] = (busy1 - busy0) / (total1 - total0) if total1 > total0 else 0.0
    sys.stdout.write(json.dumps(out))


if __name__ == "__main__":
    main()
