"""legato's in-guest clean-state tool (Python 3 standard library only; x11.py comes first).

The desktop sends this file's text with every call (python3 -c TEXT CMD CONFIG), so a guest
needs nothing installed beyond python3. It prints one JSON object on stdout.

  record  CONFIG   remember the clean state: the processes that run, the desktop's session
                   (its display, and the guest server's, X server's and window manager's
                   sessions), the X windows, the pointer, a copy of each restored directory
                   with its listing, the entries the guest user could change outside them, and
                   a time stamp; then the home baseline (kept when there is one). Run at the
                   clean state, as root.
  reset   CONFIG   bring the guest back to the recorded state: end every process of the
                   desktop's session that is its user's (or that its user's started) and was not
                   there, leaving other users', the system's and other sessions' alone (see
                   fate), close the windows that were not there, restore the home and the
                   restored directories, then verify all of it and look for changes outside
                   what it restores. As root. "problems" lists what it could not undo; the
                   desktop then reverts the snapshot. Both refuse a guest given by URL whose
                   desktop user is root unless told, and one that is not known to be dedicated
                   to the desktop and looks shared with other work.

CONFIG is a JSON object; see the Go side (desktop/osworld/cleanstate.go) for its fields.
Processes are told apart by (pid, start time), never by name; the calling request's own
processes carry CONFIG's nonce in their arguments and are left alone.
"""
import json
import os
import shutil
import signal
import stat
import struct
import subprocess
import sys
import time

PF_KTHREAD = 0x00200000
# Filesystems that hold no state a task leaves behind.
PSEUDO_FS = {
    "proc", "sysfs", "devtmpfs", "devpts", "cgroup", "cgroup2", "securityfs", "debugfs",
    "tracefs", "pstore", "bpf", "mqueue", "hugetlbfs", "configfs", "fusectl", "binfmt_misc",
    "autofs", "efivarfs", "rpc_pipefs", "nsfs", "squashfs", "iso9660", "overlay-ro",
    "fuse.gvfsd-fuse", "fuse.portal", "ramfs",
}
MAX_LISTED = 20


class Problems(list):
    """What the reset could not undo or verify, as sentences; broken lists what keeps it
    from working at all (no record, no baseline, a tool that fails)."""

    def __init__(self):
        super().__init__()
        self.broken = []

    def fail(self, what):
        self.broken.append(what)

    def add(self, what, items=None):
        if items:
            items = sorted(items)
            more = "" if len(items) <= MAX_LISTED else " (+%d more)" % (len(items) - MAX_LISTED)
            what = "%s: %s%s" % (what, ", ".join(items[:MAX_LISTED]), more)
        self.append(what)


# ---- connections -------------------------------------------------------------------------

# TCP states of a connection whose program is gone but whose socket the kernel keeps (for 60 s
# in TIME-WAIT, while the peer stays open in FIN-WAIT-2), /proc/net/tcp's hex codes.
LINGERING = {"04": "fin-wait-1", "05": "fin-wait-2", "06": "time-wait", "09": "last-ack",
             "0B": "closing"}


def lingering(ports):
    """The lingering sockets whose local port is one of ports, as "state port" strings."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            port, state = int(fields[1].rsplit(":", 1)[1], 16), fields[3]
            if port in ports and state in LINGERING:
                found.append("%s :%d" % (LINGERING[state], port))
    return found


def drop_lingering(cfg, problems):
    """Drops the connections that ended programs left on the guest ports the desktop forwards
    (Chrome's DevTools, VLC's HTTP interface). Those stay bound in the kernel after the
    programs: a setup that listens on the port again without SO_REUSEADDR (OSWorld's `socat
    tcp-listen:9222,fork ...`) then fails to start, where the snapshot has no such socket.
    Only those ports: they are the desktop's own connections by construction."""
    ports = set(cfg.get("forwarded_ports") or [])
    left = lingering(ports)
    if not left:
        return 0
    ss = shutil.which("ss") or next((p for p in ("/usr/sbin/ss", "/sbin/ss") if os.path.exists(p)), None)
    if ss:
        states = []
        for name in sorted(set(LINGERING.values())):
            states += ["state", name]
        match = " or ".join("sport = :%d" % p for p in sorted(ports))
        subprocess.run([ss, "-K", "-t", "-n"] + states + ["( %s )" % match],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    still = lingering(ports)
    if still:
        problems.add("connections of the attempt linger on forwarded guest ports (no `ss -K` "
                     "to drop them): a program listening there again would fail", still)
    return len(left) - len(still)


# ---- processes ----------------------------------------------------------------------------

def read_procs():
    """Returns {pid: (start, ppid, state, uid, comm, flags, sid)} of every process."""
    procs = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % name, "rb") as f:
                raw = f.read().decode("utf-8", "replace")
            uid = os.stat("/proc/%s" % name).st_uid
        except OSError:
            continue  # it ended
        # comm may hold spaces and parentheses: it ends at the last ")".
        comm = raw[raw.index("(") + 1:raw.rindex(")")]
        f = raw[raw.rindex(")") + 2:].split()
        # f[0] is field 3 (state): field n is f[n-3].
        procs[int(name)] = (int(f[19]), int(f[1]), f[0], uid, comm, int(f[6]), int(f[3]))
    return procs


def cmdline(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return f.read().split(b"\0")
    except OSError:
        return []


def environ_has(pid, entry):
    try:
        with open("/proc/%d/environ" % pid, "rb") as f:
            return entry in f.read().split(b"\0")
    except OSError:
        return False


def cgroup(pid):
    """The process's cgroup: systemd's hierarchy where cgroup v1 keeps it apart (name=systemd),
    else the unified one; "" when it cannot be read."""
    try:
        with open("/proc/%d/cgroup" % pid) as f:
            lines = f.read().splitlines()
    except OSError:
        return ""
    found = ""
    for line in lines:
        hier, _, rest = line.partition(":")
        ctl, _, path = rest.partition(":")
        if ctl == "name=systemd":
            return path
        if hier == "0" and ctl == "":
            found = path
    return found


def login_session(group):
    """The systemd login session (user-UID.slice/session-N.scope) that cgroup path group lies
    in, or None: a desktop's session scope holds its X server and what its session leader
    started, and no other login's processes. A service's cgroup (the guest server's own, the
    user manager's, which all of a user's logins share) and a container's root are no such
    session."""
    parts = group.split("/")
    for i in range(1, len(parts)):
        if parts[i].startswith("session-") and parts[i].endswith(".scope") and \
                parts[i - 1].startswith("user-") and parts[i - 1].endswith(".slice"):
            return "/".join(parts[:i + 1])
    return None


def own_processes(procs, nonce, ancestors=True):
    """This call's processes: itself, anything that carries the nonce (the request's shells
    and sudo), everything those start, and, with ancestors, every process it descends from
    (the guest server, its supervisor: to be left alone, though a record keeps them). What a
    request's shell starts is the call's whether or not its own arguments name the nonce: the
    helper serves a request while the caller's shell starts its next command, and a process
    caught in exec can show no arguments at all. (Seen twice on the test guest: a reset
    through the helper failed with exit 137, "Killed": its caller shell's child was killed,
    and this function was the only thing that could have spared it.)"""
    me = os.getpid()
    token = nonce.encode()
    children = {}
    for pid, info in procs.items():
        children.setdefault(info[1], []).append(pid)
    stack = [me] + [pid for pid in procs if pid != me and any(token in a for a in cmdline(pid))]
    own = set()
    while stack:
        pid = stack.pop()
        if pid not in own:
            own.add(pid)
            stack.extend(children.get(pid, []))
    p = procs.get(me, (0, 0))[1]
    while ancestors and p in procs and p not in own:
        own.add(p)
        p = procs[p][1]
    return own


def kernel_thread(pid, info):
    return pid == 2 or info[1] == 2 or info[5] & PF_KTHREAD


# Workers and on-demand daemons that the system starts and ends on its own, as root
# (systemd-udevd's worker per device event, systemd-userdbd's per lookup, systemd-fsckd,
# which a boot's fsck starts, and the D-Bus-activated timedated, hostnamed and localed,
# which a program's question starts; each exits once idle): their coming and going is not
# an attempt's doing (what they change lives in files the reset checks). Seen on the
# real-apps guest: udev workers come and go between two resets, systemd-fsckd ends a minute
# after boot, after the record, and Thunderbird's start wakes timedated.
SYSTEM_WORKERS = {"(udev-worker)", "systemd-userwor", "systemd-fsckd", "systemd-timedat",
                  "systemd-hostnam", "systemd-localed"}


def system_worker(info):
    return info[3] == 0 and info[4] in SYSTEM_WORKERS


def key(pid, info):
    return "%d:%d" % (pid, info[0])


def clean_processes(cfg, procs, session):
    """The clean state's processes, each with whether it is of the desktop's session: on a
    guest given by URL only those must still run at a reset (the machine's other work comes
    and goes as it will)."""
    own = own_processes(procs, cfg["nonce"], ancestors=False)
    facts = ProcFacts(procs, session)
    out = {}
    for pid, info in procs.items():
        if (pid in own or kernel_thread(pid, info) or system_worker(info) or info[2] == "Z"
                or not in_scope(cfg, pid)):
            continue
        out[key(pid, info)] = {"comm": info[4], "uid": info[3],
                               "session": in_session(pid, facts, session)}
    return out


def display(cfg):
    return cfg.get("display") or os.environ.get("DISPLAY", "")


def in_scope(cfg, pid):
    """Whether the record keeps a process: all of them, unless the guest shares its machine
    (then only those of the guest's X display)."""
    if not cfg.get("scope_display"):
        return True
    return environ_has(pid, b"DISPLAY=" + display(cfg).encode())


def desktop_uid(cfg):
    """The desktop user's uid: the owner of its home."""
    return os.lstat(cfg["home"]).st_uid


# ---- the desktop's session ----------------------------------------------------------------
#
# A fast reset ends processes of the desktop's session only: those whose environment names
# its X display, those in the Unix session or the login session's cgroup of the guest server,
# the X server or the window manager, and what any of them started. Another login of the
# same user, a cron job, a container's other work are not the desktop's, whoever owns them.

def guest_server(procs, nonce):
    """The process that runs this call for the desktop (the guest server): the nearest of this
    process's ancestors that does not carry the call's nonce (its shells and sudo do); None
    when that is PID 1."""
    token = nonce.encode()
    p, seen = procs.get(os.getpid(), (0, 0))[1], set()
    while p in procs and p > 1 and p not in seen:
        seen.add(p)
        if not any(token in a for a in cmdline(p)):
            return p
        p = procs[p][1]
    return None


def x_server(procs, disp):
    """The X server of display disp: the process holding its listening socket
    (/tmp/.X11-unix/XN, or the abstract socket of that name); None when none is found."""
    try:
        n = display_number(disp)
    except XError:
        return None
    names = {"/tmp/.X11-unix/X" + n, "@/tmp/.X11-unix/X" + n}
    links = set()
    try:
        with open("/proc/net/unix") as f:
            for line in f.read().splitlines()[1:]:
                p = line.split()
                # Flags 0x10000: the socket listens.
                if len(p) >= 8 and p[7] in names and int(p[3], 16) & 0x10000:
                    links.add("socket:[%s]" % p[6])
    except OSError:
        return None
    # X servers' names start with X (Xorg, Xvfb, Xwayland, Xvnc): those are looked at first,
    # the rest only when none holds it (reading every descriptor of every process takes a
    # tenth of a second on a loaded host, more under software emulation).
    for pid in sorted(procs, key=lambda p: (not procs[p][4].startswith("X"), p)) if links else ():
        d = "/proc/%d/fd" % pid
        try:
            fds = os.listdir(d)
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(os.path.join(d, fd)) in links:
                    return pid
            except OSError:
                pass
    return None


def wm_pid(cfg):
    """The window manager's pid, as its check window (_NET_SUPPORTING_WM_CHECK) says; None
    when there is no window manager, or it does not say."""
    x, _ = x_open(cfg)
    if x is None:
        return None
    with x:
        try:
            check = x.cards(x.root, "_NET_SUPPORTING_WM_CHECK")
            pid = x.cards(check[0], "_NET_WM_PID") if check else []
        except (OSError, struct.error):
            return None
    return pid[0] if pid else None


def desktop_session(cfg, procs):
    """The desktop's session as the record finds it: its display, and unless the scope is the
    display alone (cfg "scope_display": a guest server on a machine that runs other work),
    the Unix sessions and login-session cgroups of the guest server, the display's X server
    and its window manager (the anchors)."""
    s = {"display": display(cfg), "display_only": bool(cfg.get("scope_display")),
         "sids": [], "cgroups": [], "anchors": []}
    if s["display_only"]:
        return s
    sids, groups = set(), set()
    for what, pid in (("guest server", guest_server(procs, cfg["nonce"])),
                      ("X server", x_server(procs, s["display"])), ("window manager", wm_pid(cfg))):
        if pid is None or pid <= 1 or pid not in procs:
            continue
        sids.add(procs[pid][6])
        g = login_session(cgroup(pid))
        if g:
            groups.add(g)
        s["anchors"].append({"what": what, "pid": pid, "name": procs[pid][4], "sid": procs[pid][6],
                             "cgroup": g})
    s["sids"], s["cgroups"] = sorted(sids), sorted(groups)
    return s


class ProcFacts:
    """What in_session asks of each process, (ppid, sid, whether its environment names the
    display, its cgroup), read from /proc on first use: a reset asks only of the newcomers
    and their ancestors, and of their cgroups only where the session has a login session's
    ("" otherwise). A table test gives a dict instead."""

    def __init__(self, procs, session):
        self.procs, self.cache = procs, {}
        self.entry = b"DISPLAY=" + session["display"].encode()
        self.groups = bool(session["cgroups"])

    def get(self, pid):
        if pid not in self.cache:
            info = self.procs.get(pid)
            self.cache[pid] = None if info is None else (
                info[1], info[6], environ_has(pid, self.entry), cgroup(pid) if self.groups else "")
        return self.cache[pid]


def in_session(pid, facts, session):
    """Whether process pid is of the desktop's session: its environment names the display,
    it is in one of the session's Unix sessions or login-session cgroups, or it descends from
    a process that is. Not through PID 1, which adopts every orphan: a process that left the
    session (a new Unix session, a cleared environment) and was adopted is not its own any
    more, as far as the reset can tell; nor by PID 1's Unix session, which holds whatever
    never left it since boot (a container's, a guest without systemd's), not the desktop's
    alone."""
    sids, groups = set(session["sids"]), session["cgroups"]
    init = facts.get(1)
    if init is not None:
        sids.discard(init[1])
    seen = set()
    while pid > 1 and pid not in seen:
        seen.add(pid)
        f = facts.get(pid)
        if f is None:
            return False
        ppid, sid, shows_display, group = f
        if shows_display or sid in sids or any(group == g or group.startswith(g + "/") for g in groups):
            return True
        pid = ppid
    return False


def belongs(procs, pid, uid, base):
    """Whether pid is the desktop user's: a process of that user, or one that such a process
    started (sudo, a setuid helper), followed up its parents until a process of the clean
    state or PID 1. Other users' and the system's processes (those started by PID 1 or a
    daemon) never are: on a machine the desktop shares they are somebody else's work."""
    seen = set()
    while pid in procs and pid not in seen and pid > 1:
        seen.add(pid)
        info = procs[pid]
        if info[3] == uid:
            return True
        if key(pid, info) in base:
            return False
        pid = info[1]
    return False


def fate(pid, procs, facts, session, uid, base):
    """What a fast reset does with a process started since the clean state, decided here
    alone: "end" one of the desktop's session that is its user's (or that one of its user's
    started); "spare" one of the session that is another user's or the system's; leave one
    outside the session "outside", whoever owns it, even the desktop's user (another login,
    a cron job: not the attempt's); "shared" for one outside that is root's, a sign that the
    guest runs other work besides the desktop."""
    if not in_session(pid, facts, session):
        return "shared" if procs[pid][3] == 0 else "outside"
    return "end" if belongs(procs, pid, uid, base) else "spare"


def newcomers(cfg, base, session):
    """The processes that were not there at the clean state, by their fate: those to end
    (new), those left alone (spared: of the session but not the desktop user's, and those
    outside it unless the scope is the display alone, where the machine's other processes
    are not the guest's to name), root's outside the session (foreign), and the keys of the
    clean state's processes still alive."""
    procs = read_procs()
    own = own_processes(procs, cfg["nonce"])
    uid = desktop_uid(cfg)
    facts = ProcFacts(procs, session)
    new, spared, foreign, alive = {}, {}, {}, set()
    for pid, info in procs.items():
        k = key(pid, info)
        if k in base:
            if info[2] != "Z":  # a zombie is gone, whatever its parent did not reap
                alive.add(k)
            continue
        if pid in own or kernel_thread(pid, info) or system_worker(info) or info[2] == "Z":
            continue
        f = fate(pid, procs, facts, session, uid, base)
        if f == "end":
            new[pid] = info
        elif f == "spare" or not session["display_only"]:
            spared[pid] = info
        if f == "shared":
            foreign[pid] = info
    return new, spared, foreign, alive


def described(pid, info):
    return {"pid": pid, "name": info[4], "uid": info[3]}


def end_newcomers(cfg, base, session, problems, deadline):
    """Stops, then kills every process of the desktop's session that was not there at the
    clean state and is its user's, until none is left. Returns those it ended and those it
    left alone (another user's, the system's, outside the session): on a guest legato owns
    (cfg "vm") such a process is something the reset cannot undo, so it is a problem too, and
    so is any process of the clean state that is gone (elsewhere, one of the session)."""
    ended, spared, killed = [], {}, set()
    while True:
        new, left, _, alive = newcomers(cfg, base, session)
        # What the last look leaves alone is what is left running. One killed a moment ago
        # may still show, and once its parent is gone and its environment unreadable it
        # looks outside the session: it is ended, not spared.
        spared = {key(p, i): described(p, i) for p, i in left.items() if key(p, i) not in killed}
        if not new:
            break
        if time.monotonic() > deadline:
            problems.add("processes still running after SIGKILL",
                         ["%s (pid %d, state %s)" % (i[4], p, i[2]) for p, i in new.items()])
            break
        # Stop them all first, so none can start another in between.
        for pid in new:
            try:
                os.kill(pid, signal.SIGSTOP)
            except OSError:
                pass
        for pid, info in new.items():
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                continue
            # A process killed a moment ago may still show, not yet a zombie, on a
            # loaded machine: it is killed again, but listed once.
            if key(pid, info) not in killed:
                killed.add(key(pid, info))
                ended.append(described(pid, info))
        time.sleep(0.02)
    # A guest given by URL answers for its desktop's session alone.
    gone = [k for k in base if k not in alive and (cfg.get("vm") or base[k].get("session", True))]
    if gone:
        problems.add("processes of the clean state are gone",
                     ["%s (pid %s)" % (base[k]["comm"], k.split(":")[0]) for k in gone])
    spared = sorted(spared.values(), key=lambda e: e["pid"])
    if spared and cfg.get("vm"):
        problems.add("processes started since the clean state that are not the desktop user's "
                     "or not of its session (left running)",
                     ["%s (pid %d, uid %d)" % (e["name"], e["pid"], e["uid"]) for e in spared])
    return ended, spared


def shared_signs(cfg, foreign=None):
    """Why the guest looks like a machine shared with other work rather than a dedicated
    desktop: processes of other regular users, more than one X server, root's processes
    started since the clean state outside the desktop's session (foreign, {pid: info}).
    Empty when it looks dedicated."""
    uid = desktop_uid(cfg)
    others = {}
    for pid, info in read_procs().items():
        u = info[3]
        if u != uid and u >= 1000 and u != 65534:
            others.setdefault(u, "%s (pid %d)" % (info[4], pid))
    signs = []
    if others:
        signs.append("processes of other users: " + ", ".join(
            "uid %d: %s" % (u, others[u]) for u in sorted(others)[:MAX_LISTED]))
    try:
        xs = [n for n in os.listdir("/tmp/.X11-unix") if n.startswith("X")]
    except OSError:
        xs = []
    if len(xs) > 1:
        signs.append("%d X servers (%s)" % (len(xs), ", ".join(sorted(xs))))
    if foreign:
        pids = sorted(foreign)
        more = "" if len(pids) <= MAX_LISTED else " (+%d more)" % (len(pids) - MAX_LISTED)
        signs.append("root's processes started since the clean state outside the desktop's "
                     "session: " + ", ".join("%s (pid %d)" % (foreign[p][4], p)
                                             for p in pids[:MAX_LISTED]) + more)
    return signs


# ---- X windows ----------------------------------------------------------------------------

def x_open(cfg):
    """A connection to the guest's display (x11.py), or (None, why)."""
    try:
        return X(display(cfg)), None
    except (OSError, ValueError, struct.error, IndexError) as e:
        return None, str(e)


def x_state(cfg):
    """The windows, the pointer and the active window, or windows None with why."""
    x, why = x_open(cfg)
    if x is None:
        return {"windows": None, "windows_why": why}
    with x:
        try:
            px, py, _ = x.pointer()
            out = {"pointer": [px, py], "windows_why": None}
            out["windows"] = x.windows()
            out["active"] = x.active_window()
        except (OSError, struct.error) as e:
            out.update(windows=None, windows_why=str(e))
        return out


def restore_windows(cfg, clean, problems, deadline):
    """Closes the windows that were not there, releases held keys and buttons, puts the
    pointer back, activates the window that was active, and compares the windows with the
    clean ones."""
    base = clean.get("windows")
    if base is None:
        return {"checked": False, "why": clean.get("windows_why") or ""}
    x, why = x_open(cfg)
    if x is None:
        problems.fail("cannot reach the display: " + why)
        return {"checked": False, "why": why}
    closed = []
    with x:
        try:
            asked = set()
            while True:
                wins = x.windows()
                extra = [w for w in wins if w not in base]
                if not extra:
                    break
                if time.monotonic() > deadline:
                    problems.add("windows still open",
                                 ["%s %r (%s, pid %d)" % (w, wins[w]["title"], wins[w]["class"], wins[w]["pid"])
                                  for w in extra])
                    break
                # The windows of ended processes go once the window manager notices; the
                # others are asked to close, once.
                for w in extra:
                    if w not in asked:
                        asked.add(w)
                        x.close_window(w)
                        closed.append("%s %r" % (w, wins[w]["title"]))
                time.sleep(0.02)
            # Keys and buttons the attempt left pressed (a keyDown without keyUp) would change
            # what the next attempt's input does.
            px, py, buttons = x.pointer()
            keys = x.keys_held()
            if (keys or buttons) and not x.release(keys, buttons):
                problems.add("keys or buttons held, and no XTEST to release them")
            want = clean.get("pointer")
            if want and [px, py] != want:
                x.warp(want[0], want[1])
            active = clean.get("active")
            if active and x.active_window() != active:
                x.activate(active)
                for _ in range(50):
                    if x.active_window() == active:
                        break
                    time.sleep(0.02)
            wins = x.windows()
            missing = [w for w in base if w not in wins]
            if missing:
                problems.add("windows of the clean state are gone",
                             ["%s %r" % (w, base[w]["title"]) for w in missing])
            changed = [w for w in base if w in wins and wins[w] != base[w]]
            if changed:
                problems.add("windows of the clean state changed",
                             ["%s %r -> %r %s" % (w, base[w]["title"], wins[w]["title"], wins[w]["geometry"])
                              for w in changed])
            px, py, buttons = x.pointer()
            if want and [px, py] != want:
                problems.add("the pointer is at %s, not at %s" % ([px, py], want))
            if buttons or x.keys_held():
                problems.add("keys or buttons are still held")
            if active and x.active_window() != active:
                problems.add("the active window is %s, not %s" % (x.active_window(), active))
        except (OSError, struct.error) as e:
            problems.fail("the display: %s" % e)
    return {"checked": True, "closed": closed}


# ---- files --------------------------------------------------------------------------------

def kind_of(mode):
    return {stat.S_IFREG: "f", stat.S_IFDIR: "d", stat.S_IFLNK: "l", stat.S_IFIFO: "p",
            stat.S_IFSOCK: "s", stat.S_IFCHR: "c", stat.S_IFBLK: "b"}.get(stat.S_IFMT(mode), "?")


def entry(path, st):
    e = {"k": kind_of(st.st_mode), "m": stat.S_IMODE(st.st_mode), "u": st.st_uid,
         "g": st.st_gid, "t": st.st_mtime_ns, "c": st.st_ctime_ns}
    if e["k"] == "f":
        e["s"] = st.st_size
    elif e["k"] == "l":
        e["l"] = os.readlink(path)
    elif e["k"] in "cb":
        e["r"] = st.st_rdev
    return e


def scan(root, skip=()):
    """Lists the tree under root (root itself as "."), without following symbolic links or
    entering other filesystems (a mount point is listed, not entered)."""
    out = {}
    st = os.lstat(root)
    out["."] = entry(root, st)
    dev = st.st_dev
    stack = [(root, "")]
    while stack:
        d, rel = stack.pop()
        try:
            it = list(os.scandir(d))
        except OSError:
            continue
        for de in it:
            r = rel + de.name
            if de.path in skip:
                continue
            try:
                st = de.stat(follow_symlinks=False)
            except OSError:
                continue  # it went away while listed
            out[r] = entry(de.path, st)
            if stat.S_ISDIR(st.st_mode) and st.st_dev == dev:
                stack.append((de.path, r + "/"))
            elif stat.S_ISDIR(st.st_mode):
                out[r]["k"] = "mount"
    return out


SAME = ("k", "m", "u", "g", "t", "s", "l", "r")


def differs(want, cur, ctime):
    """Whether cur is not what want lists; with ctime, a change time that differs counts
    too (a file rewritten with its size and time kept), where want knows it."""
    if any(want.get(f) != cur.get(f) for f in SAME):
        return True
    return ctime and want.get("c") is not None and want.get("c") != cur.get("c")


def remove(path):
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path)
    else:
        os.unlink(path)


def copy_content(src, dst):
    """Writes src's bytes into dst in place, so the inode (and whoever holds it open) stays."""
    with open(src, "rb") as fi, open(dst, "wb") as fo:
        shutil.copyfileobj(fi, fo, 1 << 20)


def restore_tree(root, want, copy, ctime, problems, label):
    """Makes the tree under root what want lists, taking file contents from copy (a tree with
    the same layout). Returns the number of entries it changed."""
    cur = scan(root)
    changed = 0
    gone = None
    # Remove what is new, or of another kind, parents before children.
    for rel in sorted(cur):
        if gone is not None and (rel + "/").startswith(gone):
            continue
        gone = None
        w = want.get(rel)
        if rel != "." and (w is None or w["k"] != cur[rel]["k"]):
            remove(os.path.join(root, rel))
            changed += 1
            gone = rel + "/"
            cur.pop(rel)
    if changed:
        cur = scan(root)
    # Create what is missing and rewrite what differs, parents first.
    for rel in sorted(want):
        w, c = want[rel], cur.get(rel)
        path = os.path.normpath(os.path.join(root, rel))
        if c is not None and not differs(w, c, ctime):
            continue
        if w["k"] == "mount":
            continue
        changed += 1
        try:
            if w["k"] == "d":
                if c is None:
                    os.mkdir(path)
            elif w["k"] == "f":
                if c is None or w.get("s") != c.get("s") or w.get("t") != c.get("t") or \
                        (w.get("c") is not None and w.get("c") != c.get("c")):
                    copy_content(os.path.join(copy, rel), path)
            elif w["k"] == "l":
                if c is None or c.get("l") != w["l"]:
                    remove(path)
                    os.symlink(w["l"], path)
            elif w["k"] == "p":
                if c is None:
                    os.mkfifo(path)
            elif w["k"] in "cb":
                if c is None:
                    os.mknod(path, w["m"] | (stat.S_IFCHR if w["k"] == "c" else stat.S_IFBLK), w["r"])
            elif c is None:
                problems.add("%s: cannot bring back %s (a socket or an unknown kind)" % (label, path))
                continue
            os.lchown(path, w["u"], w["g"])
            if w["k"] != "l":
                os.chmod(path, w["m"])
                if w["k"] != "d":
                    os.utime(path, ns=(w["t"], w["t"]))
            else:
                os.utime(path, ns=(w["t"], w["t"]), follow_symlinks=False)
        except OSError as e:
            problems.add("%s: restore %s: %s" % (label, path, e))
    # Directory times last, children before parents: every change inside moved them.
    for rel in sorted(want, reverse=True):
        w = want[rel]
        if w["k"] == "d":
            path = os.path.normpath(os.path.join(root, rel))
            try:
                if os.lstat(path).st_mtime_ns != w["t"]:
                    os.utime(path, ns=(w["t"], w["t"]))
            except OSError as e:
                problems.add("%s: restore %s: %s" % (label, path, e))
    return changed


def verify_tree(root, want, ctime, problems, label):
    cur = scan(root)
    bad = [r for r in set(cur) | set(want)
           if r not in cur or r not in want or (want[r]["k"] != "mount" and differs(want[r], cur[r], False))]
    if bad:
        problems.add("%s still differs from the clean state" % label,
                     [os.path.normpath(os.path.join(root, r)) for r in bad])
    return cur


# ---- home ---------------------------------------------------------------------------------

def restore_home(cfg, clean, problems):
    """Brings the home back to its baseline copy, by the listing the record made."""
    home, base = cfg["home"], cfg["home_baseline"]
    want = clean.get("home")
    if not os.path.isdir(base) or want is None:
        problems.fail("no home baseline at %s" % base)
        return 0
    n = restore_tree(home, want, base, True, problems, "the home")
    cur = verify_tree(home, want, True, problems, "the home")
    for rel, e in cur.items():
        if rel in want:
            want[rel]["c"] = e["c"]
    return n


def make_home_baseline(cfg):
    home, base = cfg["home"], cfg["home_baseline"]
    if os.path.isdir(base):
        return "kept"
    os.makedirs(os.path.dirname(base), exist_ok=True)
    tmp = base + ".tmp"
    if os.path.lexists(tmp):
        remove(tmp)
    r = subprocess.run(["cp", "-ax", home, tmp], stderr=subprocess.PIPE)
    if r.returncode != 0:
        raise SystemExit("copy %s to %s: %s" % (home, tmp, r.stderr.decode("utf-8", "replace")))
    os.rename(tmp, base)
    return "created"


# ---- what the user can change -------------------------------------------------------------

def user_groups(uid):
    """The groups of the user with uid, from /etc/passwd and /etc/group."""
    name, gids = None, set()
    try:
        with open("/etc/passwd") as f:
            for line in f:
                p = line.rstrip("\n").split(":")
                if len(p) > 3 and p[2] == str(uid):
                    name = p[0]
                    gids.add(int(p[3]))
                    break
        with open("/etc/group") as f:
            for line in f:
                p = line.rstrip("\n").split(":")
                if len(p) > 3 and name and name in p[3].split(","):
                    gids.add(int(p[2]))
    except (OSError, ValueError):
        pass
    return gids


def mounts():
    """(mount point, fstype) of every mounted filesystem."""
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            pre, _, post = line.partition(" - ")
            mp = pre.split()[4].replace("\\040", " ")
            out.append((mp, post.split()[0]))
    return out


def own_dirs(cfg):
    """legato's own directories in the guest, which change with every call."""
    return {p for p in (cfg["home"], cfg["home_baseline"], cfg["state_dir"], cfg.get("helper"), cfg.get("cache")) if p}


def writable_entries(cfg, uid):
    """Every entry outside the skipped and restored paths that the user owns or may write:
    all a task that runs as the user can change there (a deletion or creation changes the
    directory it is in). Returns {path: ctime_ns}."""
    gids = user_groups(uid)
    prune = set(cfg["skip"]) | set(cfg["restore"]) | own_dirs(cfg)
    out = {}

    def mine(st):
        if stat.S_ISLNK(st.st_mode):
            return False
        if st.st_uid == uid:
            return True
        m = st.st_mode
        return bool(m & stat.S_IWOTH or (st.st_gid in gids and m & stat.S_IWGRP))

    for mp, fstype in mounts():
        if fstype in PSEUDO_FS or any(mp == p or mp.startswith(p.rstrip("/") + "/") for p in prune):
            continue
        try:
            st = os.lstat(mp)
        except OSError:
            continue
        dev = st.st_dev
        if mine(st):
            out[mp] = st.st_ctime_ns
        stack = [mp]
        while stack:
            d = stack.pop()
            try:
                it = list(os.scandir(d))
            except OSError:
                continue
            for de in it:
                if de.path in prune:
                    continue
                try:
                    st = de.stat(follow_symlinks=False)
                except OSError:
                    continue
                if mine(st):
                    out[de.path] = st.st_ctime_ns
                if stat.S_ISDIR(st.st_mode) and st.st_dev == dev:
                    stack.append(de.path)
    return out


def changed_outside(cfg, clean, problems):
    """Entries the user could change that did change, and anything changed under the checked
    directories since the clean state."""
    changed = []
    for p, c in clean.get("writable", {}).items():
        try:
            if os.lstat(p).st_ctime_ns != c:
                changed.append(p)
        except OSError:
            changed.append(p + " (gone)")
    stamp = clean["stamp_ns"]
    skip = set(cfg["skip"]) | own_dirs(cfg)
    for d in clean.get("check", []):
        if not os.path.lexists(d):
            continue
        for rel, e in scan(d, skip).items():
            if e["c"] > stamp:
                changed.append(os.path.normpath(os.path.join(d, rel)))
            if len(changed) > 200:
                break
    if changed:
        problems.add("changed outside what a fast reset restores", changed)
    return changed


# ---- commands -----------------------------------------------------------------------------

def boot_id():
    with open("/proc/sys/kernel/random/boot_id") as f:
        return f.read().strip()


def state_file(cfg):
    return os.path.join(cfg["state_dir"], "clean.json")


def write_json(path, obj):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f)
    os.rename(tmp, path)


def refuse_shared(cfg, foreign=None):
    """Why a fast reset must not run on this guest, None when it may: a guest given by URL
    whose desktop user is root, unless told that it is (then every system daemon is the
    user's: only the session tells the desktop's processes apart); or a guest not known to be
    dedicated to the desktop that looks shared with other work (foreign, when given, returns
    root's newcomers outside the session, which a reset knows of: called only when they
    count, as it reads every process)."""
    if desktop_uid(cfg) == 0 and not cfg.get("vm") and not cfg.get("root_desktop"):
        return ("the desktop user (the owner of %s) is root, whom the system's own processes "
                "share: a fast reset tells the desktop's processes apart by its session alone; "
                "if this guest's desktop does run as root (a container), say so with "
                "--guest-root-desktop" % cfg["home"])
    if cfg.get("dedicated") or cfg.get("scope_display"):
        return None
    signs = shared_signs(cfg, foreign() if foreign else None)
    if not signs:
        return None
    return ("the guest does not look like a dedicated desktop (%s): a fast reset would end "
            "processes and restore directories that may be other work's; if this guest runs "
            "nothing but the desktop, say so with --guest-dedicated" % "; ".join(signs))


def record(cfg):
    t0 = time.monotonic()
    refused = refuse_shared(cfg)
    if refused:
        return {"refused": refused}
    os.makedirs(cfg["state_dir"], mode=0o700, exist_ok=True)
    res = {"home_baseline": make_home_baseline(cfg)}
    path = state_file(cfg)
    if cfg.get("keep_same_boot") and os.path.exists(path):
        with open(path) as f:
            old = json.load(f)
        # A record of an older tool, without the session, is made again.
        if old.get("boot_id") == boot_id() and old.get("session") is not None:
            res.update(kept=True, seconds=time.monotonic() - t0)
            return res
    uid = os.lstat(cfg["home"]).st_uid
    clean = {"boot_id": boot_id(), "uid": uid, "stamp_ns": time.time_ns()}
    # The home's listing: from the home itself when its baseline was made from it just now
    # (the times of change are then right); else from the baseline, without them (a reset
    # rewrites what differs, and learns them).
    if res["home_baseline"] == "created":
        clean["home"] = scan(cfg["home"])
    else:
        clean["home"] = scan(cfg["home_baseline"])
        for e in clean["home"].values():
            e["c"] = None
    procs = read_procs()
    clean["session"] = desktop_session(cfg, procs)
    clean["processes"] = clean_processes(cfg, procs, clean["session"])
    clean.update(x_state(cfg))
    wins, why = clean["windows"], clean["windows_why"]
    trees = os.path.join(cfg["state_dir"], "trees")
    if os.path.lexists(trees):
        remove(trees)
    os.mkdir(trees, 0o700)
    clean["restore"] = []
    for i, d in enumerate(cfg["restore"]):
        if not os.path.isdir(d):
            continue
        copy = os.path.join(trees, str(i))
        want = scan(d)
        os.mkdir(copy, 0o700)
        for rel in sorted(want):
            e = want[rel]
            if rel == ".":
                continue
            src, dst = os.path.join(d, rel), os.path.join(copy, rel)
            if e["k"] in ("d", "mount"):
                os.makedirs(dst, exist_ok=True)
            elif e["k"] == "f":
                try:
                    shutil.copyfile(src, dst, follow_symlinks=False)
                except OSError:
                    want.pop(rel)  # it went away, or cannot be read: not part of the state
        clean["restore"].append({"dir": d, "copy": copy, "want": want})
    if cfg.get("check_outside"):
        clean["writable"] = writable_entries(cfg, uid)
        clean["check"] = [d for d in cfg["check"] if os.path.lexists(d)]
    write_json(path, clean)
    res.update(kept=False, processes=len(clean["processes"]),
               windows=None if wins is None else len(wins), windows_why=why,
               writable=len(clean.get("writable", {})), session=clean["session"]["anchors"],
               seconds=time.monotonic() - t0)
    return res


def adopt(cfg, pid):
    """Adds a process started after the clean state was recorded (the helper) to it."""
    path = state_file(cfg)
    with open(path) as f:
        clean = json.load(f)
    procs = read_procs()
    if pid in procs:
        clean["processes"][key(pid, procs[pid])] = {"comm": procs[pid][4], "uid": procs[pid][3],
                                                     "session": True}
        write_json(path, clean)


def reset(cfg):
    t = {"start": time.monotonic()}
    problems = Problems()
    path = state_file(cfg)
    try:
        with open(path) as f:
            clean = json.load(f)
    except OSError as e:
        problems.fail("no clean-state record (%s): the desktop makes it when it starts" % e)
        return {"problems": problems, "broken": problems.broken}
    if clean.get("boot_id") != boot_id():
        problems.fail("the guest rebooted since its clean state was recorded")
        return {"problems": problems, "broken": problems.broken}
    session = clean.get("session")
    if session is None:
        problems.fail("the clean-state record has no desktop session (an older legato made it): "
                      "record it again")
        return {"problems": problems, "broken": problems.broken}
    refused = refuse_shared(cfg, lambda: newcomers(cfg, clean["processes"], session)[2])
    if refused:
        problems.fail(refused)
        return {"problems": problems, "broken": problems.broken}
    res = {}
    res["ended"], res["spared"] = end_newcomers(cfg, clean["processes"], session, problems,
                                                time.monotonic() + 5)
    res["dropped_connections"] = drop_lingering(cfg, problems)
    t["processes"] = time.monotonic()
    res["windows"] = restore_windows(cfg, clean, problems, time.monotonic() + 3)
    t["windows"] = time.monotonic()
    res["home"] = restore_home(cfg, clean, problems)
    t["home"] = time.monotonic()
    restored = {}
    for r in clean.get("restore", []):
        label = r["dir"]
        if not os.path.isdir(r["dir"]):
            problems.add("%s is gone" % r["dir"])
            continue
        restored[label] = restore_tree(r["dir"], r["want"], r["copy"], True, problems, label)
        # What it rewrote has a new ctime: that is the clean state from now on.
        cur = verify_tree(r["dir"], r["want"], True, problems, label)
        for rel, e in cur.items():
            if rel in r["want"]:
                r["want"][rel]["c"] = e["c"]
    res["restored"] = restored
    t["dirs"] = time.monotonic()
    res["changed"] = changed_outside(cfg, clean, problems)[:MAX_LISTED]
    t["checks"] = time.monotonic()
    # Anything the steps above started is gone again, and nothing new came meanwhile.
    new = newcomers(cfg, clean["processes"], session)[0]
    if new:
        problems.add("processes started during the reset",
                     ["%s (pid %d)" % (i[4], p) for p, i in new.items()])
    if res["home"] or any(restored.values()):
        write_json(path, clean)
    res["problems"] = problems
    res["broken"] = problems.broken
    res["guest_time_ns"] = time.time_ns()
    names = ["start", "processes", "windows", "home", "dirs", "checks"]
    res["seconds"] = {n: round(t[n] - t[p], 4) for p, n in zip(names, names[1:])}
    return res
