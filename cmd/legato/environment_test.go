package main

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"legato/rl/desktop/osworld"
	"legato/rl/desktop/osworld/grade"
	"legato/rl/desktop/osworld/vm"
	"legato/rl/schema"
)

// TestCollectResumeOtherFakeKnobs continues a batch with another
// --fake-success, --fake-seed, --fake-flaky or --fake-solved-at-start: each is refused with exit 2,
// naming the knob and both values, and changes nothing; with the same
// knobs the batch continues.
func TestCollectResumeOtherFakeKnobs(t *testing.T) {
	out := filepath.Join(t.TempDir(), "run")
	args := []string{"rl", "collect", "--out", out, "--fake-speed", "none", "--desktops", "2", "--group", "1"}
	var stderr bytes.Buffer
	if err := run(t.Context(), args, &bytes.Buffer{}, &stderr); err != nil {
		t.Fatalf("collect: %v\n%s", err, stderr.String())
	}
	before, err := os.ReadFile(filepath.Join(out, schema.BatchFile))
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		flags []string
		want  string
	}{
		{[]string{"--fake-success", "0.9"}, "--fake-success 0.5, not 0.9"},
		{[]string{"--fake-seed", "2"}, "--fake-seed 1, not 2"},
		{[]string{"--fake-flaky", "demo-write-note"}, "--fake-flaky unset, not demo-write-note"},
		{[]string{"--fake-solved-at-start", "demo-dark-mode"}, "--fake-solved-at-start unset, not demo-dark-mode"},
	} {
		err := run(t.Context(), append(slices.Clone(args), tt.flags...), &bytes.Buffer{}, &bytes.Buffer{})
		if err == nil || !strings.Contains(err.Error(), "holds another batch: "+tt.want) {
			t.Errorf("resume with %s: %v; want a refusal naming %q", tt.flags, err, tt.want)
		}
		if code := exitCode(t.Context(), err, io.Discard); code != 2 {
			t.Errorf("resume with %s exits %d, want 2 (usage)", tt.flags, code)
		}
	}
	after, err := os.ReadFile(filepath.Join(out, schema.BatchFile))
	if err != nil || !bytes.Equal(before, after) {
		t.Errorf("a refused resume changed batch.json (%v):\n%s\nnow\n%s", err, before, after)
	}
	stderr.Reset()
	if err := run(t.Context(), args, &bytes.Buffer{}, &stderr); err != nil {
		t.Errorf("resume with the same knobs: %v\n%s", err, stderr.String())
	}
}

// TestOSWorldEnvironment describes VM desktops by their image's identity
// and grader: another image file in the same place, or another grader
// mode, is another environment.
func TestOSWorldEnvironment(t *testing.T) {
	image := filepath.Join(t.TempDir(), "base.qcow2")
	if err := os.WriteFile(image, []byte("one image"), 0o666); err != nil {
		t.Fatal(err)
	}
	cfg := osworld.Config{}
	cfg.VM.BaseImage = image
	cfg.VM.HashCache = "-" // no cache of hashes in the user's directory
	cfg.Grade.Mode = grade.NativeOnly
	// The image files as the pool hashes them at its start.
	images := func() []vm.ImageFile {
		files, err := vm.ImageFiles(t.Context(), cfg.VM)
		if err != nil {
			t.Fatal(err)
		}
		return files
	}
	first := osworldEnvironment(cfg, images())
	if first.Backend != "osworld" || !strings.HasPrefix(first.Knobs["image"], image+" (9 bytes") || first.Knobs["grader"] != "native-only" {
		t.Errorf("environment %+v; want the image's path and size, and the grader", first)
	}
	if err := os.WriteFile(image, []byte("another image"), 0o666); err != nil {
		t.Fatal(err)
	}
	if again := osworldEnvironment(cfg, images()); again.Knobs["image"] == first.Knobs["image"] {
		t.Errorf("an image rewritten in place has the same identity %q", again.Knobs["image"])
	}
	cfg.Grade.Mode = grade.PreferBridge
	if again := osworldEnvironment(cfg, images()); again.Knobs["grader"] == first.Knobs["grader"] {
		t.Errorf("another grader mode is the same knob %q", again.Knobs["grader"])
	}
	cfg.Guests = []osworld.GuestAddr{{}}
	if g := osworldEnvironment(cfg, nil); g.Knobs["image"] == first.Knobs["image"] {
		t.Errorf("guests given by URL: image %q, want them told from VMs", g.Knobs["image"])
	}
}
