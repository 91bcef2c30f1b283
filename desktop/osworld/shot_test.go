package osworld

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// pythonHarness runs a Python program with the executor's text as
// argv[1], legato's guest server's path as argv[2] and a JSON value on its
// standard input, and returns what it prints.
func pythonHarness(t *testing.T, prog string, arg any) []byte {
	t.Helper()
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("python3 not installed")
	}
	js, err := json.Marshal(arg)
	if err != nil {
		t.Fatal(err)
	}
	server, err := filepath.Abs(filepath.Join("testdata", "guest", "server.py"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("python3", "-I", "-S", "-c", prog, executorSrc, server)
	cmd.Stdin = bytes.NewReader(js)
	out, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("python3: %v\n%s%s", err, out, stderr)
	}
	return out
}

// blendHarness draws a cursor onto a screen twice: with the executor's
// draw_cursor (guestpy/shot.py) and with legato's guest server's
// --pointer osworld code (testdata/guest/server.py), each given the
// cursor's ARGB words as it reads them (the X protocol's 32-bit words; a C
// unsigned long each from libXfixes). It prints both screens per case.
const blendHarness = `
import importlib.util, json, struct, sys
ns = {"__name__": "legato_executor"}
exec(compile(sys.argv[1], "<executor>", "exec"), ns)
spec = importlib.util.spec_from_file_location("legato_guest_server", sys.argv[2])
server = importlib.util.module_from_spec(spec)
spec.loader.exec_module(server)
out = []
for c in json.load(sys.stdin):
    w, h, cw, ch, x, y = c["w"], c["h"], c["cw"], c["ch"], c["x"], c["y"]
    mine = bytearray(c["screen"])
    ns["draw_cursor"](mine, w, h, x, y, cw, ch, b"".join(struct.pack("<I", v) for v in c["words"]))
    theirs = bytearray(c["screen"])
    word = struct.calcsize("@L")
    rgba = server.cursor_rgba(b"".join(struct.pack("@L", v) for v in c["words"]), cw * ch, word)
    server.paste_cursor(w, h, 3, theirs, cw, ch, rgba, x, y)
    out.append({"executor": list(mine), "server": list(theirs)})
print(json.dumps(out))
`

// TestShotOSWorldBlend: OSWorld's pointer, worked out by hand. The cursor
// image's words are ARGB with the colour premultiplied; OSWorld's server
// reads each word's bytes B, G, R, A as R, G, B, A and pastes the image
// with itself as the mask as PIL does: every channel
// (dst*(255-A) + C*A)/255 rounded to the nearest, C as it is. Both the
// executor and legato's guest server (--pointer osworld) must draw that.
func TestShotOSWorldBlend(t *testing.T) {
	type blendCase struct {
		name   string
		W      int   `json:"w"`
		H      int   `json:"h"`
		Screen []int `json:"screen"`
		CW     int   `json:"cw"`
		CH     int   `json:"ch"`
		X      int   `json:"x"`
		Y      int   `json:"y"`
		Words  []int `json:"words"`
		want   []int
	}
	px := []int{200, 100, 50}
	cases := []blendCase{
		{name: "A=0 leaves the screen, even with colour", Words: []int{0x00FFFFFF}, want: []int{200, 100, 50}},
		{name: "A=255 is the colour, red and blue swapped", Words: []int{0xFF102030}, want: []int{0x30, 0x20, 0x10}},
		// R: (200*127 + 16*128)/255 = 107.64; G: (100*127 + 32*128)/255 =
		// 65.87; B: (50*127 + 64*128)/255 = 57.03. The colour is not
		// multiplied by A again nor divided by it.
		{name: "A=128 rounds to the nearest", Words: []int{0x80402010}, want: []int{108, 66, 57}},
		// 200*254/255 = 199.22, 100*254/255 = 99.61, 50*254/255 = 49.80.
		{name: "A=1 over black", Words: []int{0x01000000}, want: []int{199, 100, 50}},
		// (200 + 254*254)/255 = 253.79, (100 + 64516)/255 = 253.39,
		// (50 + 64516)/255 = 253.20.
		{name: "A=254 white", Words: []int{0xFEFEFEFE}, want: []int{254, 253, 253}},
	}
	for i := range cases {
		cases[i].W, cases[i].H, cases[i].CW, cases[i].CH, cases[i].Screen = 1, 1, 1, 1, px
	}
	grey := func(n int) []int {
		s := make([]int, n*3)
		for i := range s {
			s[i] = 10
		}
		return s
	}
	cases = append(cases,
		blendCase{name: "rows and columns, top-left corner at the pointer", W: 3, H: 2, Screen: grey(6), CW: 2, CH: 2, X: 1, Y: 0,
			Words: []int{0xFF000001, 0xFF000002, 0xFF000003, 0xFF000004},
			want:  []int{10, 10, 10, 1, 0, 0, 2, 0, 0, 10, 10, 10, 3, 0, 0, 4, 0, 0}},
		blendCase{name: "cut at the right and bottom edges", W: 3, H: 2, Screen: grey(6), CW: 2, CH: 2, X: 2, Y: 1,
			Words: []int{0xFF0000FF, 0xFF0000FF, 0xFF0000FF, 0xFF0000FF},
			want:  []int{10, 10, 10, 10, 10, 10, 10, 10, 10, 10, 10, 10, 10, 10, 10, 255, 0, 0}},
	)
	var got []struct{ Executor, Server []int }
	if err := json.Unmarshal(pythonHarness(t, blendHarness, cases), &got); err != nil {
		t.Fatal(err)
	}
	if len(got) != len(cases) {
		t.Fatalf("%d answers for %d cases", len(got), len(cases))
	}
	for i, c := range cases {
		if diff := cmp.Diff(c.want, got[i].Executor); diff != "" {
			t.Errorf("%s: the executor's pixels (-want +got):\n%s", c.name, diff)
		}
		if diff := cmp.Diff(c.want, got[i].Server); diff != "" {
			t.Errorf("%s: the guest server's pixels (-want +got):\n%s", c.name, diff)
		}
	}
}

// screenHarness prints the executor's screen_of (guestpy/shot.py) for each
// case: the pointer style, the XWD file, whether it says why.
const screenHarness = `
import json, sys
ns = {"__name__": "legato_executor"}
exec(compile(sys.argv[1], "<executor>", "exec"), ns)
out = []
for c in json.load(sys.stdin):
    text = None if c["text"] is None else c["text"].encode()
    style, xwd, why = ns["screen_of"](c["argv"], c["script"], text)
    out.append([style, xwd or "", bool(why)])
print(json.dumps(out))
`

// osworldLike has what OSWorld's server (desktop_env/server/main.py)
// shows of itself to the executor; written for this test, in its shape.
const osworldLike = `from flask import Flask, request, send_file
from pyxcursor import Xcursor
app = Flask(__name__)

@app.route('/screenshot', methods=['GET'])
def capture_screen_with_cursor():
    cursor_img = Image.fromarray(Xcursor().getCursorImageArrayFast())
    screenshot = pyautogui.screenshot()
    cursor_x, cursor_y = pyautogui.position()
    screenshot.paste(cursor_img, (cursor_x, cursor_y), cursor_img)
`

// TestShotServerScreen: the executor tells the guest servers apart by their
// command lines and scripts: legato's by its first line and its flags,
// OSWorld's by its screenshot route; anything else is unknown, with a
// reason. legato's server is never taken for OSWorld's, with or without
// its first line.
func TestShotServerScreen(t *testing.T) {
	legato, err := os.ReadFile(filepath.Join("testdata", "guest", "server.py"))
	if err != nil {
		t.Fatal(err)
	}
	type screenCase struct {
		name   string
		Argv   []string `json:"argv"`
		Script string   `json:"script"`
		Text   *string  `json:"text"`
		want   []any
	}
	str := func(s string) *string { return &s }
	// osworldLike with old made new.
	edited := func(old, new string) *string {
		if !strings.Contains(osworldLike, old) {
			t.Fatalf("%q is not in osworldLike", old)
		}
		return str(strings.Replace(osworldLike, old, new, 1))
	}
	leg, osw := str(string(legato)), str(osworldLike)
	server := func(args ...string) []string { return append([]string{"python3", "/opt/g/server.py"}, args...) }
	main := []string{"/usr/bin/python3", "main.py"}
	cases := []screenCase{
		{"legato's, from the framebuffer", server("--xwd", "/fb/Xvfb_screen0"), "/opt/g/server.py", leg, []any{"legato", "/fb/Xvfb_screen0", false}},
		{"legato's, --xwd=", server("--xwd=/fb/x"), "/opt/g/server.py", leg, []any{"legato", "/fb/x", false}},
		{"legato's without a pointer", server("--no-pointer", "--xwd", "/fb/x"), "/opt/g/server.py", leg, []any{"none", "/fb/x", false}},
		{"legato's, --pointer=none", server("--pointer=none"), "/opt/g/server.py", leg, []any{"none", "", false}},
		{"legato's drawing as OSWorld's, from GetImage", server("--xwd", "/fb/x", "--pointer", "osworld"), "/opt/g/server.py", leg, []any{"osworld", "", false}},
		{"legato's with a style unknown here", server("--pointer", "sprite"), "/opt/g/server.py", leg, []any{"unknown", "", true}},
		{"OSWorld's", main, "main.py", osw, []any{"osworld", "", false}},
		{"OSWorld's given --pointer", append(main, "--pointer", "none"), "main.py", osw, []any{"osworld", "", false}},
		{"legato's without its first line", server("--pointer", "osworld"), "/opt/g/server.py", str(string(legato[300:])), []any{"unknown", "", true}},
		{"a server that pastes at the hot spot", main, "main.py",
			edited(`(cursor_x, cursor_y)`, `(cursor_x - hx, cursor_y - hy)`), []any{"unknown", "", true}},
		{"a Flask app without the screenshot route", main, "main.py",
			edited(`'/screenshot'`, `'/shot'`), []any{"unknown", "", true}},
		{"a script that cannot be read", main, "main.py", nil, []any{"unknown", "", true}},
	}
	var got [][]any
	if err := json.Unmarshal(pythonHarness(t, screenHarness, cases), &got); err != nil {
		t.Fatal(err)
	}
	if len(got) != len(cases) {
		t.Fatalf("%d answers for %d cases", len(got), len(cases))
	}
	for i, c := range cases {
		if diff := cmp.Diff(c.want, got[i]); diff != "" {
			t.Errorf("%s: (style, xwd, why given) (-want +got):\n%s", c.name, diff)
		}
	}
}

// noXFixesHarness has the executor's Shooter (guestpy/shot.py) draw
// OSWorld's pointer over an X connection whose server has no XFIXES (as
// x11.py's cursor_image says it), then take a screenshot; it prints the
// style, why, and the screenshot's error.
const noXFixesHarness = `
import json, sys
ns = {"__name__": "legato_executor"}
exec(compile(sys.argv[1], "<executor>", "exec"), ns)
XError = ns["XError"]
class NoXFixes:
    image_byte_order, root_depth, width, height = 0, 24, 4, 4
    def cursor_image(self):
        raise XError("the X server has no XFIXES extension")
    def close(self):
        pass
ns["X"] = NoXFixes
s = ns["Shooter"]("osworld")
s.check()
try:
    s.shot(1)
    err = ""
except XError as e:
    err = str(e)
print(json.dumps([s.style, s.why, err]))
`

// TestShotNoXFixes: OSWorld's server pastes the X cursor image (XFIXES);
// where the X server has none, the executor's style is unknown, with the
// reason, and it takes no screenshots. (Xvfb without XFIXES aborts as soon
// as a window manager starts: no guest for this.)
func TestShotNoXFixes(t *testing.T) {
	var got []string
	if err := json.Unmarshal(pythonHarness(t, noXFixesHarness, nil), &got); err != nil {
		t.Fatal(err)
	}
	const why = "OSWorld's guest server pastes the X cursor image, which cannot be read here: the X server has no XFIXES extension"
	if diff := cmp.Diff([]string{"unknown", why, why}, got); diff != "" {
		t.Errorf("style, why, the screenshot's error (-want +got):\n%s", diff)
	}
}
