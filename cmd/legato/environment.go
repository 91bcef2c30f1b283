package main

import (
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"legato/rl/desktop/osworld"
	"legato/rl/desktop/osworld/vm"
	"legato/rl/schema"
)

// The environment of a batch is what batch.json records of its desktops
// (schema.Environment): the backend and each flag of it that changes what
// an attempt sees or how it is graded, so that continuing the batch with
// another value is refused instead of mixing two reward distributions in
// a group. Flags that change only speed or how a desktop gets to the same
// state (--fake-speed, --no-fast-reset, --no-golden, --no-executor,
// --vcpus...) are not recorded: changing them between runs is the point
// of having them.

// fakeEnvironment describes the fake backend's desktops.
func fakeEnvironment(ff fakeFlags) *schema.Environment {
	knobs := map[string]string{
		"fake-seed":    strconv.FormatUint(ff.seed, 10),
		"fake-success": strconv.FormatFloat(ff.success, 'g', -1, 64),
	}
	if len(ff.flaky) > 0 {
		knobs["fake-flaky"] = strings.Join(slices.Compact(slices.Sorted(slices.Values(ff.flaky))), ",")
	}
	if len(ff.solved) > 0 {
		knobs["fake-solved-at-start"] = strings.Join(slices.Compact(slices.Sorted(slices.Values(ff.solved))), ",")
	}
	return &schema.Environment{Backend: "fake", Knobs: knobs}
}

// osworldEnvironment describes the osworld backend's desktops of cfg: the
// image files they boot (images, hashed by the pool) and how they are
// graded.
func osworldEnvironment(cfg osworld.Config, images []vm.ImageFile) *schema.Environment {
	knobs := map[string]string{
		"grader": cfg.Grade.Mode.String(),
		"python": cfg.Grade.Python,
	}
	if dir := absPath(cfg.Grade.OSWorldDir); dir != "" {
		knobs["osworld"] = dir
	}
	if len(cfg.Guests) > 0 {
		// Guests that already run: their image is theirs, not known here.
		knobs["image"] = "none (--guest-url guests)"
		return &schema.Environment{Backend: "osworld", Knobs: knobs}
	}
	// The files by content: an image rebuilt in place is another one, a
	// copy of the same bytes is not.
	flag := map[string]string{vm.RoleBase: "image", vm.RoleKernel: "kernel", vm.RoleInitrd: "initrd"}
	for _, f := range images {
		knobs[flag[f.Role]] = fmt.Sprintf("%s (%d bytes, sha256 %s)", absPath(f.Path), f.Size, f.SHA256)
	}
	if cfg.VM.Cmdline != "" {
		knobs["cmdline"] = cfg.VM.Cmdline
	}
	return &schema.Environment{Backend: "osworld", Knobs: knobs}
}

// absPath is path made absolute where it can be, so that the same file
// named from another directory is the same.
func absPath(path string) string {
	if path == "" {
		return ""
	}
	if abs, err := filepath.Abs(path); err == nil {
		return abs
	}
	return path
}
