"""legato's in-guest quiet probe (part of the guest tool; x11.py comes first).

  quiet SECONDS

Watches the guest for SECONDS and returns: "load", the busy share of its CPUs
(from /proc/stat), and "damage", the screen area in pixels that X reported as redrawn in that
time (the X DAMAGE extension on the root window, spoken directly over the X socket), or null
with "why" when it cannot watch the screen. A quiet guest with no damage has a settled screen:
one screenshot then shows it.
"""
import json
import socket
import struct
import sys
import time


def cpu():
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]
    idle = v[3] + v[4]
    return sum(v) - idle, sum(v)


def watch_damage(seconds):
    """Returns the area of the screen redrawn over the next seconds."""
    with X() as x:
        ext = x.extension("DAMAGE")
        if not ext:
            raise XError("the X server has no DAMAGE extension")
        major, first_event = ext
        x.request(struct.pack("<BBHII", major, 0, 3, 1, 1))  # QueryVersion comes first
        # RawRectangles: an event per drawn rectangle, none to acknowledge. A new damage
        # object starts with the whole window damaged; the round trip in send() brings that
        # event in first, and it is dropped.
        x.send(struct.pack("<BBHIIBxxx", major, 1, 4, x.new_id(), x.root, 0))
        area = 0
        end = time.monotonic() + seconds
        while True:
            left = end - time.monotonic()
            if left <= 0:
                return area
            x.sock.settimeout(left)
            try:
                b = x.packet()
            except socket.timeout:
                return area
            if b[0] == 0:
                raise XError("X error %d (request %d)" % (b[1], b[10]))
            if b[0] & 0x7F == first_event:
                w, h = struct.unpack("<HH", b[20:24])
                area += w * h


def quiet(seconds):
    out = {"damage": None}
    busy0, total0 = cpu()
    start = time.monotonic()
    try:
        out["damage"] = watch_damage(seconds)
    except (OSError, ValueError, struct.error, IndexError) as e:  # XError is an OSError
        out["why"] = str(e)
    left = seconds - (time.monotonic() - start)
    if left > 0:
        time.sleep(left)
    busy1, total1 = cpu()
    out["load"] = (busy1 - busy0) / (total1 - total0) if total1 > total0 else 0.0
    return out
