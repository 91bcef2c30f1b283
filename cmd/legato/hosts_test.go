package main

import (
	"bytes"
	"errors"
	"path/filepath"
	"strings"
	"testing"
)

// TestHostsListsDownHost: a host that does not answer is listed as down
// with why, and makes the exit status 1 (not a usage error).
func TestHostsListsDownHost(t *testing.T) {
	img := testImageDir(t)
	sock := filepath.Join(t.TempDir(), "none.sock")
	var out bytes.Buffer
	err := new(hostsCommand).Run(t.Context(), []string{"--image", img, "--host", "qemu+unix:///system?socket=" + sock + ",desktops=3,name=gone"}, &out, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "host gone is not ready") {
		t.Fatalf("hosts with a dead host: %v; want it named as not ready", err)
	}
	var u *usageError
	if errors.As(err, &u) {
		t.Errorf("a dead host is a usage error: %v", err)
	}
	lines := strings.Split(out.String(), "\n")
	if len(lines) < 3 || !strings.HasPrefix(lines[0], "HOST") ||
		strings.Join(strings.Fields(lines[1]), " ") != "gone down 3 - - - - -" || !strings.Contains(lines[2], sock) {
		t.Errorf("hosts output:\n%s", out.String())
	}
}

// TestHostsFromDNS: hosts resolves --hosts-from once and lists each
// address the name has (localhost: from /etc/hosts, at a port where
// nothing listens) with the flag's cap.
func TestHostsFromDNS(t *testing.T) {
	img := testImageDir(t)
	var out bytes.Buffer
	err := new(hostsCommand).Run(t.Context(), []string{"--image", img, "--hosts-from", "dns:localhost:1,user=legato,desktops=3"}, &out, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "host 127.0.0.1 is not ready") {
		t.Fatalf("hosts from localhost: %v; want 127.0.0.1 named as not ready", err)
	}
	var row string
	for _, line := range strings.Split(out.String(), "\n") {
		if strings.HasPrefix(line, "127.0.0.1 ") {
			row = strings.Join(strings.Fields(line), " ")
		}
	}
	if row != "127.0.0.1 down 3 - - - - -" || !strings.Contains(out.String(), "legato@127.0.0.1:1") {
		t.Errorf("hosts output:\n%s", out.String())
	}
}

func TestHostsUsage(t *testing.T) {
	img := testImageDir(t)
	for _, tt := range []struct {
		args []string
		want string
	}{
		{nil, "--image"},
		{[]string{"--image", img, "upload"}, "the only one is sync"},
		{[]string{"--image", img, "--prune"}, "--prune goes with sync"},
		{[]string{"--image", img, "--host", "qemu+ssh://h/system?no_verify=1"}, "-host"},
		{[]string{"--image", img, "--host", "qemu:///system", "--hosts-from", "dns:localhost"}, "give the hosts one way"},
		{[]string{"--image", img, "--hosts-from", "dns:localhost,every=1"}, "every=1: want a duration"},
	} {
		err := new(hostsCommand).Run(t.Context(), tt.args, &bytes.Buffer{}, &bytes.Buffer{})
		var u *usageError
		if !errors.As(err, &u) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("hosts %q: %v; want a usage error about %q", tt.args, err, tt.want)
		}
	}
}
