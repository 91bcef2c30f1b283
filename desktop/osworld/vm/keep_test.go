package vm

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestSweepKept: a kept state whose writer died is removed; one being
// written, a whole one, and directories not made by Keep stay.
func TestSweepKept(t *testing.T) {
	dir := t.TempDir()
	writing, writingLock, err := newKeptDir(filepath.Join(dir, "osworld-end-a"))
	if err != nil {
		t.Fatal(err)
	}
	defer writingLock.Close()
	died, diedLock, err := newKeptDir(filepath.Join(dir, "osworld-end-b"))
	if err != nil {
		t.Fatal(err)
	}
	diedLock.Close() // its writer is gone
	if err := os.WriteFile(filepath.Join(died, keptStream), []byte("half a stream"), 0o600); err != nil {
		t.Fatal(err)
	}
	whole := filepath.Join(dir, "osworld-end-c")
	foreign := filepath.Join(dir, keptNewPrefix+"someone-elses")
	for _, d := range []string{whole, foreign} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	// Made, never locked (the writer died in between): empty, and gone
	// once a minute old; a fresh one may be locked any moment.
	oldMade := filepath.Join(dir, keptMakePrefix+"osworld-end-d")
	newMade := filepath.Join(dir, keptMakePrefix+"osworld-end-e")
	for _, d := range []string{oldMade, newMade} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	hour := time.Now().Add(-time.Hour)
	if err := os.Chtimes(oldMade, hour, hour); err != nil {
		t.Fatal(err)
	}
	removed, err := SweepKept(dir)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(removed)
	if want := []string{oldMade, died}; !slices.Equal(removed, want) {
		t.Errorf("SweepKept removed %q, want only %q", removed, want)
	}
	for _, d := range []string{writing, whole, foreign, newMade} {
		if _, err := os.Stat(d); err != nil {
			t.Errorf("%s: %v; want it kept", d, err)
		}
	}
	if _, err := os.Stat(died); err == nil {
		t.Errorf("%s still exists", died)
	}
	if removed, err := SweepKept(filepath.Join(dir, "none")); err != nil || removed != nil {
		t.Errorf("SweepKept of a missing directory: %q, %v", removed, err)
	}
}

// TestLoadKeptRefusesPlanted: a kept state's manifest replaced by a
// symlink to a file only root may read, or by a FIFO, is refused at once,
// naming it: LoadKept followed the symlink (its error said the file's
// first byte) and blocked on the FIFO until a writer came.
func TestLoadKeptRefusesPlanted(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("LoadKept needs root")
	}
	v := &VM{cfg: Config{Fork: true}, host: &Host{}}
	secret := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secret, []byte("Secret of root's\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name  string
		plant func(path string) error
		want  string
	}{
		{"symlink", func(path string) error { return os.Symlink(secret, path) }, " is a symlink"},
		{"FIFO", func(path string) error { return syscall.Mkfifo(path, 0o600) }, " is a FIFO"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "osworld-end-a")
			if err := os.Mkdir(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			manifest := filepath.Join(dir, keptManifest)
			if err := tc.plant(manifest); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() {
				tp, err := v.LoadKept(t.Context(), dir)
				if err == nil {
					tp.Close()
				}
				done <- err
			}()
			var err error
			select {
			case err = <-done:
			case <-time.After(2 * time.Minute):
				// The FIFO's other end lets the blocked load go on.
				if f, err := os.OpenFile(manifest, os.O_WRONLY, 0); err == nil {
					f.Close()
				}
				<-done
				t.Fatal("LoadKept still blocked on the manifest after 2 minutes")
			}
			if err == nil || !strings.Contains(err.Error(), manifest+tc.want) || strings.Contains(err.Error(), "'S'") {
				t.Errorf("LoadKept: %v; want it refused, saying %q", err, manifest+tc.want)
			}
		})
	}
}
