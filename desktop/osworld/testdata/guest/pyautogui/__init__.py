"""A small stand-in for pyautogui that drives X with xdotool (legato test guests).

pyautogui is not packaged in Debian, and OSWorld's actions are pyautogui programs run as
`python -c "import pyautogui; ..."`. This module offers the part of pyautogui's API those
programs use, with pyautogui's argument conventions, by running xdotool on $DISPLAY:

  click rightClick middleClick doubleClick tripleClick moveTo moveRel move dragTo dragRel
  mouseDown mouseUp typewrite write press hotkey keyDown keyUp scroll vscroll hscroll
  size position onScreen sleep, the easing functions (linear, easeInQuad, ...), and the
  FAILSAFE and PAUSE settings.

Keys are pyautogui's names ("enter", "ctrl", "pgdn", "f5", "a", "!"); press, hotkey and
typewrite also take lists. Moves with a duration glide in steps, as pyautogui does.
"""
import collections
import os
import subprocess
import time

FAILSAFE = True
PAUSE = 0.1
MINIMUM_DURATION = 0.1
FAILSAFE_POINTS = [(0, 0)]

Point = collections.namedtuple("Point", "x y")
Size = collections.namedtuple("Size", "width height")


class FailSafeException(Exception):
    """Raised when FAILSAFE is on and the pointer is in a corner of the screen."""


class PyAutoGUIException(Exception):
    """Raised when xdotool fails."""


def _linear(n):
    return n


linear = easeInQuad = easeOutQuad = easeInOutQuad = easeInCubic = easeOutCubic = \
    easeInOutCubic = easeInBounce = easeOutBounce = easeInElastic = easeOutElastic = _linear

_SHIFTED = {
    "!": "exclam", "@": "at", "#": "numbersign", "$": "dollar", "%": "percent",
    "^": "asciicircum", "&": "ampersand", "*": "asterisk", "(": "parenleft",
    ")": "parenright", "_": "underscore", "+": "plus", "{": "braceleft", "}": "braceright",
    "|": "bar", ":": "colon", '"': "quotedbl", "<": "less", ">": "greater", "?": "question",
    "~": "asciitilde",
}
_KEYS = {
    " ": "space", "\n": "Return", "\r": "Return", "\t": "Tab", "-": "minus", "=": "equal",
    "[": "bracketleft", "]": "bracketright", "\\": "backslash", ";": "semicolon",
    "'": "apostrophe", ",": "comma", ".": "period", "/": "slash", "`": "grave",
    "enter": "Return", "return": "Return", "esc": "Escape", "escape": "Escape",
    "tab": "Tab", "space": "space", "backspace": "BackSpace", "delete": "Delete",
    "del": "Delete", "insert": "Insert", "home": "Home", "end": "End",
    "pageup": "Prior", "pgup": "Prior", "pagedown": "Next", "pgdn": "Next",
    "up": "Up", "down": "Down", "left": "Left", "right": "Right",
    "ctrl": "Control_L", "ctrlleft": "Control_L", "ctrlright": "Control_R",
    "control": "Control_L",
    "shift": "Shift_L", "shiftleft": "Shift_L", "shiftright": "Shift_R",
    "alt": "Alt_L", "altleft": "Alt_L", "altright": "Alt_R", "option": "Alt_L",
    "win": "Super_L", "winleft": "Super_L", "winright": "Super_R", "super": "Super_L",
    "command": "Super_L", "cmd": "Super_L", "meta": "Meta_L",
    "capslock": "Caps_Lock", "numlock": "Num_Lock", "scrolllock": "Scroll_Lock",
    "printscreen": "Print", "prtsc": "Print", "prtscr": "Print", "print": "Print",
    "pause": "Pause", "menu": "Menu", "apps": "Menu",
    "volumeup": "XF86AudioRaiseVolume", "volumedown": "XF86AudioLowerVolume",
    "volumemute": "XF86AudioMute", "playpause": "XF86AudioPlay",
    "nexttrack": "XF86AudioNext", "prevtrack": "XF86AudioPrev",
    "browserback": "XF86Back", "browserforward": "XF86Forward",
    "num0": "KP_0", "num1": "KP_1", "num2": "KP_2", "num3": "KP_3", "num4": "KP_4",
    "num5": "KP_5", "num6": "KP_6", "num7": "KP_7", "num8": "KP_8", "num9": "KP_9",
    "add": "KP_Add", "subtract": "KP_Subtract", "multiply": "KP_Multiply",
    "divide": "KP_Divide", "decimal": "KP_Decimal",
}
_KEYS.update(_SHIFTED)
_KEYS.update({"f%d" % i: "F%d" % i for i in range(1, 25)})
KEYBOARD_KEYS = sorted(set(_KEYS) | set("abcdefghijklmnopqrstuvwxyz0123456789"))
KEY_NAMES = KEYBOARD_KEYS
_BUTTONS = {"left": "1", "middle": "2", "right": "3", "primary": "1", "secondary": "3",
            1: "1", 2: "2", 3: "3"}


def _xdotool(*args):
    try:
        r = subprocess.run(["xdotool"] + [str(a) for a in args], capture_output=True,
                           text=True, stdin=subprocess.DEVNULL)
    except OSError as e:
        raise PyAutoGUIException("cannot run xdotool (install the xdotool package): %s" % e)
    if r.returncode != 0:
        raise PyAutoGUIException("xdotool %s: %s" % (" ".join(map(str, args)), r.stderr.strip()))
    return r.stdout


def _keysym(key):
    if not isinstance(key, str) or key == "":
        raise PyAutoGUIException("not a key: %r" % (key,))
    if key in _KEYS:
        return _KEYS[key]
    lower = key.lower()
    if len(key) > 1 and lower in _KEYS:
        return _KEYS[lower]
    if len(key) == 1:
        return key  # letters and digits are their own keysyms (xdotool adds shift for "A")
    raise PyAutoGUIException("unknown key name %r" % key)


def _keys(args):
    """Flattens pyautogui's key arguments: names, or lists of names."""
    out = []
    for a in args:
        if isinstance(a, (list, tuple)):
            out.extend(a)
        else:
            out.append(a)
    return out


def _button(button):
    b = _BUTTONS.get(button.lower() if isinstance(button, str) else button)
    if b is None:
        raise PyAutoGUIException("unknown mouse button %r" % (button,))
    return b


def _failsafe_check():
    if FAILSAFE:
        w, h = size()
        corners = FAILSAFE_POINTS + [(0, h - 1), (w - 1, 0), (w - 1, h - 1)]
        if tuple(position()) in corners:
            raise FailSafeException(
                "fail-safe triggered: the pointer is in a corner of the screen; "
                "set pyautogui.FAILSAFE = False to disable it")


def _handlePause(pause=True):
    """Sleeps PAUSE seconds after an action, as pyautogui does (and under its name, which
    legato's executor looks for)."""
    if pause and PAUSE:
        time.sleep(PAUSE)


def _xy(x, y):
    """Resolves pyautogui's flexible coordinates: (x, y), ((x, y),), or None for 'here'."""
    if isinstance(x, (list, tuple)):
        x, y = x[0], x[1]
    cx, cy = None, None
    if x is None or y is None:
        cx, cy = position()
    return int(round(cx if x is None else x)), int(round(cy if y is None else y))


def _glide(args, x, y, duration, tween=None):
    """Appends xdotool commands that move the pointer to (x, y) in about duration s."""
    if duration is None or duration < MINIMUM_DURATION:
        args += ["mousemove", x, y]
        return
    sx, sy = position()
    steps = max(2, min(50, int(duration / 0.02)))
    tween = tween or _linear
    for i in range(1, steps + 1):
        t = tween(i / steps)
        args += ["mousemove", int(round(sx + (x - sx) * t)), int(round(sy + (y - sy) * t)),
                 "sleep", "%.3f" % (duration / steps)]


def position(x=None, y=None):
    out = _xdotool("getmouselocation", "--shell")
    vals = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    px, py = int(vals["X"]), int(vals["Y"])
    return Point(px if x is None else int(x), py if y is None else int(y))


def size():
    w, h = _xdotool("getdisplaygeometry").split()
    return Size(int(w), int(h))


def onScreen(x, y=None):
    x, y = _xy(x, y)
    w, h = size()
    return 0 <= x < w and 0 <= y < h


def sleep(seconds):
    time.sleep(seconds)


def moveTo(x=None, y=None, duration=0.0, tween=linear, logScreenshot=False, _pause=True):
    _failsafe_check()
    x, y = _xy(x, y)
    args = []
    _glide(args, x, y, duration, tween)
    _xdotool(*args)
    _handlePause(_pause)


def moveRel(xOffset=None, yOffset=None, duration=0.0, tween=linear, logScreenshot=False,
            _pause=True):
    if isinstance(xOffset, (list, tuple)):
        xOffset, yOffset = xOffset[0], xOffset[1]
    cx, cy = position()
    moveTo(cx + (xOffset or 0), cy + (yOffset or 0), duration, tween, _pause=_pause)


move = moveRel


def click(x=None, y=None, clicks=1, interval=0.0, button="left", duration=0.0, tween=linear,
          logScreenshot=None, _pause=True):
    _failsafe_check()
    b = _button(button)
    args = []
    if x is not None or y is not None:
        tx, ty = _xy(x, y)
        _glide(args, tx, ty, duration, tween)
    clicks = int(clicks)
    if clicks > 0:
        args += ["click", "--repeat", clicks, "--delay", int(interval * 1000) or 1, b]
    if args:
        _xdotool(*args)
    _handlePause(_pause)


def leftClick(x=None, y=None, interval=0.0, duration=0.0, tween=linear, **kw):
    click(x, y, 1, interval, "left", duration, tween)


def rightClick(x=None, y=None, duration=0.0, tween=linear, **kw):
    click(x, y, 1, 0.0, "right", duration, tween)


def middleClick(x=None, y=None, duration=0.0, tween=linear, **kw):
    click(x, y, 1, 0.0, "middle", duration, tween)


def doubleClick(x=None, y=None, interval=0.0, button="left", duration=0.0, tween=linear, **kw):
    click(x, y, 2, interval, button, duration, tween)


def tripleClick(x=None, y=None, interval=0.0, button="left", duration=0.0, tween=linear, **kw):
    click(x, y, 3, interval, button, duration, tween)


def mouseDown(x=None, y=None, button="left", duration=0.0, tween=linear, logScreenshot=None,
              _pause=True):
    _failsafe_check()
    args = []
    if x is not None or y is not None:
        tx, ty = _xy(x, y)
        _glide(args, tx, ty, duration, tween)
    _xdotool(*(args + ["mousedown", _button(button)]))
    _handlePause(_pause)


def mouseUp(x=None, y=None, button="left", duration=0.0, tween=linear, logScreenshot=None,
            _pause=True):
    _failsafe_check()
    args = []
    if x is not None or y is not None:
        tx, ty = _xy(x, y)
        _glide(args, tx, ty, duration, tween)
    _xdotool(*(args + ["mouseup", _button(button)]))
    _handlePause(_pause)


def dragTo(x=None, y=None, duration=0.0, tween=linear, button="left", logScreenshot=None,
           _pause=True, mouseDownUp=True):
    _failsafe_check()
    tx, ty = _xy(x, y)
    b = _button(button)
    args = ["mousedown", b] if mouseDownUp else []
    # Applications only see a drag if the pointer moves while the button is down, so even
    # an instant drag passes through a few points on the way.
    _glide(args, tx, ty, max(duration or 0.0, MINIMUM_DURATION), tween)
    if mouseDownUp:
        args += ["mouseup", b]
    _xdotool(*args)
    _handlePause(_pause)


def dragRel(xOffset=0, yOffset=0, duration=0.0, tween=linear, button="left", logScreenshot=None,
            _pause=True, mouseDownUp=True):
    if isinstance(xOffset, (list, tuple)):
        xOffset, yOffset = xOffset[0], xOffset[1]
    cx, cy = position()
    dragTo(cx + xOffset, cy + yOffset, duration, tween, button, _pause=_pause,
           mouseDownUp=mouseDownUp)


drag = dragRel


def _scroll(clicks, x, y, up, down):
    _failsafe_check()
    args = []
    if x is not None or y is not None:
        tx, ty = _xy(x, y)
        args += ["mousemove", tx, ty]
    clicks = int(clicks)
    if clicks != 0:
        args += ["click", "--repeat", abs(clicks), "--delay", 1, up if clicks > 0 else down]
    if args:
        _xdotool(*args)


def scroll(clicks, x=None, y=None, logScreenshot=None, _pause=True):
    """Scrolls up for positive clicks, down for negative ones."""
    _scroll(clicks, x, y, "4", "5")
    _handlePause(_pause)


vscroll = scroll


def hscroll(clicks, x=None, y=None, logScreenshot=None, _pause=True):
    """Scrolls right for positive clicks, left for negative ones."""
    _scroll(clicks, x, y, "7", "6")
    _handlePause(_pause)


def keyDown(key, logScreenshot=None, _pause=True):
    _failsafe_check()
    _xdotool("keydown", _keysym(key))
    _handlePause(_pause)


def keyUp(key, logScreenshot=None, _pause=True):
    _failsafe_check()
    _xdotool("keyup", _keysym(key))
    _handlePause(_pause)


def press(keys, presses=1, interval=0.0, logScreenshot=None, _pause=True):
    _failsafe_check()
    names = [_keysym(k) for k in _keys([keys])]
    args = []
    for i in range(int(presses)):
        for k in names:
            args += ["key", k]
            if interval:
                args += ["sleep", "%.3f" % interval]
    if args:
        _xdotool(*args)
    _handlePause(_pause)


def hotkey(*args, **kwargs):
    """Presses the keys in order, then releases them in reverse order."""
    _failsafe_check()
    interval = kwargs.get("interval", 0.0)
    names = [_keysym(k) for k in _keys(args)]
    cmd = []
    for k in names:
        cmd += ["keydown", k] + (["sleep", "%.3f" % interval] if interval else [])
    for k in reversed(names):
        cmd += ["keyup", k] + (["sleep", "%.3f" % interval] if interval else [])
    if cmd:
        _xdotool(*cmd)
    _handlePause(kwargs.get("_pause", True))


def typewrite(message, interval=0.0, logScreenshot=None, _pause=True):
    """Types a string, or presses each key name of a list."""
    _failsafe_check()
    if isinstance(message, str):
        if message:
            delay = max(1, int(interval * 1000))
            _xdotool("type", "--delay", delay, "--", message)
    else:
        press(list(message), interval=interval, _pause=False)
    _handlePause(_pause)


write = typewrite
