# The guest tool's entry point (it comes last).


def cache_source(src, cache, module):
    """Keeps the tool as a compiled module in the directory cache, owned by root and read-only
    to others, so that later calls import it instead of compiling it again (a second under
    software emulation)."""
    import py_compile
    os.makedirs(cache, mode=0o755, exist_ok=True)
    os.chmod(cache, 0o755)
    path = os.path.join(cache, module + ".py")
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(src)
    os.chmod(tmp, 0o644)
    os.rename(tmp, path)
    py_compile.compile(path, doraise=True)


def main(argv, src="", cache="", module=""):
    """Runs a command and prints its answer as JSON:

      record CONFIG   remember the clean state, and start the helper (as root)
      reset CONFIG    bring the guest back to it (as root)
      quiet SECONDS   watch the guest's load and screen
      shift NS        move the clock back by NS nanoseconds (as root)
      thaw JSON       after a snapshot restore: shift the clock, reseed the kernel's random
                      generator (as root)
      dropcaches -    drop the page cache before a snapshot (as root)
      windowmark -    before a setup step starts a program: what the guest shows (launched.py)
      windowwait JSON after it: wait until the program's window mapped (launched.py)
    """
    if len(argv) != 2 or argv[0] not in ("record", "reset", "quiet", "shift", "thaw", "dropcaches", "windowmark", "windowwait"):
        sys.stderr.write("usage: (record|reset CONFIG_JSON) | (quiet SECONDS) | (shift NS) | (thaw JSON) | (dropcaches -) | (windowmark -) | (windowwait JSON)\n")
        return 2
    cmd, arg = argv
    if cmd == "record":
        cfg = json.loads(arg)
        cached, helper = False, None
        if src and cache and module and os.geteuid() == 0:
            cache_source(src, cache, module)
            cached = True
        if cached and cfg.get("helper"):
            helper = start_helper(cfg, cache, module)
        out = record(cfg)
        if helper and out.get("kept"):
            adopt(cfg, helper)
        out["helper_pid"] = helper
    elif cmd == "reset":
        out = reset(json.loads(arg))
    else:
        out = run_command({}, cmd, arg)
    sys.stdout.write(json.dumps(out))
    return 0
