"""legato's in-guest wait for a launched program's window (part of the guest tool; x11.py
comes first).

  windowmark -      just before a setup step starts a program: the top-level windows shown
                    and the time, in clock ticks since boot, that the step's processes count from
  windowwait JSON   {"mark", "seconds", "any", "title"}: waits at most "seconds" until a top-level
                    window that the mark did not show has mapped, of a process started since
                    the mark (the program or anything it started), or of no known process (no
                    _NET_WM_PID); with "any", of any process (a file handed to a program that
                    already runs); with "title", also a shown window, new or not, whose title
                    contains it (a file opened in a tab of a window that was there). It answers
                    {"window": {...} | null, "others": [...], "seconds"}: the window found, and
                    the new windows it did not count.

A step that starts a program ends when the guest server has started it, long before its window
shows; the screen is quiet meanwhile, and a settle that ends then sees the desktop without it.
The wait listens to the root window's events (a frame or window that maps, the window
manager's client list changing) and looks again at each, so it costs nothing while it waits.
"""
import json
import os
import select
import struct
import time

# Window types that are not the program's own window: a splash shows while it starts (and
# updates, so a settle after it waits anyway), the rest come and go.
NOT_PROGRAM_WINDOWS = (
    "_NET_WM_WINDOW_TYPE_SPLASH", "_NET_WM_WINDOW_TYPE_NOTIFICATION", "_NET_WM_WINDOW_TYPE_TOOLTIP",
    "_NET_WM_WINDOW_TYPE_DND", "_NET_WM_WINDOW_TYPE_DOCK", "_NET_WM_WINDOW_TYPE_DESKTOP",
    "_NET_WM_WINDOW_TYPE_MENU", "_NET_WM_WINDOW_TYPE_DROPDOWN_MENU", "_NET_WM_WINDOW_TYPE_POPUP_MENU",
    "_NET_WM_WINDOW_TYPE_COMBO",
)
VIEWABLE = 2  # GetWindowAttributes' map-state: mapped, and so are its ancestors
# ChangeWindowAttributes' event mask on the root: SubstructureNotify (a child maps) and
# PropertyChange (_NET_CLIENT_LIST).
ROOT_EVENTS = (1 << 19) | (1 << 22)


def boot_ticks():
    """Now, in the clock ticks since boot that /proc/PID/stat's start times count."""
    with open("/proc/uptime") as f:
        return int(float(f.read().split()[0]) * os.sysconf("SC_CLK_TCK"))


def start_ticks(pid):
    """A process's start time in clock ticks since boot, or None when it is gone."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            raw = f.read().decode("utf-8", "replace")
    except OSError:
        return None
    # comm may hold spaces and parentheses: it ends at the last ")"; field n is f[n-3].
    return int(raw[raw.rindex(")") + 2:].split()[19])


def top_level(x):
    """The top-level windows: the window manager's clients, or without one the root's
    children that are not override-redirect (menus, tooltips)."""
    _, fmt, _ = x.prop(x.root, "_NET_SUPPORTING_WM_CHECK", 1)
    if fmt == 32:
        return x.cards(x.root, "_NET_CLIENT_LIST"), False
    r = x.request(struct.pack("<BxHI", 15, 2, x.root))  # QueryTree
    n = struct.unpack("<H", r[16:18])[0]
    return list(struct.unpack("<%dI" % n, r[32:32 + 4 * n])), True


def shown(x):
    """{id: pid} of the top-level windows shown now that may be a program's own window; pid 0
    for a window without _NET_WM_PID."""
    skip = set(x.atom(name) for name in NOT_PROGRAM_WINDOWS)
    wins, bare = top_level(x)
    out = {}
    for w in wins:
        try:
            a = x.request(struct.pack("<BxHI", 3, 2, w))  # GetWindowAttributes
            if a[26] != VIEWABLE or (bare and a[27]):
                continue
            if skip.intersection(x.cards(w, "_NET_WM_WINDOW_TYPE")):
                continue
            pid = x.cards(w, "_NET_WM_PID")
        except XError:
            continue  # it went away meanwhile
        out["0x%08x" % w] = pid[0] if pid else 0
    return out


def window_mark():
    with X() as x:
        return {"ticks": boot_ticks(), "windows": sorted(shown(x))}


def describe(x, wid, pid):
    w = int(wid, 16)
    try:
        cls = x.text(w, "WM_CLASS").rstrip("\0").replace("\0", ".")
        title = x.text(w, "_NET_WM_NAME", "WM_NAME")
    except XError:
        cls, title = "", ""
    return {"id": wid, "pid": pid, "class": cls, "title": title}


def launched_window(x, mark, any_process, title, others):
    """The first window that counts (see the module's text), or None; the new ones that do
    not count go to others."""
    before = set(mark["windows"])
    for wid, pid in sorted(shown(x).items()):
        if title:
            w = describe(x, wid, pid)
            if title in w["title"]:
                return w
        if wid in before:
            continue
        started = start_ticks(pid) if pid else None
        # A tick of slack: /proc/uptime and the start times round differently.
        if any_process or not pid or (started is not None and started >= mark["ticks"] - 1):
            return describe(x, wid, pid)
        if wid not in others:
            others[wid] = describe(x, wid, pid)
    return None


def window_wait(arg):
    a = json.loads(arg)
    mark, seconds, any_process, title = a["mark"], float(a["seconds"]), bool(a.get("any")), a.get("title")
    start = time.monotonic()
    end = start + seconds
    others = {}
    with X() as x:
        x.send(struct.pack("<BxHIII", 2, 4, x.root, 0x800, ROOT_EVENTS))  # ChangeWindowAttributes
        while True:
            w = launched_window(x, mark, any_process, title, others)
            left = end - time.monotonic()
            if w or left <= 0:
                return {"window": w, "others": list(others.values()), "seconds": time.monotonic() - start}
            # Look again at the next event, or after half a second: an event read with a
            # reply above was dropped, and what it announced may have come after the look.
            ready, _, _ = select.select([x.sock], [], [], min(left, 0.5))
            while ready:
                x.packet()
                ready, _, _ = select.select([x.sock], [], [], 0)
