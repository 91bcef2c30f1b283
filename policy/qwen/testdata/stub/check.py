"""Checks generated action code, for legato's tests.

    python3 check.py shape          reads a program on stdin and checks its shape
    python3 check.py serve          checks and runs programs, one JSON line each

A program has the right shape when every statement is a call
pyautogui.<allowed function>(<literals>): positional and keyword arguments
that are str, int or float constants (a minus sign allowed on numbers), and
nothing else: no imports, names, attributes, operators, subscripts,
comprehensions or other statements.

serve reads {"code": "..."} lines and answers each with {"ok": bool,
"error": "...", "calls": [...]}: the shape check, then the program run
against the stub pyautogui with no builtins.
"""

import ast
import json
import sys

sys.path.insert(0, __import__("os").path.dirname(__file__))

ALLOWED = (
    "click", "rightClick", "middleClick", "doubleClick", "tripleClick",
    "moveTo", "dragTo", "typewrite", "write", "hotkey", "press",
    "scroll", "hscroll",
)


def _literal(node):
    if isinstance(node, ast.Constant):
        return type(node.value) in (str, int, float)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return isinstance(node.operand, ast.Constant) and type(node.operand.value) in (int, float)
    return False


def shape_error(code):
    """Returns why code is not a sequence of allowed pyautogui calls, or None."""
    try:
        tree = ast.parse(code, mode="exec")
    except (SyntaxError, ValueError) as e:
        return "does not parse: %s" % e
    if not tree.body:
        return "empty program"
    for i, stmt in enumerate(tree.body):
        where = "statement %d" % (i + 1)
        if not isinstance(stmt, ast.Expr) or not isinstance(stmt.value, ast.Call):
            return "%s is a %s, not a call" % (where, type(stmt).__name__)
        call = stmt.value
        f = call.func
        if not (isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "pyautogui"):
            return "%s calls %s, not pyautogui.<function>" % (where, ast.dump(f))
        if f.attr not in ALLOWED:
            return "%s calls pyautogui.%s, which is not allowed" % (where, f.attr)
        for a in call.args:
            if not _literal(a):
                return "%s has a positional argument that is not a literal: %s" % (where, ast.dump(a))
        for kw in call.keywords:
            if kw.arg is None or not _literal(kw.value):
                return "%s has a keyword argument that is not name=literal" % where
    return None


def serve():
    sys._legato_stub_serve = True
    import pyautogui

    for line in sys.stdin:
        req = json.loads(line)
        code = req["code"]
        resp = {"ok": False, "error": "", "calls": []}
        err = shape_error(code)
        if err is not None:
            resp["error"] = "shape: " + err
        else:
            pyautogui.calls.clear()
            compiled = compile(code, "<action>", "exec")
            try:
                pyautogui.arm_after_next_exec()
                exec(compiled, {"__builtins__": {}, "pyautogui": pyautogui})
                resp["ok"] = True
            except Exception as e:  # the stub's Violation, or anything the code raised
                resp["error"] = "run: %s: %s" % (type(e).__name__, e)
            finally:
                pyautogui.disarm()
            resp["calls"] = list(pyautogui.calls)
        sys.stdout.write(json.dumps(resp) + "\n")
        sys.stdout.flush()


def main():
    if sys.argv[1:] == ["shape"]:
        err = shape_error(sys.stdin.read())
        if err is not None:
            sys.stdout.write(err)
            sys.exit(1)
        return
    if sys.argv[1:] == ["serve"]:
        serve()
        return
    sys.stderr.write(__doc__)
    sys.exit(2)


if __name__ == "__main__":
    main()
