# The guest tool's helper: the tool kept running as root from the clean state on, so that a
# reset, a clock shift or a quiet probe costs neither sudo (seconds under software emulation)
# nor Python's start. It is part of the clean state (a snapshot holds it), serves one request
# at a time through a FIFO in a directory only the guest user and root can enter, and answers
# into a FIFO the caller made there. Its configuration is fixed when it starts: a request
# names only the command and its nonce.

HELPER_BOOT = """
import sys
sys.path.insert(0, sys.argv[1])
__import__(sys.argv[2]).serve(sys.argv[3])
"""


def helper_ping(d):
    """Whether a helper serves d: opening its FIFO for writing fails without a reader."""
    try:
        fd = os.open(os.path.join(d, "req"), os.O_WRONLY | os.O_NONBLOCK)
    except OSError:
        return False
    os.close(fd)
    return True


def start_helper(cfg, cache, module):
    """Starts the helper for cfg["helper"] unless one serves there; returns its pid (None when
    one was running already)."""
    d = cfg["helper"]
    st = os.lstat(cfg["home"])
    os.makedirs(d, mode=0o700, exist_ok=True)
    os.chown(d, st.st_uid, st.st_gid)
    os.chmod(d, 0o700)
    req = os.path.join(d, "req")
    if not (os.path.lexists(req) and stat.S_ISFIFO(os.lstat(req).st_mode)):
        if os.path.lexists(req):
            remove(req)
        os.mkfifo(req, 0o600)
    os.chown(req, st.st_uid, st.st_gid)
    if helper_ping(d):
        return None
    conf = dict(cfg)
    conf.pop("nonce", None)
    argv = [sys.executable, "-I", "-S", "-c", HELPER_BOOT, cache, module, json.dumps(conf)]
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the middle process: a session of its own, then gone, so the helper is
        # nobody's child and outlives this call
        try:
            os.close(r)
            os.setsid()
            if os.fork() == 0:
                null = os.open(os.devnull, os.O_RDWR)
                for fd in (0, 1, 2):
                    os.dup2(null, fd)
                os.write(w, b"%d" % os.getpid())
                os.closerange(3, 65536)
                os.chdir("/")
                os.execv(argv[0], argv)
        finally:
            os._exit(0)
    os.close(w)
    os.waitpid(pid, 0)
    with os.fdopen(r, "rb") as f:
        helper = int(f.read() or b"0")
    for _ in range(500):
        if helper_ping(d):
            return helper
        time.sleep(0.01)
    raise OSError("the helper did not start serving %s" % d)


def serve(conf_json):
    cfg = json.loads(conf_json)
    d = cfg["helper"]
    req = os.path.join(d, "req")
    while True:
        with open(req, "rb") as f:  # waits for a caller
            for line in f:
                try:
                    answer(cfg, d, line)
                except Exception:  # a bad request must not end the helper
                    pass


def answer(cfg, d, line):
    msg = json.loads(line)
    nonce = str(msg.get("nonce", ""))
    if not nonce or not all(c.isalnum() or c == "-" for c in nonce):
        return
    try:
        out = run_command(dict(cfg, nonce=nonce), msg.get("cmd"), msg.get("arg", ""))
    except Exception as e:
        import traceback
        out = {"error": "".join(traceback.format_exception_only(type(e), e)).strip(),
               "trace": traceback.format_exc()[-2000:]}
    out["helper_pid"] = os.getpid()
    data = json.dumps(out).encode()
    path = os.path.join(d, "r-" + nonce)
    # The caller made the FIFO and waits on it; never follow a link placed there instead.
    deadline = time.monotonic() + 5
    while True:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
            break
        except OSError:
            if time.monotonic() > deadline:
                return
            time.sleep(0.01)
    try:
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return
        os.set_blocking(fd, True)
        while data:
            data = data[os.write(fd, data):]
    finally:
        os.close(fd)


def shift_clock(ns):
    """Moves the clock back by ns nanoseconds (the guest's offset from the host)."""
    now = time.clock_gettime_ns(time.CLOCK_REALTIME)
    time.clock_settime_ns(time.CLOCK_REALTIME, now - ns)
    return {"guest_time_ns": time.time_ns()}


# linux/random.h: _IOW('R', 0x03, int[2]) and _IO('R', 0x07).
RNDADDENTROPY = 0x40085203
RNDRESEEDCRNG = 0x5207


def thaw(arg):
    """After a snapshot restore, before the guest is used: moves the clock back by shift_ns (its
    offset from the host's) and credits the host's seed (hex) to the kernel's random pool,
    then reseeds its generator, so that guests restored from one snapshot draw different
    random numbers from then on. As root."""
    import fcntl
    a = json.loads(arg)
    out = {}
    if a.get("shift_ns"):
        out.update(shift_clock(int(a["shift_ns"])))
    seed = bytes.fromhex(a.get("seed", ""))
    if seed:
        with open("/dev/urandom", "wb", buffering=0) as f:
            fcntl.ioctl(f, RNDADDENTROPY, struct.pack("ii", 8 * len(seed), len(seed)) + seed)
            try:
                fcntl.ioctl(f, RNDRESEEDCRNG)
                out["reseeded"] = True
            except OSError:  # before Linux 4.17: the credited seed reseeds it soon enough
                out["reseeded"] = False
        out["seed_bytes"] = len(seed)
    return out


def drop_caches():
    """Writes dirty pages out and drops the clean page cache, dentries and inodes, so that a
    snapshot taken next holds the programs' memory and little else. As root."""
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3")
    return {}


def run_command(cfg, cmd, arg):
    if cmd == "reset":
        return reset(cfg)
    if cmd == "quiet":
        return quiet(float(arg))
    if cmd == "shift":
        return shift_clock(int(arg))
    if cmd == "thaw":
        return thaw(arg)
    if cmd == "dropcaches":
        return drop_caches()
    if cmd == "windowmark":
        return window_mark()
    if cmd == "windowwait":
        return window_wait(arg)
    if cmd == "ping":
        return {}
    raise ValueError("unknown command %r" % cmd)
