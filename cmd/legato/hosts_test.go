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
	} {
		err := new(hostsCommand).Run(t.Context(), tt.args, &bytes.Buffer{}, &bytes.Buffer{})
		var u *usageError
		if !errors.As(err, &u) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("hosts %q: %v; want a usage error about %q", tt.args, err, tt.want)
		}
	}
}
