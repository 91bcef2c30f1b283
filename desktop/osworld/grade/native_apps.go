package grade

// Native Go versions of the getters and metrics of OSWorld's offline
// application tasks: VLC's HTTP status and config file, GIMP's config
// files, Chrome's open tabs. They follow OSWorld's functions
// (getters/vlc.py, getters/gimp.py, getters/chrome.py, metrics/vlc.py,
// metrics/gimp.py, metrics/chrome.py) as of the commit the package doc
// names; where they differ, the package doc says how.

import (
	"context"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"legato/rl/desktop/osworld/cdp"
	"legato/rl/desktop/osworld/grade/pystr"
	"legato/rl/internal/backoff"
)

// vlcStatusTries and vlcStatusPause are OSWorld's: VLC's HTTP interface
// often answers only a moment after the program starts.
const (
	vlcStatusTries = 5
	vlcStatusPause = time.Second
	// vlcPassword is the HTTP interface's password in OSWorld's image and
	// in the setup that launches VLC (--http-password password).
	vlcPassword = "password"
)

// getVLCPlayingInfo fetches VLC's /requests/status.xml from the guest's
// VLC port into the task's cache directory; None when VLC does not answer.
func getVLCPlayingInfo(ctx context.Context, env *nativeEnv, cfg *pyDict) (any, error) {
	local, err := cacheDest(env, cfg)
	if err != nil {
		return nil, err
	}
	if env.ports.VLCPort == 0 {
		return nil, errors.New("vlc_playing_info needs the guest's VLC port (8080 in the guest): " +
			"a VM desktop forwards it; for --guest-url add ,vlc=PORT")
	}
	u := "http://" + hostPort(env.ports.Host, env.ports.VLCPort) + "/requests/status.xml"
	for try := 1; ; try++ {
		body, err := vlcStatus(ctx, env.guestHTTP, u)
		if err == nil {
			if err := writeFileAtomic(local, body); err != nil {
				return nil, err
			}
			return local, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if try == vlcStatusTries {
			return nil, nil // OSWorld hands on None; the metric scores 0
		}
		if err := backoff.Sleep(ctx, vlcStatusPause); err != nil {
			return nil, err
		}
	}
}

func vlcStatus(ctx context.Context, client *http.Client, u string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	req.SetBasicAuth("", vlcPassword)
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("VLC status: HTTP %d", resp.StatusCode)
	}
	return body, nil
}

// getVLCConfig copies the guest user's ~/.config/vlc/vlcrc into the task's
// cache directory.
func getVLCConfig(ctx context.Context, env *nativeEnv, cfg *pyDict) (any, error) {
	return getHomeFile(ctx, env, cfg, ".config/vlc/vlcrc", false)
}

// videoTypes are the video MIME subtypes OSWorld's default_video_player
// getter asks xdg-mime about, in its order and with its repeats: a type
// listed twice counts twice.
var videoTypes = []string{"3gp", "3gp", "3gpp", "3gpp", "3gpp2", "3gpp2", "avi", "avi", "divx", "divx",
	"dv", "dv", "fli", "fli", "flv", "flv", "mp2t", "mp2t", "mp4", "mp4", "mp4v-es", "mp4v-es", "mpeg", "mpeg",
	"mpeg-system", "mpeg-system", "msvideo", "msvideo", "ogg", "ogg", "quicktime", "quicktime", "vnd.divx",
	"vnd.divx", "vnd.mpegurl", "vnd.mpegurl", "vnd.rn-realvideo", "vnd.rn-realvideo", "webm", "webm", "x-anim",
	"x-anim", "x-avi", "x-avi", "x-flc", "x-flc", "x-fli", "x-fli", "x-flv", "x-flv", "x-m4v", "x-m4v",
	"x-matroska", "x-matroska", "x-mpeg", "x-mpeg", "x-mpeg-system", "x-mpeg-system", "x-mpeg2", "x-mpeg2",
	"x-ms-asf", "x-ms-asf", "x-ms-asf-plugin", "x-ms-asf-plugin", "x-ms-asx", "x-ms-asx", "x-ms-wm", "x-ms-wm",
	"x-ms-wmv", "x-ms-wmv", "x-ms-wmx", "x-ms-wmx", "x-ms-wvx", "x-ms-wvx", "x-msvideo", "x-msvideo", "x-nsv",
	"x-nsv", "x-ogm", "x-ogm", "x-ogm+ogg", "x-theora", "x-theora", "x-theora+ogg", "x-theora+ogg"}

// getDefaultVideoPlayer is the desktop file most of the video types open
// with (`xdg-mime query default video/TYPE`'s output as it is, newline
// included), the first seen among equals, as Counter.most_common picks;
// "unknown" when no query answers. A query the server refuses or that
// prints nothing does not count. OSWorld asks once per type listed, one
// request each; this asks each distinct type once (the same query
// answers the same), all in one request (executeEach). Like the other
// native getters it takes the guest for Linux unless Env.Platform says
// otherwise, where OSWorld raises.
func getDefaultVideoPlayer(ctx context.Context, env *nativeEnv, _ *pyDict) (any, error) {
	if p := env.ports.Platform; p != "" && p != "Linux" {
		return nil, raise("Exception", "('Unsupported operating system', %s)", pystr.Repr(p))
	}
	var commands [][]string
	index := map[string]int{}
	for _, t := range videoTypes {
		if _, ok := index[t]; !ok {
			index[t] = len(commands)
			commands = append(commands, []string{"xdg-mime", "query", "default", "video/" + t})
		}
	}
	res, err := executeEach(ctx, env.guest, commands)
	if err != nil {
		return nil, fmt.Errorf("query the default video player: %w", err)
	}
	counts := map[string]int{}
	var seen []string
	for _, t := range videoTypes {
		r := res[index[t]]
		if r.refused || r.Output == "" {
			continue
		}
		if counts[r.Output] == 0 {
			seen = append(seen, r.Output)
		}
		counts[r.Output]++
	}
	if len(seen) == 0 {
		return "unknown", nil
	}
	best := seen[0]
	for _, app := range seen[1:] {
		if counts[app] > counts[best] {
			best = app
		}
	}
	return best, nil
}

// getGIMPConfigFile copies ~/.config/GIMP/2.10/<file_name> from the guest
// into the task's cache directory; None when it is missing or empty.
func getGIMPConfigFile(ctx context.Context, env *nativeEnv, cfg *pyDict) (any, error) {
	name, err := subscript(cfg, "file_name")
	if err != nil {
		return nil, err
	}
	return getHomeFile(ctx, env, cfg, ".config/GIMP/2.10/"+pyStr(name), true)
}

// getHomeFile copies a file under the guest user's home into the cache at
// cfg["dest"]. OSWorld finds the home by asking the guest's Python for
// os.path.expanduser; so does this. A missing file is None when
// noneIfEmpty (gimp.py checks), and otherwise the TypeError vlc.py raises
// writing None.
func getHomeFile(ctx context.Context, env *nativeEnv, cfg *pyDict, rel string, noneIfEmpty bool) (any, error) {
	res, err := env.guest.Execute(ctx, []string{"python3", "-c",
		"import os; print(os.path.expanduser(" + pystr.Repr("~/"+rel) + "))"}, false)
	if err != nil {
		return nil, fmt.Errorf("find ~/%s in the guest: %w", rel, err)
	}
	p := pystr.Strip(res.Output)
	local, err := cacheDest(env, cfg)
	if err != nil {
		return nil, err
	}
	data, err := env.guest.File(ctx, p)
	if err != nil && !refused(err) {
		return nil, fmt.Errorf("get file %s: %w", p, err)
	}
	if err != nil || (noneIfEmpty && len(data) == 0) {
		if noneIfEmpty {
			return nil, nil
		}
		return nil, raise("TypeError", "a bytes-like object is required, not 'NoneType'")
	}
	if err := writeFileAtomic(local, data); err != nil {
		return nil, err
	}
	return local, nil
}

// cacheDest is os.path.join(env.cache_dir, config["dest"]).
func cacheDest(env *nativeEnv, cfg *pyDict) (string, error) {
	d, err := subscript(cfg, "dest")
	if err != nil {
		return "", err
	}
	dest, ok := d.(string)
	if !ok {
		return "", raise("TypeError", "join() argument must be str, bytes, or os.PathLike object, not '%s'", pyTypeName(d))
	}
	return pyJoin(env.cacheDir, dest), nil
}

func hostPort(host string, port int) string { return net.JoinHostPort(host, strconv.Itoa(port)) }

// getOpenTabsInfo lists the browser's tabs ({"title", "url"} each) over
// the guest's DevTools port; an empty list when the browser does not
// answer.
func getOpenTabsInfo(ctx context.Context, env *nativeEnv, _ *pyDict) (any, error) {
	if env.ports.ChromiumPort == 0 {
		return nil, errors.New("open_tabs_info needs the guest's Chrome DevTools port (9222 in the guest): " +
			"a VM desktop forwards it; for --guest-url add ,devtools=PORT")
	}
	c, err := cdp.New("http://"+hostPort(env.ports.Host, env.ports.ChromiumPort), env.guestHTTP)
	if err != nil {
		return nil, err
	}
	dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	conn, err := c.Dial(dctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return []any{}, nil
	}
	defer conn.Close()
	tabs, err := conn.Tabs(dctx)
	if err != nil {
		return nil, fmt.Errorf("open_tabs_info: list the browser's tabs: %w", err)
	}
	out := make([]any, 0, len(tabs))
	for _, t := range tabs {
		d := newPyDict()
		d.set("title", t.Title)
		d.set("url", t.URL)
		out = append(out, d)
	}
	return out, nil
}

// isExpectedTabs: the open tabs' URLs equal the rule's as multisets would,
// URL by URL as compare_urls decides; 0 when there are no tabs.
func isExpectedTabs(args []any, _ *pyDict) (float64, error) {
	tabs, rule := args[0], args[1]
	if !pyTruthy(tabs) {
		return 0, nil
	}
	typ, err := subscript(rule, "type")
	if err != nil {
		return 0, err
	}
	if typ != "url" {
		return 0, nil
	}
	want, err := subscript(rule, "urls")
	if err != nil {
		return 0, err
	}
	items, err := pyIter(tabs)
	if err != nil {
		return 0, err
	}
	var got []any
	for _, it := range items {
		u, err := subscript(it, "url")
		if err != nil {
			return 0, err
		}
		got = append(got, u)
	}
	wantList, err := pyIter(want)
	if err != nil {
		return 0, err
	}
	if len(wantList) != len(got) {
		return 0, nil
	}
	for _, w := range wantList {
		found := false
		for _, g := range got {
			same, err := compareURLs(w, g)
			if err != nil {
				return 0, err
			}
			if same {
				found = true
				break
			}
		}
		if !found {
			return 0, nil
		}
	}
	return 1, nil
}

// compareURLs is compare_urls(a, b): None equals only None.
func compareURLs(a, b any) (bool, error) {
	if a == nil || b == nil {
		return a == nil && b == nil, nil
	}
	as, ok1 := a.(string)
	bs, ok2 := b.(string)
	if !ok1 || !ok2 {
		return false, raise("TypeError", "expected string or bytes-like object")
	}
	return cdp.SameURL(as, bs), nil
}

// xmlNode is the part of an ElementTree element the VLC metric reads.
type xmlNode struct {
	name     string
	attrs    map[string]string
	text     *string // text before the first child; nil when there is none
	children []*xmlNode
}

// parseXML is ElementTree.fromstring for a well-formed document.
func parseXML(s string) (*xmlNode, error) {
	d := xml.NewDecoder(strings.NewReader(s))
	var stack []*xmlNode
	var root *xmlNode
	for {
		tok, err := d.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, raise("ParseError", "%v", err)
		}
		switch t := tok.(type) {
		case xml.StartElement:
			n := &xmlNode{name: t.Name.Local, attrs: map[string]string{}}
			for _, a := range t.Attr {
				n.attrs[a.Name.Local] = a.Value
			}
			if len(stack) == 0 {
				if root != nil {
					return nil, raise("ParseError", "junk after document element")
				}
				root = n
			} else {
				p := stack[len(stack)-1]
				p.children = append(p.children, n)
			}
			stack = append(stack, n)
		case xml.EndElement:
			stack = stack[:len(stack)-1]
		case xml.CharData:
			if len(stack) == 0 {
				continue
			}
			n := stack[len(stack)-1]
			if len(n.children) == 0 {
				s := string(t)
				if n.text != nil {
					s = *n.text + s
				}
				n.text = &s
			}
		}
	}
	if root == nil {
		return nil, raise("ParseError", "no element found")
	}
	return root, nil
}

// find is ElementTree's find for a path of steps "tag" or
// `tag[@name="value"]`: the first match in document order.
func (n *xmlNode) find(steps ...[2]string) *xmlNode {
	if len(steps) == 0 {
		return n
	}
	for _, c := range n.children {
		if c.name != steps[0][0] {
			continue
		}
		if want := steps[0][1]; want != "" && c.attrs["name"] != want {
			continue
		}
		if m := c.find(steps[1:]...); m != nil {
			return m
		}
	}
	return nil
}

// metaInfo is information/category[@name=cat]/info[@name=name].
func (n *xmlNode) metaInfo(cat, name string) *xmlNode {
	return n.find([2]string{"information", ""}, [2]string{"category", cat}, [2]string{"info", name})
}

// isVLCPlaying reads a VLC status.xml: 1 when VLC is playing the file (or
// URL) the rule names.
func isVLCPlaying(args []any, _ *pyDict) (float64, error) {
	p, rule := args[0], args[1]
	ps, ok := p.(string)
	if !pyTruthy(p) || !ok {
		return 0, nil
	}
	data, err := os.ReadFile(ps)
	if err != nil {
		return 0, nil // os.path.exists said no
	}
	if !utf8.Valid(data) {
		return 0, raise("UnicodeDecodeError", "'utf-8' codec can't decode %s", pystr.Repr(ps))
	}
	root, err := parseXML(string(data))
	if err != nil {
		return 0, err
	}
	state := root.find([2]string{"state", ""})
	if state == nil {
		return 0, raise("AttributeError", "'NoneType' object has no attribute 'text'")
	}
	if state.text == nil || *state.text != "playing" {
		return 0, nil
	}
	typ, err := subscript(rule, "type")
	if err != nil {
		return 0, err
	}
	first := func(paths [][2]string) *string {
		for _, q := range paths {
			if e := root.metaInfo(q[0], q[1]); e != nil && e.text != nil && *e.text != "" {
				return e.text
			}
		}
		return nil
	}
	switch typ {
	case "file_name":
		info := first([][2]string{{"meta", "filename"}, {"meta", "title"}, {"meta", "uri"}, {"meta", "location"}, {"meta", "name"}})
		if info == nil {
			return 0, nil
		}
		w, err := ruleText(rule, "file_name", "endswith first arg must be str or a tuple of str, not %s")
		if err != nil {
			return 0, err
		}
		base := *info
		if i := strings.LastIndexByte(base, '/'); i >= 0 {
			base = base[i+1:]
		}
		return score(base == w || strings.HasSuffix(*info, w)), nil
	case "url":
		info := first([][2]string{{"meta", "url"}, {"meta", "URI"}, {"meta", "location"}, {"meta", "title"},
			{"meta", "filename"}, {"Stream 0", "Codec"}, {"Stream 0", "Type"}, {"Stream 0", "Language"}})
		if info == nil {
			return 0, nil
		}
		w, err := ruleText(rule, "url", "'in <string>' requires string as left operand, not %s")
		if err != nil {
			return 0, err
		}
		if strings.Contains(*info, w) {
			return 1, nil
		}
		wu, err := url.Parse(w)
		if err != nil {
			return 0, nil // urlparse's errors are caught there too
		}
		wantPath := wu.EscapedPath()
		if base := wantPath[strings.LastIndexByte(wantPath, '/')+1:]; *info == base {
			return 1, nil
		}
		if strings.Contains(*info, "://") {
			if au, err := url.Parse(*info); err == nil && au.Host == wu.Host && strings.Contains(au.EscapedPath(), wantPath) {
				return 1, nil
			}
		}
		return 0, nil
	}
	return 0, nil
}

// ruleText is rule[key] where the metric needs a str: the TypeError
// notStr (a format for the value's type name) otherwise.
func ruleText(rule any, key, notStr string) (string, error) {
	v, err := subscript(rule, key)
	if err != nil {
		return "", err
	}
	s, ok := v.(string)
	if !ok {
		return "", raise("TypeError", notStr, pyTypeName(v))
	}
	return s, nil
}

// vlcrcSetting is the shape of OSWorld's check_qt_* VLC metrics: the last
// line of vlcrc that mentions "key=" (commented or not) gives the value,
// else the default; an int in the rule compares as its str().
func vlcrcSetting(key, ruleKey, def string) func(args []any, _ *pyDict) (float64, error) {
	return func(args []any, _ *pyDict) (float64, error) {
		text, err := readBytesText(args[0])
		if err != nil {
			return 0, err
		}
		want, err := subscript(args[1], ruleKey)
		if err != nil {
			return 0, err
		}
		got := def
		for _, line := range strings.Split(text, "\n") {
			if strings.Contains(line, key+"=") {
				got = pystr.Strip(line[strings.LastIndexByte(line, '=')+1:])
			}
		}
		return score(pyEqual(got, intAsStr(want))), nil
	}
}

// checkGlobalKeyPlayPause: "1" when the last global-key-play-pause= line
// sets a key, "0" when it is empty or absent.
func checkGlobalKeyPlayPause(args []any, _ *pyDict) (float64, error) {
	text, err := readBytesText(args[0])
	if err != nil {
		return 0, err
	}
	want, err := subscript(args[1], "expected_global_key_play_pause")
	if err != nil {
		return 0, err
	}
	got := "0"
	for _, line := range strings.Split(text, "\n") {
		if strings.Contains(line, "global-key-play-pause=") {
			got = "1"
			if pystr.Strip(line[strings.LastIndexByte(line, '=')+1:]) == "" {
				got = "0"
			}
		}
	}
	return score(pyEqual(got, intAsStr(want))), nil
}

// intAsStr is `str(v) if isinstance(v, int) else v` (a bool is an int).
func intAsStr(v any) any {
	switch v.(type) {
	case bool, *big.Int:
		return pyStr(v)
	}
	return v
}

// checkConfigStatus reads a GIMP config file (gimprc, sessionrc, ...): 1
// when a line "(key ... value)" has the rule's key (one word, or the first
// two) and ends with its value.
func checkConfigStatus(args []any, _ *pyDict) (float64, error) {
	if args[0] == nil {
		return 0, nil
	}
	text, err := readText(args[0])
	if err != nil {
		return 0, err
	}
	rule := args[1]
	for _, line := range splitKeepEnds(text) {
		if strings.HasPrefix(line, "#") || line == "\n" {
			continue
		}
		items := pyWords(strings.TrimRight(strings.TrimLeft(pystr.Strip(line), "("), ")\n"))
		key, err := subscript(rule, "key")
		if err != nil {
			return 0, err
		}
		var match bool
		switch k := key.(type) {
		case string:
			if len(items) == 0 {
				return 0, raise("IndexError", "list index out of range")
			}
			match = items[0] == k
		case []any:
			if len(k) != 2 {
				continue
			}
			if len(items) == 0 {
				return 0, raise("IndexError", "list index out of range")
			}
			if !pyEqual(items[0], k[0]) {
				continue
			}
			if len(items) < 2 {
				return 0, raise("IndexError", "list index out of range")
			}
			match = pyEqual(items[1], k[1])
		}
		if !match {
			continue
		}
		v, err := subscript(rule, "value")
		if err != nil {
			return 0, err
		}
		if pyEqual(items[len(items)-1], v) {
			return 1, nil
		}
	}
	return 0, nil
}

// splitKeepEnds is readlines() of text already in universal-newline form.
func splitKeepEnds(s string) []string {
	var lines []string
	for s != "" {
		i := strings.IndexByte(s, '\n')
		if i < 0 {
			lines = append(lines, s)
			break
		}
		lines = append(lines, s[:i+1])
		s = s[i+1:]
	}
	return lines
}

// pyWords is str.split() with no argument.
func pyWords(s string) []string {
	var words []string
	start := -1
	for i := 0; i < len(s); {
		r, n := pystr.DecodeRune(s[i:])
		if pystr.IsSpace(r) {
			if start >= 0 {
				words = append(words, s[start:i])
				start = -1
			}
		} else if start < 0 {
			start = i
		}
		i += n
	}
	if start >= 0 {
		words = append(words, s[start:])
	}
	return words
}
