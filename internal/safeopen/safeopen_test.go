package safeopen

import (
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestOpen: a regular file of ours is opened, also through a sticky
// directory others may write in (as /tmp); a symlink at the end or on the
// way, a FIFO (at once, without blocking), a device, a directory, a file
// or a directory on the way of another user's, and a directory its group
// or others may write in are refused, naming the path and what is wrong.
func TestOpen(t *testing.T) {
	root := os.Geteuid() == 0
	cases := []struct {
		name string
		// make makes what the case opens under base and returns its
		// path.
		make   func(t *testing.T, base string) string
		asRoot bool
		want   string // in the error; "" for a file opened
	}{
		{"regular", func(t *testing.T, base string) string {
			return writeFile(t, filepath.Join(base, "a", "file"))
		}, false, ""},
		{"sticky ancestor", func(t *testing.T, base string) string {
			p := writeFile(t, filepath.Join(base, "tmp", "file"))
			chmod(t, filepath.Dir(p), 0o777|fs.ModeSticky)
			return p
		}, false, ""},
		{"symlink final", func(t *testing.T, base string) string {
			secret := writeFile(t, filepath.Join(t.TempDir(), "secret"))
			p := filepath.Join(base, "a", "file")
			mkdir(t, filepath.Dir(p))
			symlink(t, secret, p)
			return p
		}, false, "a/file is a symlink"},
		{"symlink ancestor", func(t *testing.T, base string) string {
			real := filepath.Join(base, "real")
			writeFile(t, filepath.Join(real, "file"))
			symlink(t, real, filepath.Join(base, "link"))
			return filepath.Join(base, "link", "file")
		}, false, "/link is a symlink"},
		{"FIFO", func(t *testing.T, base string) string {
			p := filepath.Join(base, "a", "fifo")
			mkdir(t, filepath.Dir(p))
			if err := syscall.Mkfifo(p, 0o600); err != nil {
				t.Fatal(err)
			}
			return p
		}, false, "a/fifo is a FIFO"},
		{"device", func(t *testing.T, base string) string {
			return "/dev/null"
		}, false, "/dev/null is a device"},
		{"directory", func(t *testing.T, base string) string {
			p := filepath.Join(base, "a", "dir")
			mkdir(t, p)
			return p
		}, false, "a/dir is a directory"},
		{"other-owned ancestor", func(t *testing.T, base string) string {
			p := writeFile(t, filepath.Join(base, "theirs", "file"))
			chown(t, filepath.Dir(p))
			return p
		}, true, "/theirs belongs to uid 65534"},
		{"other-owned file", func(t *testing.T, base string) string {
			p := writeFile(t, filepath.Join(base, "a", "theirs"))
			chown(t, p)
			return p
		}, true, "a/theirs belongs to uid 65534"},
		{"group-writable ancestor", func(t *testing.T, base string) string {
			p := writeFile(t, filepath.Join(base, "shared", "file"))
			chmod(t, filepath.Dir(p), 0o770)
			return p
		}, false, "/shared has mode 0770"},
		{"other-writable ancestor", func(t *testing.T, base string) string {
			p := writeFile(t, filepath.Join(base, "open", "file"))
			chmod(t, filepath.Dir(p), 0o777)
			return p
		}, false, "/open has mode 0777"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if tc.asRoot && !root {
				t.Skip("needs root to give a file to another user")
			}
			path := tc.make(t, t.TempDir())
			f, err := Open(path)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("Open(%s): %v", path, err)
				}
				defer f.Close()
				if b, err := io.ReadAll(f); err != nil || string(b) != "content\n" {
					t.Errorf("read %q, %v", b, err)
				}
				return
			}
			if err == nil {
				f.Close()
				t.Fatalf("Open(%s) opened it; want it refused", path)
			}
			if !errors.Is(err, ErrUnsafe) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Open(%s): %v; want ErrUnsafe saying %q", path, err, tc.want)
			}
		})
	}
}

// TestOpenDir: a directory is opened as a file's ancestors are; a symlink
// to one is refused; a missing one is fs.ErrNotExist, not unsafe; a
// relative path is taken from the working directory.
func TestOpenDir(t *testing.T) {
	base := t.TempDir()
	dir := filepath.Join(base, "dir")
	mkdir(t, dir)
	if err := CheckDir(dir); err != nil {
		t.Errorf("CheckDir(%s): %v", dir, err)
	}
	symlink(t, dir, filepath.Join(base, "link"))
	if err := CheckDir(filepath.Join(base, "link")); !errors.Is(err, ErrUnsafe) || !strings.Contains(err.Error(), "is a symlink") {
		t.Errorf("CheckDir of a symlink: %v; want ErrUnsafe saying it is a symlink", err)
	}
	if err := CheckDir(filepath.Join(base, "missing", "dir")); !errors.Is(err, fs.ErrNotExist) || errors.Is(err, ErrUnsafe) {
		t.Errorf("CheckDir of a missing one: %v; want fs.ErrNotExist", err)
	}
	if _, err := Open(filepath.Join(base, "missing")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Open of a missing file: %v; want fs.ErrNotExist", err)
	}
	t.Chdir(base)
	f, err := OpenDir("dir")
	if err != nil {
		t.Fatalf("OpenDir of a relative path: %v", err)
	}
	defer f.Close()
	if names, err := f.Readdirnames(-1); err != nil || len(names) != 0 {
		t.Errorf("read the directory: %q, %v", names, err)
	}
}

func writeFile(t *testing.T, p string) string {
	t.Helper()
	mkdir(t, filepath.Dir(p))
	if err := os.WriteFile(p, []byte("content\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func mkdir(t *testing.T, p string) {
	t.Helper()
	if err := os.MkdirAll(p, 0o755); err != nil {
		t.Fatal(err)
	}
}

func symlink(t *testing.T, target, p string) {
	t.Helper()
	if err := os.Symlink(target, p); err != nil {
		t.Fatal(err)
	}
}

func chmod(t *testing.T, p string, m fs.FileMode) {
	t.Helper()
	if err := os.Chmod(p, m); err != nil {
		t.Fatal(err)
	}
}

func chown(t *testing.T, p string) {
	t.Helper()
	if err := os.Chown(p, 65534, 65534); err != nil {
		t.Fatal(err)
	}
}
