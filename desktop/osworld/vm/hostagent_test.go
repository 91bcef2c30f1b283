package vm

import (
	"bufio"
	"errors"
	"io"
	"strings"
	"testing"

	"golang.org/x/crypto/ssh"
)

// A command started on a host runs over the host's SSH connection with
// its words quoted for the login shell; its stdin and stdout are the
// channel's, and closing its stdin is the EOF it ends on.
func TestHostCommandOverSSH(t *testing.T) {
	keyFile, pub := newKeyFile(t, "")
	srv := newSSHServer(t, pub)
	got := make(chan string, 1)
	srv.setExec(func(command string, stdin io.Reader, stdout io.Writer) int {
		got <- command
		io.Copy(stdout, stdin) // until the fleet's EOF
		io.WriteString(stdout, "bye\n")
		return 3
	})
	h := sshHost(t, srv, keyFile, srv.knownHosts(t), "/nonexistent", noDefaults, nil)
	cmd, err := h.StartCommand(t.Context(), []string{"legato", "rl", "host-agent", "--fork-dir", "/dev/shm/it's here; rm -rf /"})
	if err != nil {
		t.Fatal(err)
	}
	defer cmd.Close()
	if want := `'legato' 'rl' 'host-agent' '--fork-dir' '/dev/shm/it'\''s here; rm -rf /'`; <-got != want {
		t.Errorf("the host ran a command other than %s", want)
	}
	out := bufio.NewReader(cmd.Stdout())
	io.WriteString(cmd.Stdin(), "ping\n")
	if line, err := out.ReadString('\n'); line != "ping\n" {
		t.Fatalf("read %q, %v", line, err)
	}
	cmd.Stdin().Close()
	if line, err := out.ReadString('\n'); line != "bye\n" {
		t.Fatalf("after EOF, read %q, %v", line, err)
	}
	var exit *ssh.ExitError
	if err := cmd.Wait(); !errors.As(err, &exit) || exit.ExitStatus() != 3 {
		t.Errorf("wait: %v, want exit status 3", err)
	}
}

// A local host has no SSH connection to run a command over.
func TestHostCommandLocalRefused(t *testing.T) {
	h, err := OpenHost(HostSpec{URI: DefaultURI}, Config{}, HostOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if _, err := h.StartCommand(t.Context(), []string{"true"}); err == nil || !strings.Contains(err.Error(), "this machine") {
		t.Errorf("StartCommand on a local host: %v", err)
	}
}

func TestDomainRefValidate(t *testing.T) {
	ok := DomainRef{Name: "legato-0-0a0b0c0d", Overlay: "/o.qcow2", Base: "/b.qcow2", MemoryMiB: 1536}
	for _, tc := range []struct {
		name string
		edit func(*DomainRef)
		want string
	}{
		{"whole", func(*DomainRef) {}, ""},
		{"default guest ports", func(d *DomainRef) { d.GuestPort = 0 }, ""},
		{"no name", func(d *DomainRef) { d.Name = "" }, "domain name is empty"},
		{"no overlay", func(d *DomainRef) { d.Overlay = "" }, "overlay path is empty"},
		{"no base", func(d *DomainRef) { d.Base = "" }, "base image path is empty"},
		{"no memory", func(d *DomainRef) { d.MemoryMiB = 0 }, "memory_mib 0"},
		{"bad guest port", func(d *DomainRef) { d.VLCPort = 70000 }, "guest port 70000"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := ok
			tc.edit(&d)
			err := d.Validate()
			if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Errorf("Validate: %v, want %q", err, tc.want)
			}
		})
	}
}

func TestCheckForkPlace(t *testing.T) {
	for _, tc := range []struct{ dir, prefix, want string }{
		{"", "", ""},
		{"/dev/shm/legato-fork", "legato-", ""},
		{"shm", "legato-", `fork dir "shm": want an absolute path`},
		{"/dev/shm/x", "../x", "name prefix"},
	} {
		err := CheckForkPlace(tc.dir, tc.prefix)
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("CheckForkPlace(%q, %q): %v, want %q", tc.dir, tc.prefix, err, tc.want)
		}
	}
}
