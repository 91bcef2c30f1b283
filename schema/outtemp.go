package schema

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// An output file (an export, a profile) is written outside any run's lock,
// so a writer that is killed leaves its hidden temp file next to the
// output. Each temp file is flocked by its writer for as long as it lives,
// and the next writer of the same output removes the temp files of that
// output that no live process holds: the lock is released by the kernel
// when its holder dies, so an unlocked temp file is a dead writer's.

// outputTempPrefix is the name prefix of the temp files of the output path.
func outputTempPrefix(path string) string { return "." + filepath.Base(path) + ".tmp-" }

// createOutputTemp creates the locked temp file of a write of path, after
// removing the temp files dead writers of path left.
func createOutputTemp(path string) (*os.File, error) {
	dir, prefix := filepath.Dir(path), outputTempPrefix(path)
	for range 100 {
		f, err := createTemp(dir, prefix)
		if err != nil {
			return nil, err
		}
		// A sweeper may take the lock of a file made but not locked yet and
		// remove it: then this lock fails, or the name no longer leads to
		// f. Either way, make another.
		if lockFile(f) == nil && sameFile(f, f.Name()) {
			sweepOutputTemps(dir, prefix, f.Name())
			return f, nil
		}
		f.Close()
	}
	return nil, &fs.PathError{Op: "createtemp", Path: filepath.Join(dir, prefix+"*"), Err: ErrLocked}
}

func sameFile(f *os.File, name string) bool {
	a, err := f.Stat()
	if err != nil {
		return false
	}
	b, err := os.Stat(name)
	return err == nil && os.SameFile(a, b)
}

// sweepOutputTemps removes the temp files named prefix* in dir, other than
// own, whose lock it can take. Where files cannot be locked (no flock) it
// removes nothing: it could not tell a live writer's file.
func sweepOutputTemps(dir, prefix, own string) {
	if !canLock {
		return
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return // best effort: the write itself goes on
	}
	for _, e := range entries {
		name := filepath.Join(dir, e.Name())
		if !strings.HasPrefix(e.Name(), prefix) || name == own || !e.Type().IsRegular() {
			continue
		}
		f, err := os.Open(name)
		if err != nil {
			continue
		}
		if lockFile(f) == nil && sameFile(f, name) {
			_ = os.Remove(name) // best effort: the next write tries again
		}
		f.Close()
	}
}
