package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"legato/rl/desktop/osworld"
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
	return &schema.Environment{Backend: "fake", Knobs: knobs}
}

// osworldEnvironment describes the osworld backend's desktops of cfg: the
// image they boot and how they are graded.
func osworldEnvironment(cfg osworld.Config) *schema.Environment {
	knobs := map[string]string{
		"grader": cfg.Grade.Mode.String(),
		"python": cfg.Grade.Python,
	}
	set := func(k, v string) {
		if v != "" {
			knobs[k] = v
		}
	}
	set("osworld", absPath(cfg.Grade.OSWorldDir))
	if len(cfg.Guests) > 0 {
		// Guests that already run: their image is theirs, not known here.
		knobs["image"] = "none (--guest-url guests)"
	} else {
		set("image", fileIdentity(cfg.VM.BaseImage))
		set("kernel", fileIdentity(cfg.VM.Kernel))
		set("initrd", fileIdentity(cfg.VM.Initrd))
		set("cmdline", cfg.VM.Cmdline)
	}
	return &schema.Environment{Backend: "osworld", Knobs: knobs}
}

// fileIdentity names a file by its absolute path, size and modification
// time: an image rebuilt or replaced in place is another one. Hashing a
// multi-gigabyte image at every start would cost minutes.
func fileIdentity(path string) string {
	if path == "" {
		return ""
	}
	path = absPath(path)
	st, err := os.Stat(path)
	if err != nil {
		return path
	}
	return fmt.Sprintf("%s (%d bytes, modified %s)", path, st.Size(), st.ModTime().UTC().Format(time.RFC3339))
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
