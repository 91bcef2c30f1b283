"""A stand-in for pyautogui that records calls instead of making them.

legato's tests run the action code the harness generates against this
module, the way OSWorld's guest runs it (python -c "import pyautogui; ...;
<code>"), and compare what was called with what was meant. When the
program ends, the recorded calls are printed to stdout as JSON:
[{"fn": "click", "args": [10, 20], "kwargs": {}}, ...].

Anything beyond the allowed calls is a violation: another pyautogui
function, an argument that is not a plain int, float or str, an import
from the program, and (through an audit hook) running a process, opening a
file or a socket, exec, eval or compile. A violation prints VIOLATION to
stderr and ends the process at once with status 97.
"""

import atexit as _atexit
import builtins as _builtins
import json as _json
import os as _os
import sys as _sys

ALLOWED = (
    "click", "rightClick", "middleClick", "doubleClick", "tripleClick",
    "moveTo", "dragTo", "typewrite", "write", "hotkey", "press",
    "scroll", "hscroll",
)

calls = []

# In serve mode (check.py serve), violations raise instead of exiting, and
# the audit hook is armed only while check.py runs a program.
_SERVE = getattr(_sys, "_legato_stub_serve", False)
_armed = False


class Violation(Exception):
    pass


def _violation(what):
    if _SERVE:
        raise Violation(what)
    _sys.stderr.write("VIOLATION: %s\n" % what)
    _sys.stderr.flush()
    _os._exit(97)


def _recorder(name):
    def record(*args, **kwargs):
        for v in list(args) + list(kwargs.values()):
            if type(v) not in (int, float, str):
                _violation("%s got a %s argument" % (name, type(v).__name__))
        calls.append({"fn": name, "args": list(args), "kwargs": kwargs})

    record.__name__ = name
    return record


for _name in ALLOWED:
    globals()[_name] = _recorder(_name)


def __getattr__(name):
    _violation("pyautogui.%s is not allowed" % name)


_BLOCKED_EVENTS = {"exec", "compile", "open", "builtins.input", "function.__new__", "code.__new__"}
_BLOCKED_PREFIXES = ("os.", "subprocess.", "socket.", "shutil.", "ctypes.", "pty.", "urllib.", "http.", "webbrowser.")


def _audit(event, args):
    global _armed
    if _armed == "next-exec":
        # check.py's own exec of the program; arm from here on.
        if event == "exec":
            _armed = True
        return
    if _armed and (event in _BLOCKED_EVENTS or event.startswith(_BLOCKED_PREFIXES)):
        _violation("audit event %s" % event)


def arm_after_next_exec():
    global _armed
    _armed = "next-exec"


def disarm():
    global _armed
    _armed = False


_real_import = _builtins.__import__
_IMPORTABLE = {"pyautogui", "time"}


def _guarded_import(name, globals=None, locals=None, fromlist=(), level=0):
    from_program = globals is None or globals.get("__name__") == "__main__"
    if from_program and name not in _IMPORTABLE:
        _violation("import %s" % name)
    return _real_import(name, globals, locals, fromlist, level)


def _dump():
    _sys.stdout.write(_json.dumps(calls))
    _sys.stdout.flush()


_sys.addaudithook(_audit)
if not _SERVE:
    _builtins.__import__ = _guarded_import
    _atexit.register(_dump)
    _armed = True
