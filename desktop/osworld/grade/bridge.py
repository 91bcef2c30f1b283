"""legato grader bridge.

Runs the getters and metrics of an OSWorld checkout for legato's desktops.
legato starts a few of them per batch as `python3 bridge.py CHECKOUT
[BYTECODE_DIR]`, each in a working directory of its own, keeps them for the
batch, and talks to each in JSON lines: one request per line on stdin, one
answer per line on the descriptor that was stdout. Everything the evaluators
print goes to stderr, which legato logs.

The checkout's modules are compiled once into BYTECODE_DIR (which mirrors
the checkout's absolute path, so it serves any number of checkouts) and read
from there by every later process; all other modules use the bytecode their
distribution ships, as Python normally does.

Requests:
  {"id": 1, "op": "ping"}
  {"id": 2, "op": "list"}
  {"id": 3, "op": "grade", "metric": NAME, "result": GETTER, "expected": GETTER
   or null, "options": {...}, "cache_dir": DIR, "env": {...}}

The first line is {"ready": true, "python": VERSION, "executable": PATH,
"pid": PID}. Answers carry the request's id and either the outcome ("score",
with "inputs": the digests of the metric's result and expected values, and
"shown": the start of the text the result's digest is of;
"metrics" and "getters", each name mapped to null when it imports, else the
reason, with "missing" naming the module a name lacks; "pong") or "error"
with a "kind":
  unavailable     the metric or getter cannot be found or imported
  file_not_found  the result getter raised FileNotFoundError (OSWorld scores 0)
  raised          a getter or the metric raised ("where" says which)
  guest           the guest server could not be reached during the request
  bad_score       the metric returned something that is not a finite number
  bad_request     the request itself was malformed

Only the Python standard library is used here. Modules of the checkout are
imported one at a time, when a name they define is first needed, so a metric
module whose third-party dependencies are missing makes only its own metrics
unavailable.
"""

import ast
import hashlib
import importlib
import importlib.machinery
import json
import math
import os
import sys
import traceback
import types
import urllib.error
import urllib.parse
import urllib.request

EVALUATORS = "desktop_env.evaluators"
KINDS = ("getters", "metrics")
# OSWorld's controller runs Python commands in the guest with this prefix.
PYTHON_PREFIX = "import pyautogui; import time; pyautogui.FAILSAFE = False; {command}"
HTTP_TIMEOUT = 120


class Unavailable(Exception):
    """A getter or metric that cannot be found or imported; missing names
    the module whose absence is why, when that is the reason."""

    def __init__(self, msg, missing=None):
        super().__init__(msg)
        self.missing = missing


class CheckoutLoader(importlib.machinery.SourceFileLoader):
    """Loads the checkout's modules with their bytecode cached under legato's
    directory: the checkout stays untouched (it may be read-only), and the
    rest of the interpreter keeps the bytecode its distribution ships, which
    a PYTHONPYCACHEPREFIX would make it ignore and recompile."""

    cache = None

    def get_code(self, fullname):
        saved = sys.pycache_prefix, sys.dont_write_bytecode
        sys.pycache_prefix, sys.dont_write_bytecode = CheckoutLoader.cache, False
        try:
            return super().get_code(fullname)
        finally:
            sys.pycache_prefix, sys.dont_write_bytecode = saved


def cache_checkout_bytecode(root, cache):
    CheckoutLoader.cache = cache
    inside = os.path.join(root, "")
    machinery = importlib.machinery

    def hook(path):
        full = os.path.abspath(path)
        if full != root and not full.startswith(inside):
            raise ImportError("not in the checkout")
        return machinery.FileFinder(
            path,
            (machinery.ExtensionFileLoader, machinery.EXTENSION_SUFFIXES),
            (CheckoutLoader, machinery.SOURCE_SUFFIXES),
            (machinery.SourcelessFileLoader, machinery.BYTECODE_SUFFIXES),
        )

    sys.path_hooks.insert(0, hook)
    sys.path_importer_cache.clear()


class Controller:
    """The part of OSWorld's PythonController that getters use, speaking
    HTTP to the guest server legato forwarded. Like OSWorld's, its methods
    return None when the server answers with an error; a server that cannot
    be reached at all is also noted, so that a score computed from such
    Nones is not reported as a reward."""

    def __init__(self, host, port):
        self.base = "http://%s:%d" % (host, port)
        self.unreachable = []

    def _call(self, method, path, form=None, body=None):
        headers = {}
        data = None
        if form is not None:
            data = urllib.parse.urlencode(form).encode()
            headers["Content-Type"] = "application/x-www-form-urlencoded"
        elif body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        req = urllib.request.Request(self.base + path, data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(req, timeout=HTTP_TIMEOUT) as resp:
                return resp.read()
        except urllib.error.HTTPError as e:
            print("guest %s %s: HTTP %d" % (method, path, e.code), file=sys.stderr)
            return None
        except (urllib.error.URLError, OSError) as e:
            self.unreachable.append("%s %s: %s" % (method, path, e))
            return None

    def _json(self, method, path, key=None, **kw):
        raw = self._call(method, path, **kw)
        if raw is None:
            return None
        try:
            value = json.loads(raw)
        except ValueError:
            return None
        return value if key is None else value.get(key)

    def get_file(self, file_path):
        return self._call("POST", "/file", form={"file_path": file_path})

    def get_screenshot(self):
        return self._call("GET", "/screenshot")

    def get_accessibility_tree(self):
        return self._json("GET", "/accessibility", "AT")

    def get_terminal_output(self):
        return self._json("GET", "/terminal", "output")

    def execute_python_command(self, command):
        argv = ["python", "-c", PYTHON_PREFIX.format(command=command)]
        return self._json("POST", "/execute", body={"command": argv, "shell": False})

    def _python_output(self, code):
        res = self.execute_python_command(code)
        return res["output"].strip() if res else None

    def get_vm_platform(self):
        return self._python_output("import platform; print(platform.system())")

    def get_vm_machine(self):
        return self._python_output("import platform; print(platform.machine())")

    def get_vm_screen_size(self):
        return self._json("POST", "/screen_size")

    def get_vm_window_size(self, app_class_name):
        return self._json("POST", "/window_size", form={"app_class_name": app_class_name})

    def get_vm_wallpaper(self):
        return self._call("POST", "/wallpaper")

    def get_vm_desktop_path(self):
        return self._json("POST", "/desktop_path", "desktop_path")

    def get_vm_directory_tree(self, path):
        return self._json("POST", "/list_directory", "directory_tree", body={"path": path})


class Env:
    """The attributes of OSWorld's DesktopEnv that getters read."""

    def __init__(self, spec, cache_dir):
        self.vm_ip = spec.get("host") or "127.0.0.1"
        self.server_port = spec.get("server_port") or 5000
        self.chromium_port = spec.get("chromium_port") or 9222
        self.vlc_port = spec.get("vlc_port") or 8080
        self.cache_dir = cache_dir
        self.controller = Controller(self.vm_ip, self.server_port)
        self.os_type = "Ubuntu"
        self.enable_proxy = False
        self.current_use_proxy = False
        self._platform = spec.get("platform")

    @property
    def vm_platform(self):
        return self._platform or self.controller.get_vm_platform()

    @property
    def vm_machine(self):
        return self.controller.get_vm_machine()

    @property
    def vm_screen_size(self):
        return self.controller.get_vm_screen_size()


class Evaluators:
    """Finds getters and metrics in the checkout without running its package
    __init__ files, which import every module (and so every third-party
    dependency) at once. The packages are replaced by empty ones with the
    same search path; each name is looked up in what __init__.py imports and
    only its own module is imported."""

    def __init__(self, root):
        self.root = root
        self.index = {}      # kind -> {name: (module, attribute)}
        self.failed = {}     # module -> (formatted import error, missing module)
        self.packages = {}
        for dotted in ("desktop_env", EVALUATORS, EVALUATORS + ".getters", EVALUATORS + ".metrics"):
            self._stub(dotted)
        for kind in KINDS:
            self.index[kind] = self._scan(EVALUATORS + "." + kind)

    def _stub(self, dotted):
        path = os.path.join(self.root, *dotted.split("."))
        mod = types.ModuleType(dotted)
        mod.__path__ = [path]
        mod.__package__ = dotted
        mod.__file__ = os.path.join(path, "__init__.py")
        kind = dotted.rpartition(".")[2]
        if kind in KINDS:
            # `from desktop_env.evaluators.metrics import x` inside a module
            # resolves lazily too.
            mod.__getattr__ = lambda name, kind=kind: self._attribute(kind, name)
        sys.modules[dotted] = mod
        parent, _, leaf = dotted.rpartition(".")
        if parent:
            setattr(sys.modules[parent], leaf, mod)
        self.packages[dotted] = mod

    def _attribute(self, kind, name):
        if name.startswith("__"):
            raise AttributeError(name)
        try:
            return self.resolve(kind, name)
        except Unavailable as e:
            raise AttributeError("%s: %s" % (name, e)) from None

    def _scan(self, package):
        """Maps each public name of a package to where it is defined, from
        the imports and definitions of its __init__.py."""
        names = {}
        directory = os.path.join(self.root, *package.split("."))
        init = os.path.join(directory, "__init__.py")
        try:
            with open(init, encoding="utf-8") as f:
                tree = ast.parse(f.read(), init)
        except (OSError, SyntaxError) as e:
            print("legato bridge: cannot read %s: %s" % (init, e), file=sys.stderr)
            return names
        starred = []
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom):
                continue
            if node.level == 1 and node.module:
                module = package + "." + node.module
            elif node.level == 0 and node.module and node.module.startswith(package + "."):
                module = node.module
            else:
                continue
            for alias in node.names:
                if alias.name == "*":
                    starred.append(module)
                else:
                    names.setdefault(alias.asname or alias.name, (module, alias.name))
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                names.setdefault(node.name, (package, node))
        for module in starred:
            path = os.path.join(self.root, *module.split(".")) + ".py"
            try:
                with open(path, encoding="utf-8") as f:
                    sub = ast.parse(f.read(), path)
            except (OSError, SyntaxError):
                continue
            for node in sub.body:
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_"):
                    names.setdefault(node.name, (module, node.name))
        return names

    def _import(self, module):
        if module in self.failed:
            raise Unavailable(*self.failed[module])
        try:
            return importlib.import_module(module)
        except BaseException as e:  # a module may even call sys.exit
            if isinstance(e, KeyboardInterrupt):
                raise
            msg = "importing %s: %s" % (module, "".join(traceback.format_exception_only(type(e), e)).strip())
            missing = e.name if isinstance(e, ModuleNotFoundError) else None
            self.failed[module] = (msg, missing)
            raise Unavailable(msg, missing)

    def resolve(self, kind, name):
        entry = self.index[kind].get(name)
        if entry is None:
            raise Unavailable("%s has no %s" % (EVALUATORS + "." + kind, name))
        module, attr = entry
        if isinstance(attr, ast.AST):
            # Defined in __init__.py itself: run just that definition.
            pkg = self.packages[module]
            if name not in pkg.__dict__:
                code = compile(ast.Module(body=[attr], type_ignores=[]), pkg.__file__, "exec")
                exec(code, pkg.__dict__)
            value = pkg.__dict__[name]
        else:
            value = getattr(self._import(module), attr, None)
        if not callable(value):
            raise Unavailable("%s.%s is not a function" % (module, attr))
        return value

    def available(self, kind, missing):
        """Name -> None when it imports, else the reason it does not; the
        module a name lacks goes into missing."""
        out = {}
        for name in sorted(self.index[kind]):
            try:
                self.resolve(kind, name)
                out[name] = None
            except Unavailable as e:
                out[name] = str(e)
                if e.missing:
                    missing[name] = e.missing
        return out


def exception_answer(where, e):
    if isinstance(e, KeyboardInterrupt):
        raise e
    return {
        "error": "".join(traceback.format_exception_only(type(e), e)).strip(),
        "kind": "raised",
        "where": where,
        "exc_type": type(e).__name__,
        "traceback": "".join(traceback.format_exception(type(e), e, e.__traceback__)),
    }


# How much of a result's text an answer shows (grade.maxShown cuts it to
# its own length and marks the cut).
SHOWN = 240


def digest(text):
    """The hex SHA-256 of an input_text; None for None."""
    if text is None:
        return None
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def input_text(value, cache_dir):
    """repr(value), each str in it that names a regular file in the grade's
    cache directory (a getter's download) replaced first by "file sha256:"
    and the file's digest, so that it follows the content and not where the
    cache is; grade.inputText is the same for native metrics. None when the
    repr names a memory address, which no other grade repeats."""
    top = os.path.abspath(cache_dir) + os.sep

    def by_content(v):
        if isinstance(v, str):
            if os.path.isabs(v) and os.path.abspath(v).startswith(top) and os.path.isfile(v):
                try:
                    h = hashlib.sha256()
                    with open(v, "rb") as f:
                        for block in iter(lambda: f.read(1 << 20), b""):
                            h.update(block)
                    return "file sha256:" + h.hexdigest()
                except OSError:
                    return v
            return v
        if isinstance(v, list):
            return [by_content(x) for x in v]
        if isinstance(v, tuple):
            return tuple(by_content(x) for x in v)
        if isinstance(v, dict):
            return {k: by_content(x) for k, x in v.items()}
        return v

    try:
        text = repr(by_content(value))
    except Exception:
        return None
    if " at 0x" in text:
        return None
    return text


def grade(evaluators, req):
    env = Env(req.get("env") or {}, req["cache_dir"])
    try:
        metric = evaluators.resolve("metrics", req["metric"])
    except Unavailable as e:
        return {"error": str(e), "kind": "unavailable", "where": "metric"}

    def run_getter(where, config):
        getter = evaluators.resolve("getters", "get_" + str(config["type"]))
        return getter(env, config)

    try:
        result = run_getter("result getter", req["result"])
    except Unavailable as e:
        return {"error": str(e), "kind": "unavailable", "where": "result getter"}
    except FileNotFoundError as e:
        return {"error": str(e), "kind": "file_not_found", "where": "result getter"}
    except BaseException as e:  # SystemExit from an evaluator is its failure, not ours
        return exception_answer("result getter", e)

    expected_config = req.get("expected")
    args = [result]
    if expected_config is not None:
        try:
            args.append(run_getter("expected getter", expected_config))
        except Unavailable as e:
            return {"error": str(e), "kind": "unavailable", "where": "expected getter"}
        except BaseException as e:
            return exception_answer("expected getter", e)
    # Before the metric, which may open what the getters fetched.
    cache_dir = req["cache_dir"]
    result_text = input_text(result, cache_dir)
    inputs = {"result": digest(result_text), "expected": digest(input_text(args[1], cache_dir)) if len(args) > 1 else None}
    shown = None if result_text is None else result_text[:SHOWN]

    try:
        value = metric(*args, **(req.get("options") or {}))
    except BaseException as e:
        return exception_answer("metric", e)

    if env.controller.unreachable:
        return {"error": "guest server unreachable: " + "; ".join(env.controller.unreachable), "kind": "guest"}
    try:
        score = float(value)
    except (TypeError, ValueError):
        return {"error": "metric returned %r, not a number" % (value,), "kind": "bad_score"}
    if not math.isfinite(score):
        return {"error": "metric returned %r" % (value,), "kind": "bad_score"}
    return {"score": score, "inputs": inputs, "shown": shown}


def main():
    if len(sys.argv) not in (2, 3):
        print("usage: bridge.py OSWORLD_CHECKOUT [BYTECODE_DIR]", file=sys.stderr)
        sys.exit(2)
    root = os.path.abspath(sys.argv[1])
    if len(sys.argv) == 3:
        cache_checkout_bytecode(root, os.path.abspath(sys.argv[2]))
    # Keep the real stdout for answers; whatever the evaluators print goes
    # to stderr instead of corrupting the protocol.
    answers = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    sys.path.insert(0, root)
    evaluators = Evaluators(root)

    def send(msg):
        answers.write(json.dumps(msg) + "\n")
        answers.flush()

    send({"ready": True, "python": sys.version.split()[0], "executable": sys.executable, "pid": os.getpid()})
    while True:
        # Bytes, so that a line that is not UTF-8 is a bad request, not
        # the end of the process.
        line = sys.stdin.buffer.readline()
        if not line:
            return
        if not line.strip():
            continue
        req_id = None
        try:
            req = json.loads(line)
            req_id = req.get("id")
            op = req.get("op")
            if op == "ping":
                answer = {"pong": True}
            elif op == "list":
                missing = {}
                answer = {kind: evaluators.available(kind, missing) for kind in KINDS}
                answer["missing"] = missing
            elif op == "grade":
                answer = grade(evaluators, req)
            else:
                answer = {"error": "unknown op %r" % (op,), "kind": "bad_request"}
        except Exception as e:
            answer = {"error": "bad request: %s" % (e,), "kind": "bad_request"}
        answer["id"] = req_id
        send(answer)


if __name__ == "__main__":
    main()
