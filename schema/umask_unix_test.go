//go:build unix

package schema

import (
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// withUmask runs fn with the process's umask set to mask. The umask belongs
// to the process, so the tests that call it are never parallel: a parallel
// test creating files meanwhile would get modes from the wrong umask.
func withUmask(t *testing.T, mask int, fn func()) {
	t.Helper()
	old := syscall.Umask(mask)
	defer syscall.Umask(old)
	fn()
}

// checkMode fails t unless path has mode perm less mask.
func checkMode(t *testing.T, path string, perm, mask fs.FileMode) {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Error(err)
		return
	}
	if got, want := fi.Mode().Perm(), perm&^mask; got != want {
		t.Errorf("%s has mode %04o under umask %04o, want %04o", path, got, mask, want)
	}
}

// TestFilesHonourUmask checks that every file and directory of a run, and
// the files written with WriteFileAtomic, get the modes os.Create and
// os.Mkdir would give them: 0666 and 0777 less the umask, nothing forced.
func TestFilesHonourUmask(t *testing.T) {
	for _, mask := range []int{0o077, 0o022, 0o002} {
		t.Run(fmt.Sprintf("%04o", mask), func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "run")
			out := filepath.Join(t.TempDir(), "train.jsonl")
			var msgHash, imgPath string
			withUmask(t, mask, func() {
				r, err := Create(dir)
				if err != nil {
					t.Fatal(err)
				}
				defer r.Close()
				hashes, err := r.PutMessages([]Message{{Role: "user", Content: []Part{TextPart("look"), ImagePart(dataURL(tinyPNG))}}})
				if err != nil {
					t.Fatal(err)
				}
				msgHash = hashes[0]
				if err := r.Append(fullRecord("a")); err != nil {
					t.Fatal(err)
				}
				if err := r.WriteSummary(&Summary{}); err != nil {
					t.Fatal(err)
				}
				if err := r.WriteFile(BatchFile, []byte("{}\n")); err != nil {
					t.Fatal(err)
				}
				if _, err := WriteFileAtomic(out, func(w io.Writer) error {
					_, err := io.WriteString(w, "{}\n")
					return err
				}); err != nil {
					t.Fatal(err)
				}
				imgs, err := os.ReadDir(filepath.Join(dir, ImagesDir))
				if err != nil || len(imgs) != 1 {
					t.Fatalf("images/ holds %d files (%v), want 1", len(imgs), err)
				}
				imgPath = filepath.Join(dir, ImagesDir, imgs[0].Name())
			})
			m := fs.FileMode(mask)
			for _, d := range []string{dir, filepath.Join(dir, MessagesDir), filepath.Join(dir, ImagesDir)} {
				checkMode(t, d, 0o777, m)
			}
			for _, f := range []string{
				filepath.Join(dir, RecordsFile), filepath.Join(dir, SummaryFile), filepath.Join(dir, BatchFile),
				filepath.Join(dir, MessagesDir, objectFile(t, filepath.Join(dir, MessagesDir), msgHash)), imgPath, out,
			} {
				checkMode(t, f, 0o666, m)
			}
		})
	}
}
