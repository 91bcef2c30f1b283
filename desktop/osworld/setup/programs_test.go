package setup

import (
	"encoding/json"
	"testing"

	"github.com/google/go-cmp/cmp"

	"legato/rl/desktop"
)

// TestStartedProgram holds the rule of which setup steps wait for a
// program's window, and which program they name.
func TestStartedProgram(t *testing.T) {
	type want struct {
		Name  string
		Any   bool
		Title string
	}
	wait := func(name string) *want { return &want{Name: name} }
	handed := func(name string) *want { return &want{Name: name, Any: true} }
	for _, tc := range []struct {
		name, typ, params string
		want              *want // nil: the step does not wait
	}{
		// launch: the program it leaves running, unless it never shows a window.
		{"launch argv", "launch", `{"command":["google-chrome","--remote-debugging-port=1337"]}`, wait("google-chrome")},
		{"launch a path", "launch", `{"command":["/usr/bin/thunderbird"]}`, wait("thunderbird")},
		{"launch a line without shell (split at spaces)", "launch", `{"command":"gimp /home/user/a.png"}`, wait("gimp")},
		{"launch a shell line with a variable", "launch", `{"command":"VLC_VERBOSE=-1 vlc --no-audio '/home/user/Desktop/a b.mp4'","shell":true}`, wait("vlc")},
		{"launch through sh -c: its last command", "launch", `{"command":["sh","-c","sleep 3; exec xterm -title slow"]}`, wait("xterm")},
		{"launch through bash -lc with env", "launch", `{"command":["/bin/bash","-lc","cd /tmp && env -u X LANG=C nohup libreoffice --calc"]}`, wait("libreoffice")},
		{"launch a shell list (Popen runs its first string)", "launch", `{"command":["nice -n 5 gimp a.png"],"shell":true}`, wait("gimp")},
		{"launch xdg-open: any process's window", "launch", `{"command":["xdg-open","/home/user/a.docx"]}`, handed("xdg-open")},
		{"launch socat: no window", "launch", `{"command":["socat","tcp-listen:9222,fork","tcp:localhost:1337"]}`, nil},
		{"launch socat through a shell", "launch", `{"command":"exec socat tcp-listen:9222,fork tcp:localhost:1337","shell":true}`, nil},

		// open: the file goes to whatever opens it.
		{"open", "open", `{"path":"/home/user/a.xlsx"}`, &want{Name: "/home/user/a.xlsx", Any: true, Title: "a.xlsx"}},
		{"launch nautilus: a GNOME service's window", "launch", `{"command":["nautilus","/home/user/Desktop"]}`, handed("nautilus")},

		// execute and command: only what the command leaves running.
		{"execute in the foreground", "execute", `{"command":["python3","x.py"]}`, nil},
		{"execute a foreground shell line", "execute", `{"command":"mkdir -p /home/user/a && tar -xzf b.tgz -C /home/user/ 2>&1 | tail -n 3","shell":true}`, nil},
		{"redirections are not backgrounds", "command", `{"command":["/bin/bash","-c","make >log 2>&1; ls &>/dev/null; cat <&3 |& tee x"]}`, nil},
		{"a quoted & is no background", "execute", `{"command":"echo 'a & b' \"c & d\" e\\&f","shell":true}`, nil},
		{"a commented & is no background", "execute", `{"command":"true # vlc &","shell":true}`, nil},
		{"execute vlc &", "execute", `{"command":"vlc /home/user/a.mp4 >/dev/null 2>&1 &","shell":true}`, wait("vlc")},
		{"execute nohup ... & in sh -c", "execute", `{"command":["sh","-c","cd /home/user && nohup gimp a.png > /dev/null 2>&1 & echo started"]}`, wait("gimp")},
		{"execute a backgrounded group", "execute", `{"command":"(sleep 3; exec xterm -title slow) >/dev/null 2>&1 &","shell":true}`, wait("xterm")},
		{"execute a backgrounded pipeline", "execute", `{"command":"code a.txt | cat & wait_for_it","shell":true}`, wait("code")},
		{"execute a nested shell in the background", "execute", `{"command":["bash","-c","setsid sh -c 'sleep 1; exec vlc' &"]}`, wait("vlc")},
		{"execute a nested shell that backgrounds", "execute", `{"command":"sh -c 'thunderbird &'","shell":true}`, wait("thunderbird")},
		{"execute gnome-terminal (OSWorld's multi_apps)", "execute", `{"command":"export DBUS_SESSION_BUS_ADDRESS='unix:path=/run/user/1000/bus'\ngnome-terminal --maximize --working-directory=/home/user/","shell":true}`, handed("gnome-terminal")},
		{"execute gio open", "execute", `{"command":["gio","open","/home/user/a.pdf"]}`, handed("gio")},
		{"execute gio trash", "execute", `{"command":["gio","trash","/home/user/a.webp"]}`, nil},
		{"execute socat &", "execute", `{"command":"socat tcp-listen:9222,fork tcp:localhost:1337 &","shell":true}`, nil},

		// Steps that start no program, or wait themselves.
		{"execute_with_verification", "execute_with_verification", `{"command":["gedit"],"verification":{"window_exists":"gedit"}}`, nil},
		{"sleep", "sleep", `{"seconds":1}`, nil},
		{"activate_window", "activate_window", `{"window_name":"a"}`, nil},
	} {
		pr, ok := startedProgram(desktop.SetupStep{Type: tc.typ, Parameters: json.RawMessage(tc.params)})
		var got *want
		if ok {
			got = &want{Name: pr.name, Any: pr.want.AnyProcess, Title: pr.want.Title}
			if pr.command == "" {
				t.Errorf("%s: no command to name in a warning", tc.name)
			}
		}
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("%s: %s %s (-want +got):\n%s", tc.name, tc.typ, tc.params, diff)
		}
	}
}

func TestShellCommands(t *testing.T) {
	type cmd struct {
		Words []string
		Job   int
		Piped bool
	}
	for _, tc := range []struct {
		script string
		want   []cmd
	}{
		{`a b; c`, []cmd{{[]string{"a", "b"}, 0, false}, {[]string{"c"}, 0, false}}},
		{`a && b & c &`, []cmd{{[]string{"a"}, 0, false}, {[]string{"b"}, 1, false}, {[]string{"c"}, 2, false}}},
		{`x 2>&1 >/dev/null | y &`, []cmd{{[]string{"x"}, 1, false}, {[]string{"y"}, 1, true}}},
		{`( a; b ) & c`, []cmd{{[]string{"a"}, 1, false}, {[]string{"b"}, 1, false}, {[]string{"c"}, 0, false}}},
		{`echo "a \"&\" b" 'c;d' e\ f`, []cmd{{[]string{"echo", `a "&" b`, "c;d", "e f"}, 0, false}}},
		{"a\nb # c & d\ne &>x", []cmd{{[]string{"a"}, 0, false}, {[]string{"b"}, 0, false}, {[]string{"e"}, 0, false}}},
	} {
		var got []cmd
		for _, c := range shellCommands(tc.script) {
			got = append(got, cmd{c.words, c.job, c.piped})
		}
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("shellCommands(%q) (-want +got):\n%s", tc.script, diff)
		}
	}
}
