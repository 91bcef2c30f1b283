"""legato's in-guest action executor (x11.py and quiet.py come first).

  python -c TEXT DIR CONFIG

OSWorld runs every action as `python -c "import pyautogui; ..."` through its guest server's
/execute: a new interpreter that imports pyautogui each time, most of a second under software
emulation. The desktop starts this program once per reset through /setup/launch, so it runs
as the guest server's user, with its interpreter, environment and working directory, as the
per-action programs do. It imports pyautogui once, then serves requests, one at a time, that
a small shell script run by /execute hands it through a FIFO (no port of its own, so it is
reached wherever the guest API is):

  act      run an action's code as `python -c PREFIX+CODE` would: a fresh __main__
           namespace, the same stdout, stderr (file descriptors 1 and 2, so the programs it
           starts are captured too), exit status and tracebacks, the same 120 s limit, and
           pyautogui's settings as the import left them; but the pause pyautogui sleeps after
           its last call is left to the settle (see DeferredPause).
  settle   answer once the screen and the CPUs have been still for an interval (see Watcher),
           or when the request's bound passed: the wait after an action in one round trip.
           With "shot" (a zlib level), the answer holds the screen it settled on, as PNG in
           base64 (shot.py), with the time its capture and its encoding took; "early" when
           it was taken while the wait ran (see shoot_early).
  act + "then": a settle request run right after the action: an action, the wait for the
           screen and the screenshot to continue from in one round trip.

DIR is a new directory for its FIFOs (made here, mode 0700). CONFIG is a JSON object:
"prefix", the code every action starts with; "pointer", a pointer style for its screenshots
instead of the one found from the guest server (shot.py). Files in DIR:

  pid      written first; the caller waits for req while this process lives
  req      the request FIFO, there once pyautogui is imported; one JSON object per line
  r-NONCE  the answer FIFO of one request, made by the caller, removed here
  failed   why it stopped, when it could not start
"""
import base64
import builtins
import collections
import io
import locale
import os
import signal
import stat
import sys
import tempfile
import threading
import time
import traceback
import zlib

# The damage of a region redrawn again and again with at most two contents (a blinking caret
# or block cursor, a panel clock repainted unchanged) does not keep the screen from settling;
# anything else that changes does. Regions up to REPEAT_MAX_AREA pixels are read back to tell.
REPEAT_MAX_AREA = 256 * 256
REPEAT_MEMORY = 2.5  # seconds a region's past contents are remembered
TICK = 0.05  # how often a settle request looks at the CPUs
LOAD_MIN = 0.2  # seconds, the least time the load of a settle is measured over
ACT_LIMIT = 120  # seconds, as OSWorld's /execute
EARLY_QUIET = 0.1  # seconds without damage before a settle takes its screenshot early
EARLY_MAX = 3  # early screenshots a settle request takes at most
CLK_TCK = os.sysconf("SC_CLK_TCK")  # the unit of /proc/stat and of os.times() * CLK_TCK
# A program may redraw once more a while after it went quiet (LibreOffice's status bar counts
# a keystroke ~0.35 s after drawing it, a toolkit shows a tooltip ~0.5 s after the pointer
# rests): longer than the quiet interval, so a settle would end before it (see
# Executor.learn). LATE_HORIZON is how long after the quiet began such a redraw still counts
# as the action's; LATE_KEEP the settles a late redraw is remembered over; LATE_MARGIN what
# the quiet is held past the latest one; FOLLOW_SHARE the share of a late redraw's delay a
# quiet gap within a settle must last to be taken for it.
LATE_HORIZON = 1.0
LATE_KEEP = 4
LATE_MARGIN = 0.1
FOLLOW_SHARE = 0.6


class ActionTimeout(BaseException):
    """Raised in an action that ran past its limit."""


class Watcher(threading.Thread):
    """Watches the screen through the X DAMAGE extension from the executor's start on, and
    keeps the damage of the last seconds: (time, area, repeat). The damage of a region is a
    repeat when the same region was damaged before, within REPEAT_MEMORY, and its contents
    (read back with GetImage and hashed: kilobytes, never the whole screen) took at most two
    values since. A spinner or a counter cycles through more, and counts from its third
    change on."""

    def __init__(self):
        super().__init__(daemon=True)
        self.lock = threading.Lock()
        self.events = collections.deque()
        self.regions = {}
        self.error = None
        self.started = threading.Event()
        self.parent = os.getppid()

    def run(self):
        try:
            with X() as x:
                self.watch(x)
        except Exception as e:  # XError is an OSError
            self.error = "cannot watch the screen: %s" % e
        finally:
            self.started.set()

    def watch(self, x):
        ext = x.extension("DAMAGE")
        if not ext:
            raise XError("the X server has no DAMAGE extension")
        major, first_event = ext
        pending = collections.deque()
        x.on_event = pending.append
        x.request(struct.pack("<BBHII", major, 0, 3, 1, 1))  # QueryVersion comes first
        # RawRectangles: an event per drawn rectangle. A new damage object starts with the
        # whole window damaged; the round trip in send() brings that event in first.
        x.send(struct.pack("<BBHIIBxxx", major, 1, 4, x.new_id(), x.root, 0))
        pending.clear()
        self.started.set()
        x.sock.settimeout(1)
        while True:
            if pending:
                b = pending.popleft()
            else:
                try:
                    b = x.packet()
                except socket.timeout:
                    if os.getppid() != self.parent:
                        os._exit(0)  # the guest server is gone: so is the executor
                    continue
            if b[0] == 0:
                raise XError("X error %d (request %d)" % (b[1], b[10]))
            if b[0] & 0x7F != first_event:
                continue
            rx, ry, w, h = struct.unpack("<hhHH", b[16:24])
            now = time.monotonic()
            repeat = False
            if w * h <= REPEAT_MAX_AREA:
                repeat = self.repeats(x, now, (rx, ry, w, h))
            with self.lock:
                self.events.append((now, w * h, repeat))
                while self.events and self.events[0][0] < now - 30:
                    self.events.popleft()

    def repeats(self, x, now, rect):
        """Whether the damage of a region is a repeat. Its contents are read only from its
        second damage on: typing damages a new region with every character."""
        past = self.regions.get(rect)
        if past is None:
            past = self.regions[rect] = collections.deque()
        while past and past[0][0] < now - REPEAT_MEMORY:
            past.popleft()
        if not past:
            past.append((now, None))
            self.prune(now)
            return False
        try:
            r = x.request(struct.pack("<BBHIhhHHI", 73, 2, 5, x.root, rect[0], rect[1], rect[2], rect[3],
                                      0xFFFFFFFF))  # GetImage, ZPixmap
        except XError:
            return False
        h = zlib.crc32(r[32:])
        past.append((now, h))
        return len({p[1] for p in past if p[1] is not None}) <= 2

    def prune(self, now):
        if len(self.regions) > 512:
            for k in [k for k, v in self.regions.items() if not v or v[-1][0] < now - REPEAT_MEMORY]:
                del self.regions[k]

    def last_damage(self):
        """When the last damage of any kind (repeats too) arrived, or None."""
        with self.lock:
            return self.events[-1][0] if self.events else None

    def damaged_since(self, t):
        """Whether any damage (repeats too) arrived after t."""
        last = self.last_damage()
        return last is not None and last >= t

    def since(self, t):
        """The damage that arrived after t, oldest first: (time, area, repeat)."""
        with self.lock:
            out = []
            for e in reversed(self.events):
                if e[0] <= t:
                    break
                out.append(e)
        out.reverse()
        return out

    def damage(self, since, until):
        """The area damaged in [since, until] besides repeats, and that of the repeats."""
        area = repeated = 0
        with self.lock:
            for t, a, repeat in reversed(self.events):
                if t < since:
                    break
                if t <= until:
                    if repeat:
                        repeated += a
                    else:
                        area += a
        return area, repeated


def expire(signum, frame):
    raise ActionTimeout()


class DeferredPause:
    """pyautogui sleeps PAUSE seconds (0.1) after each of its calls, so that programs respond
    before the next one. After an action's last call that sleep only delays the settle, which
    waits longer for the screen to be still anyway: the executor defers each pause until the
    action does anything else (any call: pyautogui's next one, a sleep, a print, a program it
    starts) and drops the pause still owed when the action ends. Whatever an action does
    after a pyautogui call still comes PAUSE after it, as under `python -c`. Works where the
    module pauses through its _handlePause(_pause), as pyautogui does."""

    def __init__(self, module):
        self.module = module
        self.until = None  # the monotonic time the owed pause ends
        self.original = getattr(module, "_handlePause", None)
        self.skip = {self.owe.__code__, self.drop.__code__, expire.__code__}
        if callable(self.original):
            module._handlePause = self.owe

    def owe(self, _pause=True):
        pause = getattr(self.module, "PAUSE", None)
        if not _pause or isinstance(pause, bool) or not isinstance(pause, (int, float)):
            return self.original(_pause)  # nothing to defer, or pyautogui's own complaint
        if pause <= 0:
            return None
        self.until = max(self.until or 0.0, time.monotonic() + pause)
        sys.setprofile(self.profile)
        return None

    def profile(self, frame, event, arg):
        if event not in ("call", "c_call") or frame.f_code in self.skip:
            return
        sys.setprofile(None)
        until, self.until = self.until, None
        if until is not None:
            left = until - time.monotonic()
            if left > 0:
                time.sleep(left)

    def drop(self):
        """Ends the action: the pause still owed is not slept."""
        sys.setprofile(None)
        self.until = None


class Executor:
    def __init__(self, d, prefix):
        self.dir = d
        self.prefix = prefix
        self.watcher = None
        self.defaults = {}
        self.pyautogui = None
        self.act_end = None  # when the last action ended, until a settle request used it
        self.quiet_since = None  # where the quiet began that the last settle found
        self.cpu = collections.deque()  # (time, busy, own, total) samples, in clock ticks
        self.shooter = Shooter(*server_screen(os.getppid()))
        self.early = None  # (time, shot) taken while a settle waited
        self.shot_cost = 0.3  # seconds the last screenshot took, capture and encoding
        self.early_tries = 0
        # Late redraws (see learn): the delays of those seen after the last settles, 0 for
        # a settle after which none came; and the settle still to learn from.
        self.lates = collections.deque(maxlen=LATE_KEEP)
        # (answer time, when its quiet began, max_damage, the delay of the late redraw it
        # waited for and saw, or 0)
        self.answered = None

    def start(self):
        g = {"__name__": "__main__", "__builtins__": builtins}
        exec(compile(self.prefix, "<string>", "exec"), g)
        self.pyautogui = sys.modules.get("pyautogui")
        self.defaults = settings(self.pyautogui)
        self.pause = DeferredPause(self.pyautogui)
        self.shooter.check()
        self.watcher = Watcher()
        self.watcher.start()
        self.watcher.started.wait(10)

    def sample(self):
        """Samples the CPUs' busy and total time and this process's own: a settle's load is
        the busy time besides the executor's own (the screenshot it takes while a settle waits
        is not the guest's work)."""
        busy, total = cpu()
        t = os.times()
        now = time.monotonic()
        self.cpu.append((now, busy, (t.user + t.system) * CLK_TCK, total))
        while len(self.cpu) > 1 and self.cpu[0][0] < now - 30:
            self.cpu.popleft()
        return now

    # ---- act ----------------------------------------------------------------------------

    def act(self, req):
        code = req.get("code")
        if not isinstance(code, str):
            raise ValueError("act: no code")
        limit = float(req.get("limit") or ACT_LIMIT)
        out, err = tempfile.TemporaryFile(dir=self.dir), tempfile.TemporaryFile(dir=self.dir)
        saved = os.dup(1), os.dup(2)
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        timed_out = False
        started = time.monotonic()
        try:
            rc, timed_out = self.run(code, limit)
        finally:
            for f in (sys.stdout, sys.stderr):
                try:
                    f.flush()
                except Exception:
                    pass
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
            restore(self.pyautogui, self.defaults)
            self.act_end = self.sample()
        if timed_out:
            return {"timeout": limit}
        out = {"output": text(out), "error": text(err), "returncode": rc, "act_s": self.act_end - started}
        then = req.get("then")
        if isinstance(then, dict):
            out["settle"] = self.settle(then)
        return out

    def run(self, code, limit):
        """Runs code as `python -c` would; returns (exit status, timed out)."""
        g = {"__name__": "__main__", "__builtins__": builtins}
        argv = sys.argv
        sys.argv = ["-c"]
        # Each `python -c` starts in the server's directory and environment: an
        # action's chdir or environment change must not reach the next one.
        cwd, env = os.getcwd(), dict(os.environ)
        old = signal.signal(signal.SIGALRM, expire)
        signal.setitimer(signal.ITIMER_REAL, limit)
        try:
            try:
                exec(compile(self.prefix + code, "<string>", "exec"), g)
            finally:
                if self.pause is not None:
                    self.pause.drop()
                signal.setitimer(signal.ITIMER_REAL, 0)
            return 0, False
        except ActionTimeout:
            return -1, True
        except SystemExit as e:
            return exit_status(e.code), False
        except SyntaxError as e:  # as the interpreter reports it: no traceback, no frame of ours
            traceback.print_exception(type(e), e, None)
            return 1, False
        except BaseException as e:
            tb = e.__traceback__
            # Drop this frame: the traceback starts in the action, as the interpreter's.
            if tb is not None and tb.tb_frame.f_code is Executor.run.__code__:
                tb = tb.tb_next
            traceback.print_exception(type(e), e, tb)
            return 1, False
        finally:
            signal.signal(signal.SIGALRM, old)
            sys.argv = argv
            try:
                os.chdir(cwd)
            except OSError:
                pass
            if os.environ != env:
                os.environ.clear()
                os.environ.update(env)

    # ---- late redraws -------------------------------------------------------------------

    def learn(self, arrival):
        """Looks at what the screen did between the last settle after an action and this
        request's arrival (the model's turn: nothing of ours runs then): more than max_damage
        pixels redrawn within LATE_HORIZON of the quiet it found is a late redraw, which that
        settle's screenshot missed. The settles that follow wait for one (late_delay)."""
        if self.answered is None or self.watcher is None:
            return
        answered, quiet, max_damage, seen = self.answered
        self.answered = None
        area = 0
        for t, a, repeat in self.watcher.since(answered):
            if t > arrival or t > quiet + LATE_HORIZON:
                break
            if not repeat:
                area += a
                if area > max_damage:
                    self.lates.append(t - quiet)
                    return
        if seen > 0:
            self.lates.append(seen)  # the settle waited for it, and it came
        elif arrival >= quiet + LATE_HORIZON:
            self.lates.append(0.0)  # watched long enough to say none came

    def late_delay(self):
        """How long after going quiet the screen was redrawn once more, at the latest, in the
        last settles; 0 when none was."""
        return max(self.lates, default=0.0)

    def late_wait(self, lo, now, interval, max_damage):
        """Whether a settle after an action must wait on for a late redraw, and the quiet gap
        after which the one it waited for came (0 when none did). It waits when one was seen
        after the last settles, longer than the quiet interval after the quiet began, and this
        settle has seen none yet (a quiet gap of FOLLOW_SHARE of its delay, then damage: the
        program's echo, then its late redraw) and has been quiet for less than it plus
        LATE_MARGIN."""
        late = self.late_delay()
        hold = min(late, LATE_HORIZON) + LATE_MARGIN
        if late <= 0 or hold <= interval:
            return False, 0.0
        prev = lo
        for t, a, repeat in self.watcher.since(lo):
            if t > now:
                break
            if repeat:
                continue
            if t - prev >= FOLLOW_SHARE * late:
                return False, t - prev  # it came
            prev = t
        start = now - hold
        if start < lo - 1e-6:
            return True, 0.0
        return self.watcher.damage(start, now)[0] > max_damage, 0.0

    def quiet_began(self, lo, now):
        """When the screen last changed (repeats aside) up to now, not before lo."""
        last = lo
        for t, a, repeat in self.watcher.since(lo):
            if t > now:
                break
            if not repeat:
                last = t
        return last

    # ---- settle -------------------------------------------------------------------------

    def settle(self, req):
        """settle_wait, then the screenshot the request asks for."""
        level = req.get("shot")
        if not isinstance(level, int) or isinstance(level, bool):
            level = None
        self.early = None
        out = self.settle_wait(req, level)
        if level is not None and "error" not in out:
            early, self.early = self.early, None
            try:
                if early is not None and out.get("settled") and not self.watcher.damaged_since(early[0]):
                    # Taken while the screen was quiet, and nothing was drawn since: it
                    # shows the settled screen.
                    png, w, h, capture, encode = early[1]
                    out["early"] = True
                else:
                    png, w, h, capture, encode = self.shooter.shot(level)
            except Exception as e:  # XError is an OSError
                out["shot_error"] = "".join(traceback.format_exception_only(type(e), e)).strip()
            else:
                out.update(png=base64.b64encode(png).decode("ascii"), width=w, height=h,
                           capture_s=capture, encode_s=encode)
        return out

    def shoot_early(self, level, now, end):
        """Takes the screenshot while a settle waits out its quiet interval, once nothing has
        been drawn for EARLY_QUIET: if nothing is drawn until the screen counts as settled,
        it is the settled screen, and its capture and encoding did not wait for the end of
        the interval. Taken again after any damage, at most EARLY_MAX times a request. A
        failure leaves it to the screenshot after the wait."""
        if level is None or self.shooter.style not in STYLES:
            return
        last = self.watcher.last_damage()
        if last is not None and last > now - EARLY_QUIET:
            return
        if self.early is not None and (last is None or last <= self.early[0]):
            return  # the one taken is still the screen
        if self.early_tries >= EARLY_MAX or now + self.shot_cost > end:
            return  # enough tries, or it would hold the answer past the request's bound
        self.early_tries += 1
        t = time.monotonic()
        try:
            self.early = (t, self.shooter.shot(level))
            self.shot_cost = time.monotonic() - t
        except Exception:
            self.early = None

    def settle_wait(self, req, level=None):
        """Waits until, over an interval, the CPUs were at most max_load busy and at most
        max_damage pixels were redrawn besides repeats; at most max seconds. The screen counts
        from the last action's end on. The CPUs count, with "window" "split" (the default),
        from this request's arrival on, over LOAD_MIN at least: what ran before it includes
        the request's own delivery (the guest server, a shell, mkfifo, cat), busy work under
        software emulation. "act" counts both from the action's end, "request" both from the
        request's arrival. "settled" is "split", except right after a settle that found the
        screen settled, with no action since (the wait before grading after the agent ended
        the attempt): the screen counts from the quiet found then, so one look after LOAD_MIN
        can tell it stayed so."""
        if self.watcher.error or not self.watcher.is_alive():
            return {"error": self.watcher.error or "the screen watcher stopped"}
        interval = float(req["interval"])
        max_load = float(req["max_load"])
        max_damage = int(req["max_damage"])
        window = req.get("window") or "split"
        start = self.sample()
        self.early_tries = 0
        end = start + max(0.0, float(req["max"]))
        # The quiet the last settle found, if no action ran since.
        quiet = self.quiet_since if window == "settled" and self.act_end is None else None
        self.quiet_since = None
        after_action = self.act_end is not None and quiet is None
        act_end = start if self.act_end is None else min(self.act_end, start)
        self.act_end = None
        lo_damage = start if window == "request" else act_end
        lo_load = act_end if window == "act" else start
        held_load = held_damage = held_late = 0  # looks that found the CPUs busy, the screen
        # changing, and a late redraw still to come
        while True:
            now = self.sample()
            since = now - interval
            load_from = max(since, lo_load)
            ready = since >= lo_damage - 1e-6 and now - load_from >= min(interval, LOAD_MIN) - 1e-6
            if quiet is not None:
                since, load_from = quiet, lo_load
                ready = now - load_from >= min(interval, LOAD_MIN) - 1e-6
            if ready:
                # The CPU sample the load counts from: the last one at or before load_from.
                base = None
                for s in self.cpu:
                    if s[0] > load_from + 1e-6:
                        break
                    if s[0] >= lo_load - 1e-6:
                        base = s
                if base is None:
                    base = self.cpu[-1]
                cur = self.cpu[-1]
                terms = [c - b for b, c in zip(base, cur)]  # seconds, busy, own, total
                load = (terms[1] - terms[2]) / terms[3] if terms[3] > 0 else 0.0
                area, repeated = self.watcher.damage(since, now)
                late, seen = False, 0.0
                if load <= max_load and area <= max_damage and after_action:
                    late, seen = self.late_wait(lo_damage, now, interval, max_damage)
                if load <= max_load and area <= max_damage and not late:
                    self.quiet_since = since
                    if after_action:
                        self.answered = (now, self.quiet_began(lo_damage, now), max_damage, seen)
                    return {"settled": True, "waited": now - start, "quiet_from": since - start,
                            "load": load, "load_terms": terms, "damage": area, "repeated": repeated,
                            "held_load": held_load, "held_damage": held_damage,
                            "held_late": held_late, "late": self.late_delay()}
                held_load += load > max_load
                held_damage += area > max_damage
                held_late += late
                quiet = None  # something happened since: wait as usual
            if now < end:
                self.shoot_early(level, now, end)
                now = self.sample()
            if now >= end:
                area, repeated = self.watcher.damage(now - interval, now)
                return {"settled": False, "waited": now - start, "damage": area, "repeated": repeated,
                        "held_load": held_load, "held_damage": held_damage, "held_late": held_late,
                        "late": self.late_delay()}
            time.sleep(min(TICK, max(0.0, end - now)))

    # ---- serving ------------------------------------------------------------------------

    def serve(self):
        tmp = os.path.join(self.dir, "req.new")
        os.mkfifo(tmp, 0o600)
        # Held open for reading and writing: a caller's write never blocks or fails while
        # this process lives, and the FIFO never reads as ended.
        fd = os.open(tmp, os.O_RDWR)
        os.rename(tmp, os.path.join(self.dir, "req"))
        buf = b""
        while True:
            chunk = os.read(fd, 1 << 16)
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                self.answer(line)

    def answer(self, line):
        self.learn(time.monotonic())
        try:
            req = json.loads(line)
            nonce = str(req.get("nonce", ""))
        except ValueError:
            return
        if not nonce or not all(c.isalnum() or c == "-" for c in nonce):
            return
        path = os.path.join(self.dir, "r-" + nonce)
        fd = open_answer(path)
        if fd is None:
            return  # the caller is gone
        try:
            os.unlink(path)
        except OSError:
            pass
        try:
            op = req.get("op")
            if op == "act":
                out = self.act(req)
            elif op == "settle":
                out = self.settle(req)
            elif op == "ping":
                out = {"pid": os.getpid(), "pointer": self.shooter.style, "pointer_why": self.shooter.why}
            else:
                raise ValueError("unknown request %r" % op)
        except Exception as e:
            out = {"failed": "".join(traceback.format_exception_only(type(e), e)).strip()}
        data = json.dumps(out).encode() + b"\n"
        try:
            os.set_blocking(fd, True)
            while data:
                data = data[os.write(fd, data):]
        except OSError:
            pass  # the caller gave up
        finally:
            os.close(fd)


def open_answer(path):
    """Opens the caller's answer FIFO for writing once the caller reads it (within 5 s);
    never a file or link put there instead."""
    deadline = time.monotonic() + 5
    while True:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
            break
        except OSError:
            if time.monotonic() > deadline:
                return None
            time.sleep(0.002)
    if not stat.S_ISFIFO(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    return fd


def settings(module):
    """The module's plain settings (PAUSE, FAILSAFE, MINIMUM_DURATION, ...), to put back after
    each action: a new interpreter would start from them."""
    if module is None:
        return {}
    out = {}
    for k, v in vars(module).items():
        if k.startswith("__"):
            continue
        if isinstance(v, (bool, int, float, str, tuple, type(None))):
            out[k] = v
        elif isinstance(v, list) and all(isinstance(e, (bool, int, float, str, tuple)) for e in v):
            out[k] = list(v)
    return out


def restore(module, defaults):
    if module is None:
        return
    for k, v in defaults.items():
        if isinstance(v, list):
            v = list(v)
        setattr(module, k, v)


def exit_status(code):
    """The exit status of an interpreter that raised SystemExit(code)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    try:
        sys.stderr.write(str(code) + "\n")
    except Exception:
        pass
    return 1


def text(f):
    """What Python's subprocess (text=True) makes of the bytes: the locale's encoding,
    universal newlines."""
    f.seek(0)
    data = f.read()
    f.close()
    return io.TextIOWrapper(io.BytesIO(data), encoding=locale.getpreferredencoding(False)).read()


def main(argv):
    d, conf = argv[0], json.loads(argv[1])
    os.mkdir(d, 0o700)
    tmp = os.path.join(d, "pid.new")
    with open(tmp, "w") as f:
        f.write("%d\n" % os.getpid())
    os.rename(tmp, os.path.join(d, "pid"))
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.dup2(null, 2)
    os.close(null)
    # As for `python -c` under /execute, whose output is a pipe.
    sys.stdout.reconfigure(line_buffering=False)
    sys.stderr.reconfigure(line_buffering=True)
    ex = Executor(d, conf["prefix"])
    if conf.get("pointer"):  # a pointer style given: the tests' way to make the two disagree
        ex.shooter.style = conf["pointer"]
    try:
        ex.start()
    except BaseException as e:
        with open(os.path.join(d, "failed"), "w") as f:
            f.write("".join(traceback.format_exception(type(e), e, e.__traceback__))[-4000:])
        return 1
    ex.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
