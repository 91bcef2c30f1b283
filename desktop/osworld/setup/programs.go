package setup

import (
	"context"
	"encoding/json"
	"path"
	"slices"
	"strings"
	"time"

	"legato/rl/desktop"
)

// A step that starts a program ends when the guest server has started it,
// long before the program shows its window: the screen is quiet meanwhile,
// and a settle after the setup (a golden state's) sees the desktop without
// it. OSWorld's runner sleeps after the reset; legato's setup waits, after
// each step that starts a program, until the program's window has mapped
// (Controller.Windows), and only then does the desktop wait for a quiet
// screen.
//
// The steps that start a program (startedProgram decides, from the step
// alone):
//   - launch, unless its program is one that never shows a window
//     (windowless: socat, which OSWorld's Chrome tasks launch to forward
//     the DevTools port);
//   - open: it hands a file to xdg-open and whatever that starts or wakes,
//     so any window new since the step began counts, whichever process
//     owns it, or a window titled with the file's name (a tab in a window
//     that was there);
//   - execute and command, when the command leaves a program running in
//     the background: a shell's & (vlc file &, nohup ... &, (cd d && vlc) &),
//     or an opener that hands a file or program to another process and
//     returns (xdg-open, gio open, gtk-launch, gnome-terminal, nautilus:
//     any new window counts, as for open). A command that
//     runs in the foreground has ended with the step, whatever it did.
//
// Shells reached through sh -c (and bash, dash, ...) are looked into.

// DefaultWindowWait is Controller.WindowWait's default: OSWorld's runner
// sleeps 60 s after a reset, so the wait never costs more than it does.
const DefaultWindowWait = 60 * time.Second

// WindowWaiter watches the guest's top-level windows for Controller.
type WindowWaiter interface {
	// MarkWindows notes, just before a step that starts a program runs,
	// the windows the guest shows and the moment its processes count
	// from.
	MarkWindows(ctx context.Context) (WindowMark, error)
	// WaitWindow waits, at most max, until a window want counts has
	// mapped.
	WaitWindow(ctx context.Context, mark WindowMark, want WantedWindow, max time.Duration) (WindowSeen, error)
}

// WindowMark is what MarkWindows noted; only the waiter reads it.
type WindowMark json.RawMessage

// WantedWindow says which windows end WaitWindow. A top-level window the
// guest did not show at the mark counts when it has mapped and belongs
// to a process started since the mark (the program or anything it
// started) or to no known process (no _NET_WM_PID).
type WantedWindow struct {
	// AnyProcess: a new window of any process counts (the step handed
	// its file or program to a process that may run already).
	AnyProcess bool `json:"any"`
	// Title: a shown window whose title contains it counts too, new or
	// not: a file opened in a window that was there (a browser's tab), as
	// OSWorld's server looks for the window of a file it opened.
	Title string `json:"title,omitempty"`
}

// WindowSeen is what WaitWindow saw.
type WindowSeen struct {
	// Window is the window that mapped; nil when max passed first.
	Window *SeenWindow `json:"window"`
	// Others are new windows that did not count (another program's).
	Others []SeenWindow `json:"others"`
	// Waited is how long the wait took.
	Waited time.Duration `json:"-"`
}

// SeenWindow is a top-level window the guest showed.
type SeenWindow struct {
	ID    string `json:"id"`
	PID   int    `json:"pid"`
	Class string `json:"class"`
	Title string `json:"title"`
}

func (w SeenWindow) String() string {
	return w.Title + " (" + w.Class + ", " + w.ID + ")"
}

// program is what a setup step starts, which the step then waits for.
type program struct {
	// name is the program (its command's word, or the opened path);
	// command the whole command, for logs.
	name, command string
	// want is the window the step waits for.
	want WantedWindow
}

// windowless are programs OSWorld's setups launch that never map a
// window: their step does not wait.
var windowless = []string{"socat"}

// shells are the programs whose -c script startedProgram looks into.
var shells = []string{"sh", "bash", "dash", "zsh", "ksh"}

// startedProgram says whether step s starts a program whose window its
// step waits for, and which.
func startedProgram(s desktop.SetupStep) (program, bool) {
	switch s.Type {
	case "open":
		var p pathParams
		if json.Unmarshal(s.Parameters, &p) != nil || p.Path == "" {
			return program{}, false
		}
		return program{name: p.Path, command: p.Path, want: WantedWindow{AnyProcess: true, Title: path.Base(p.Path)}}, true
	case "launch":
		var p launchParams
		if json.Unmarshal(s.Parameters, &p) != nil || p.Command.empty() {
			return program{}, false
		}
		pr := launched(argvOf(p.Command, bool(p.Shell)))
		pr.command = clipCommand(p.Command.String())
		return pr, !slices.Contains(windowless, pr.name)
	case "execute", "command":
		var p executeParams
		if json.Unmarshal(s.Parameters, &p) != nil || p.Command.empty() {
			return program{}, false
		}
		pr, ok := backgrounded(argvOf(p.Command, bool(p.Shell)))
		pr.command = clipCommand(p.Command.String())
		return pr, ok && !slices.Contains(windowless, pr.name)
	}
	return program{}, false
}

// argvOf is the argv a guest server runs for cmd: a shell line becomes
// sh -c LINE (a list with shell runs its first string as the line, as
// Python's Popen does); a line without one is split at spaces, as OSWorld
// does.
func argvOf(cmd command, shell bool) []string {
	switch {
	case shell && cmd.isList:
		return []string{"sh", "-c", cmd.args[0]}
	case shell:
		return []string{"sh", "-c", cmd.line}
	case cmd.isList:
		return cmd.args
	}
	return strings.Fields(cmd.line)
}

// launched is the program argv leaves running when it is started and not
// waited for: its command word, or, for a shell's script, its last
// command's (the one the earlier ones run before, often with exec).
func launched(argv []string) program {
	i := commandWord(argv)
	if i < 0 {
		return program{}
	}
	word := path.Base(argv[i])
	if script, ok := shellScript(argv[i:]); ok {
		if cmds := shellCommands(script); len(cmds) > 0 {
			return launched(cmds[len(cmds)-1].words)
		}
	}
	return program{name: word, want: WantedWindow{AnyProcess: handsOff(argv[i:])}}
}

// backgrounded is the first program argv leaves running after it ended:
// one a shell runs in the background, or one an opener hands to another
// process.
func backgrounded(argv []string) (program, bool) {
	i := commandWord(argv)
	if i < 0 {
		return program{}, false
	}
	if handsOff(argv[i:]) {
		return program{name: path.Base(argv[i]), want: WantedWindow{AnyProcess: true}}, true
	}
	script, ok := shellScript(argv[i:])
	if !ok {
		return program{}, false
	}
	cmds := shellCommands(script)
	for i, c := range cmds {
		if c.job > 0 {
			// What the job leaves running: its last pipeline, named by
			// its first command ((sleep 3; exec vlc) &, vlc | cat &).
			last := i
			for j := i; j < len(cmds) && cmds[j].job == c.job; j++ {
				if !cmds[j].piped {
					last = j
				}
			}
			if pr := launched(cmds[last].words); pr.name != "" {
				return pr, true
			}
			continue
		}
		if pr, ok := backgrounded(c.words); ok {
			return pr, true
		}
	}
	return program{}, false
}

// handsOff reports whether argv (from its command word) hands a file or
// program to another process and returns: an opener, or a GNOME
// application whose instance may run already as a service (its window is
// then that process's).
func handsOff(argv []string) bool {
	switch path.Base(argv[0]) {
	case "xdg-open", "gtk-launch", "gnome-open", "kde-open", "gnome-terminal", "nautilus":
		return true
	case "gio":
		return len(argv) > 1 && argv[1] == "open"
	}
	return false
}

// shellScript returns the script of a shell's -c.
func shellScript(argv []string) (string, bool) {
	if !slices.Contains(shells, path.Base(argv[0])) {
		return "", false
	}
	for i := 1; i < len(argv)-1; i++ {
		a := argv[i]
		if !strings.HasPrefix(a, "-") || strings.HasPrefix(a, "--") {
			return "", false
		}
		if strings.Contains(a, "c") {
			return argv[i+1], true
		}
	}
	return "", false
}

// wrappers are commands that run the command after them (and their
// options that take a value).
var wrappers = map[string][]string{
	"exec": nil, "env": {"-u", "-C"}, "nohup": nil, "setsid": nil, "nice": {"-n"},
	"command": nil, "sudo": {"-u", "-g", "-p"},
}

// commandWord returns the index of the word argv runs: after variable
// assignments and wrappers (env, nohup, exec, ...) with their options; -1
// for none.
func commandWord(argv []string) int {
	for i := 0; i < len(argv); i++ {
		w := argv[i]
		if assignment(w) {
			continue
		}
		opts, ok := wrappers[path.Base(w)]
		if !ok {
			return i
		}
		for i+1 < len(argv) && strings.HasPrefix(argv[i+1], "-") {
			i++
			if slices.Contains(opts, argv[i]) {
				i++
			}
		}
	}
	return -1
}

// assignment reports whether w is a shell variable assignment (NAME=...).
func assignment(w string) bool {
	name, _, ok := strings.Cut(w, "=")
	if !ok || name == "" {
		return false
	}
	for i, r := range name {
		if !(r == '_' || r >= 'A' && r <= 'Z' || r >= 'a' && r <= 'z' || i > 0 && r >= '0' && r <= '9') {
			return false
		}
	}
	return true
}

// simpleCommand is a simple command of a shell script.
type simpleCommand struct {
	words []string
	// job numbers, from 1, the & that runs it in the background (its
	// pipeline or group ends with it); 0 for the foreground.
	job int
	// piped: its input is the pipe from the command before.
	piped bool
}

// shellCommands splits a shell script into its simple commands. It reads
// quotes, backslashes, comments, separators (; & && || | newline) and
// groups ( ), enough to tell a background & from the rest; redirections
// (2>&1, &>file) and their targets are dropped.
func shellCommands(script string) []simpleCommand {
	var (
		cmds     []simpleCommand
		cur      []string
		word     strings.Builder
		inWord   bool
		redirect bool  // the next word is a redirection's target
		pipeline = 0   // index in cmds of the current pipeline's first command
		groups   []int // indices in cmds where open groups start
		closed   = -1  // start of the group a ")" just closed
		jobs     int
		piped    bool // the next command reads a pipe
	)
	endWord := func() {
		if !inWord {
			return
		}
		if redirect {
			redirect = false
		} else {
			cur = append(cur, word.String())
		}
		word.Reset()
		inWord = false
	}
	endCommand := func() {
		endWord()
		if len(cur) > 0 {
			cmds = append(cmds, simpleCommand{words: cur, piped: piped})
			cur = nil
			closed = -1
		}
		piped = false
	}
	rs := []rune(script)
	for i := 0; i < len(rs); i++ {
		r := rs[i]
		next := func(want rune) bool { return i+1 < len(rs) && rs[i+1] == want }
		switch {
		case r == '\\' && i+1 < len(rs):
			i++
			if rs[i] != '\n' {
				word.WriteRune(rs[i])
				inWord = true
			}
		case r == '\'':
			inWord = true
			for i++; i < len(rs) && rs[i] != '\''; i++ {
				word.WriteRune(rs[i])
			}
		case r == '"':
			inWord = true
			for i++; i < len(rs) && rs[i] != '"'; i++ {
				if rs[i] == '\\' && i+1 < len(rs) && strings.ContainsRune("\"\\$`", rs[i+1]) {
					i++
				}
				word.WriteRune(rs[i])
			}
		case r == '#' && !inWord:
			for i < len(rs) && rs[i] != '\n' {
				i++
			}
			i--
		case r == ' ' || r == '\t':
			endWord()
		case r == '>' || r == '<':
			// A descriptor number before it is no word of the command.
			if inWord && isDigits(word.String()) {
				word.Reset()
				inWord = false
			}
			endWord()
			for next('>') || next('&') || next('|') {
				i++
			}
			redirect = true
		case r == '&' && next('>'):
			endWord()
			for next('>') {
				i++
			}
			redirect = true
		case r == '&' && next('&'), r == '|' && next('|'):
			i++
			endCommand()
			pipeline = len(cmds)
		case r == '|':
			if next('&') {
				i++
			}
			endCommand()
			piped = true
		case r == '&':
			endCommand()
			from := pipeline
			if closed >= 0 {
				from = closed
			}
			jobs++
			for j := from; j < len(cmds); j++ {
				cmds[j].job = jobs
			}
			pipeline, closed = len(cmds), -1
		case r == ';' || r == '\n':
			endCommand()
			pipeline = len(cmds)
		case r == '(':
			endCommand()
			groups = append(groups, len(cmds))
			pipeline = len(cmds)
		case r == ')':
			endCommand()
			if n := len(groups); n > 0 {
				closed, groups = groups[n-1], groups[:n-1]
				pipeline = closed
			}
		default:
			word.WriteRune(r)
			inWord = true
		}
	}
	endCommand()
	return cmds
}

func isDigits(s string) bool {
	return s != "" && strings.Trim(s, "0123456789") == ""
}

// clipCommand shortens a command for a log line.
func clipCommand(s string) string {
	s = strings.TrimSpace(s)
	if r := []rune(s); len(r) > 160 {
		return string(r[:160]) + "…"
	}
	return s
}
