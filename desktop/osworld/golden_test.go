package osworld

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"legato/rl/desktop"
	"legato/rl/desktop/osworld/vm"
)

func step(typ, params string) desktop.SetupStep {
	return desktop.SetupStep{Type: typ, Parameters: json.RawMessage(params)}
}

func TestGoldenKeyChangesWithWhatTheStateDependsOn(t *testing.T) {
	task := desktop.Task{ID: "t1", Snapshot: "os", Setup: []desktop.SetupStep{step("launch", `{"command":["xterm"]}`)}}
	id := vm.Identity{QEMU: "7.2.1", Machine: "abc", Image: "/img/base.qcow2:10:20"}
	cfg := Config{Home: "/home/user"}
	base, err := goldenKey(task, cfg, id)
	if err != nil {
		t.Fatal(err)
	}
	if again, _ := goldenKey(task, cfg, id); again != base {
		t.Fatalf("the key of one task and VM changed between calls: %s, %s", base, again)
	}
	for _, tc := range []struct {
		name string
		task desktop.Task
		cfg  Config
		id   vm.Identity
	}{
		{"another task ID", desktop.Task{ID: "t2", Snapshot: task.Snapshot, Setup: task.Setup}, cfg, id},
		{"another setup", desktop.Task{ID: "t1", Snapshot: task.Snapshot, Setup: []desktop.SetupStep{step("launch", `{"command":["xedit"]}`)}}, cfg, id},
		{"another snapshot", desktop.Task{ID: "t1", Snapshot: "chrome", Setup: task.Setup}, cfg, id},
		{"another home", task, Config{Home: "/root"}, id},
		{"another QEMU", task, cfg, vm.Identity{QEMU: "8.0.0", Machine: id.Machine, Image: id.Image}},
		{"another machine", task, cfg, vm.Identity{QEMU: id.QEMU, Machine: "abd", Image: id.Image}},
		{"another image", task, cfg, vm.Identity{QEMU: id.QEMU, Machine: id.Machine, Image: "/img/base.qcow2:10:21"}},
	} {
		k, err := goldenKey(tc.task, tc.cfg, tc.id)
		if err != nil {
			t.Fatal(err)
		}
		if k == base {
			t.Errorf("%s: same key %s", tc.name, k)
		}
	}
}

func TestGoldenDescriptionCarriesItsKey(t *testing.T) {
	id := vm.Identity{QEMU: "QEMU emulator version 7.2.1; odd", Machine: "m", Image: "i"}
	key := strings.Repeat("ab", 32)
	desc := goldenDescription("task; with semicolons", key, id)
	if got := goldenKeyOf(desc); got != key {
		t.Errorf("goldenKeyOf(%q) = %q, want %q", desc, got, key)
	}
	for _, d := range []string{"", "legato clean state", "key " + key} {
		if got := goldenKeyOf(d); got != "" {
			t.Errorf("goldenKeyOf(%q) = %q, want none", d, got)
		}
	}
	if n := goldenName(key); n != goldenPrefix+key[:16] {
		t.Errorf("goldenName = %q", n)
	}
}

func TestGoldenRefusal(t *testing.T) {
	xterm := step("launch", `{"command":["xterm","-T","legato-term"]}`)
	for _, tc := range []struct {
		name string
		task desktop.Task
		cfg  GoldenConfig
		want string // part of the reason; "" for a task that gets a golden state
	}{
		{"launch", desktop.Task{ID: "a", Setup: []desktop.SetupStep{xterm}}, GoldenConfig{}, ""},
		{"download: the host caches the file", desktop.Task{ID: "a", Setup: []desktop.SetupStep{step("download", `{"files":[{"url":"https://example.com/a.docx","path":"/home/user/a.docx"}]}`), xterm}}, GoldenConfig{}, ""},
		{"local tabs", desktop.Task{ID: "a", Setup: []desktop.SetupStep{step("chrome_open_tabs", `{"urls_to_open":["file:///home/user/a.html"]}`)}}, GoldenConfig{}, ""},
		{"a word that only contains a tool's name", desktop.Task{ID: "a", Setup: []desktop.SetupStep{step("execute", `{"command":["sh","-c","echo update > /tmp/curly"]}`)}}, GoldenConfig{}, ""},
		{"off", desktop.Task{ID: "a", Setup: []desktop.SetupStep{xterm}}, GoldenConfig{Off: true}, "Golden.Off"},
		{"refused by ID", desktop.Task{ID: "a", Setup: []desktop.SetupStep{xterm}}, GoldenConfig{Refuse: []string{"b", "a"}}, "Golden.Refuse"},
		{"no setup", desktop.Task{ID: "a"}, GoldenConfig{}, "no setup steps"},
		{"browse history", desktop.Task{ID: "a", Setup: []desktop.SetupStep{xterm, step("update_browse_history", `{"history":[]}`)}}, GoldenConfig{}, "step 2 (update_browse_history)"},
		{"web tabs", desktop.Task{ID: "a", Setup: []desktop.SetupStep{step("chrome_open_tabs", `{"urls_to_open":["https://www.example.com/"]}`)}}, GoldenConfig{}, "loads a web page (https://www.example.com/)"},
		{"curl", desktop.Task{ID: "a", Setup: []desktop.SetupStep{step("execute", `{"command":["curl","-o","/tmp/x","localhost"]}`)}}, GoldenConfig{}, "runs curl"},
		{"curl of the guest's own URL", desktop.Task{ID: "a", Setup: []desktop.SetupStep{step("execute_with_verification", `{"command":["true"],"verification":{"command_success":"curl -sf http://localhost:8080/requests/status.xml"}}`)}}, GoldenConfig{}, ""},
		{"curl of 127.0.0.1 and of the web", desktop.Task{ID: "a", Setup: []desktop.SetupStep{step("execute", `{"command":"curl http://127.0.0.1:8080/ https://example.com/","shell":true}`)}}, GoldenConfig{}, "names a network address (https://example.com/)"},
		{"local web tabs", desktop.Task{ID: "a", Setup: []desktop.SetupStep{step("chrome_open_tabs", `{"urls_to_open":["http://localhost:8000/a.html","http://[::1]:8000/b.html"]}`)}}, GoldenConfig{}, ""},
		{"pip in a shell line", desktop.Task{ID: "a", Setup: []desktop.SetupStep{step("execute", `{"command":"pip3 install x","shell":true}`)}}, GoldenConfig{}, "runs pip3"},
		{"url in a launch", desktop.Task{ID: "a", Setup: []desktop.SetupStep{step("launch", `{"command":["firefox","http://10.0.0.1/x"]}`)}}, GoldenConfig{}, "names a network address"},
		{"date", desktop.Task{ID: "a", Setup: []desktop.SetupStep{step("command", `{"command":["sh","-c","date > /home/user/today.txt"]}`)}}, GoldenConfig{}, "reads or sets the clock (date)"},
	} {
		got := goldenRefusal(tc.task, tc.cfg)
		switch {
		case tc.want == "" && got != "":
			t.Errorf("%s: refused (%s); want a golden state", tc.name, got)
		case tc.want != "" && !strings.Contains(got, tc.want):
			t.Errorf("%s: refusal %q; want it to say %q", tc.name, got, tc.want)
		}
	}
}

func TestGoldenSetEvictsLeastRecentlyUsed(t *testing.T) {
	var g goldenSet
	for _, id := range []string{"a", "b", "c"} {
		g.put(&goldenState{task: id})
	}
	g.touch(g.get("a")) // b is now the least recently used, then c
	names := func(ss []*goldenState) []string {
		var n []string
		for _, s := range ss {
			n = append(n, s.task)
		}
		return n
	}
	for _, tc := range []struct {
		max  int
		keep string
		want []string
	}{
		{4, "d", nil},
		{3, "d", []string{"b"}},
		{2, "d", []string{"b", "c"}},
		{1, "d", []string{"b", "c", "a"}},
		// Rebuilding a's state: a does not count, and is never evicted.
		{3, "a", nil},
		{2, "a", []string{"b"}},
		{1, "a", []string{"b", "c"}},
	} {
		if diff := cmp.Diff(tc.want, names(g.evict(tc.max, tc.keep))); diff != "" {
			t.Errorf("evict(%d, %q) (-want +got):\n%s", tc.max, tc.keep, diff)
		}
	}
	if s := g.get("a"); s.loads != 1 {
		t.Errorf("a loaded %d times, want 1", s.loads)
	}
	g.drop("b")
	if g.get("b") != nil {
		t.Error("b still there after drop")
	}
	if diff := cmp.Diff([]string{"c"}, names(g.evict(2, "d"))); diff != "" {
		t.Errorf("after dropping b (-want +got):\n%s", diff)
	}
}

func TestGoldenConfigValidate(t *testing.T) {
	base := Config{Guests: []GuestAddr{{URL: "http://127.0.0.1:5000"}}}
	if err := base.Validate(); err != nil {
		t.Fatalf("base config: %v", err)
	}
	for _, tc := range []struct {
		g    GoldenConfig
		want string
	}{
		{GoldenConfig{Max: -1}, "Golden.Max (--golden-max) -1"},
		{GoldenConfig{Refuse: []string{"a", " "}}, "Golden.Refuse: an empty task ID"},
	} {
		c := base
		c.Golden = tc.g
		err := c.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate with %+v: %v; want %q", tc.g, err, tc.want)
		}
	}
	if got := base.withDefaults().Golden.Max; got != DefaultGoldenMax {
		t.Errorf("default Golden.Max %d, want %d", got, DefaultGoldenMax)
	}
}
