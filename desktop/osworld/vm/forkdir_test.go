package vm

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

func modeOf(t *testing.T, p string) (os.FileMode, *syscall.Stat_t) {
	t.Helper()
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Mode(), fi.Sys().(*syscall.Stat_t)
}

// TestEnsureForkDir: legato makes the fork directory itself, 0700, and
// 0750 to QEMU's group once a template needs it; a directory of its own
// that others may only read is narrowed.
func TestEnsureForkDir(t *testing.T) {
	base := t.TempDir()
	dir := filepath.Join(base, "shm", "legato-fork")
	if err := ensureForkDir(dir, -1); err != nil {
		t.Fatal(err)
	}
	if m, st := modeOf(t, dir); !m.IsDir() || m.Perm() != 0o700 || int(st.Uid) != os.Geteuid() {
		t.Errorf("made %v owned by %d; want a directory 0700 of uid %d", m, st.Uid, os.Geteuid())
	}
	gid := os.Getegid()
	if os.Geteuid() == 0 {
		gid = 65534 // another group, as QEMU's is
	}
	if err := ensureForkDir(dir, gid); err != nil {
		t.Fatal(err)
	}
	if m, st := modeOf(t, dir); m.Perm() != forkDirMode || int(st.Gid) != gid {
		t.Errorf("for QEMU's group: %v group %d; want %#o group %d", m, st.Gid, forkDirMode, gid)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := ensureForkDir(dir, -1); err != nil {
		t.Fatal(err)
	}
	if m, _ := modeOf(t, dir); m.Perm()&0o007 != 0 {
		t.Errorf("a fork dir of ours others could read: %v after the check; want it narrowed", m)
	}
}

// TestForkDirRefused: a fork directory another user could have made or
// can write in is never used, nor swept: another owner, a mode that lets
// others write, a symlink in its place (its target untouched), a parent
// or an ancestor where others could swap it (writable by them, theirs, or
// a symlink).
func TestForkDirRefused(t *testing.T) {
	root := os.Geteuid() == 0
	cases := []struct {
		name   string
		make   func(t *testing.T, dir string)
		asRoot bool
	}{
		{"another owner", func(t *testing.T, dir string) {
			mustMkdir(t, dir, 0o700)
			if err := os.Chown(dir, 65534, 65534); err != nil {
				t.Fatal(err)
			}
		}, true},
		{"others may write", func(t *testing.T, dir string) {
			mustMkdir(t, dir, 0o700)
			if err := os.Chmod(dir, 0o777); err != nil {
				t.Fatal(err)
			}
		}, false},
		{"group may write", func(t *testing.T, dir string) {
			mustMkdir(t, dir, 0o700)
			if err := os.Chmod(dir, 0o770); err != nil {
				t.Fatal(err)
			}
		}, false},
		{"symlink", func(t *testing.T, dir string) {
			target := filepath.Join(filepath.Dir(dir), "elsewhere")
			mustMkdir(t, target, 0o700)
			if err := os.Symlink(target, dir); err != nil {
				t.Fatal(err)
			}
		}, false},
		{"parent others may write", func(t *testing.T, dir string) {
			if err := os.Chmod(filepath.Dir(dir), 0o777); err != nil {
				t.Fatal(err)
			}
		}, false},
		{"parent of another user", func(t *testing.T, dir string) {
			if err := os.Chown(filepath.Dir(dir), 65534, 65534); err != nil {
				t.Fatal(err)
			}
		}, true},
		{"ancestor others may write", func(t *testing.T, dir string) {
			if err := os.Chmod(filepath.Dir(filepath.Dir(dir)), 0o777); err != nil {
				t.Fatal(err)
			}
		}, false},
		{"symlinked parent", func(t *testing.T, dir string) {
			parent := filepath.Dir(dir)
			real := filepath.Join(filepath.Dir(parent), "real-shm")
			if err := os.Rename(parent, real); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(real, parent); err != nil {
				t.Fatal(err)
			}
		}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if tc.asRoot && !root {
				t.Skip("needs root to give the directory to another user")
			}
			parent := filepath.Join(t.TempDir(), "shm")
			mustMkdir(t, parent, 0o755)
			dir := filepath.Join(parent, "legato-fork")
			tc.make(t, dir)
			before, _ := os.ReadDir(filepath.Join(parent, "elsewhere"))
			if err := ensureForkDir(dir, -1); !errors.Is(err, ErrForkDir) {
				t.Errorf("ensureForkDir: %v; want ErrForkDir", err)
			}
			if _, err := ForkLeftovers(dir, "legato-"); !errors.Is(err, ErrForkDir) {
				t.Errorf("ForkLeftovers: %v; want ErrForkDir", err)
			}
			if _, err := SweepForks(dir, "legato-"); !errors.Is(err, ErrForkDir) {
				t.Errorf("SweepForks: %v; want ErrForkDir", err)
			}
			if after, _ := os.ReadDir(filepath.Join(parent, "elsewhere")); len(after) != len(before) {
				t.Errorf("the symlink's target changed: %d entries, %d before", len(after), len(before))
			}
		})
	}
}

// TestSweepSkipsSpecialLocks: a FIFO (or a symlink) named lock in a
// template directory neither blocks the sweep nor counts as a live run's
// lock; the sweep removes the directory without following anything.
func TestSweepSkipsSpecialLocks(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "legato-fork")
	if err := ensureForkDir(dir, -1); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(dir, "legato-fork-0000000a")
	mustMkdir(t, fifo, 0o750)
	if err := syscall.Mkfifo(filepath.Join(fifo, "lock"), 0o600); err != nil {
		t.Fatal(err)
	}
	outside := filepath.Join(t.TempDir(), "precious")
	if err := os.WriteFile(outside, []byte("keep\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "legato-fork-0000000b")
	mustMkdir(t, link, 0o750)
	if err := os.Symlink(outside, filepath.Join(link, "lock")); err != nil {
		t.Fatal(err)
	}
	type result struct {
		left []ForkLeftover
		err  error
	}
	done := make(chan result, 1)
	go func() {
		left, err := SweepForks(dir, "legato-")
		done <- result{left, err}
	}()
	// A sweep that opened the FIFO would block here until the test's
	// deadline.
	r := <-done
	if r.err != nil || len(r.left) != 2 {
		t.Fatalf("SweepForks: %+v, %v; want both directories swept", r.left, r.err)
	}
	for _, d := range []string{fifo, link} {
		if _, err := os.Lstat(d); !os.IsNotExist(err) {
			t.Errorf("%s left after the sweep: %v", d, err)
		}
	}
	if b, err := os.ReadFile(outside); err != nil || string(b) != "keep\n" {
		t.Errorf("the symlink's target: %q, %v; want it untouched", b, err)
	}
}

// TestLockDirRefusesPlantedFiles: the lock and the state are never
// written through a symlink.
func TestLockDirRefusesPlantedFiles(t *testing.T) {
	dir := t.TempDir()
	victim := filepath.Join(t.TempDir(), "victim")
	if err := os.WriteFile(victim, []byte("root's\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(victim, filepath.Join(dir, "lock")); err != nil {
		t.Fatal(err)
	}
	if f, err := lockDir(dir); err == nil {
		f.Close()
		t.Error("lockDir took a symlink for its lock")
	}
	if err := os.Symlink(victim, filepath.Join(dir, "state")); err != nil {
		t.Fatal(err)
	}
	if err := writeFileAs(filepath.Join(dir, "state"), []byte("state"), -1); err == nil {
		t.Error("writeFileAs wrote through a symlink")
	}
	if b, _ := os.ReadFile(victim); string(b) != "root's\n" {
		t.Errorf("the symlink's target became %q", b)
	}
}

func mustMkdir(t *testing.T, dir string, mode os.FileMode) {
	t.Helper()
	if err := os.Mkdir(dir, mode); err != nil {
		t.Fatal(err)
	}
}
