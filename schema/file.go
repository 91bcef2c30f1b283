package schema

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Modes of what legato creates: the umask (and a default ACL of the parent
// directory) decides the rest, as for any program's output. A run shared by
// a trainer running as another user needs a umask that lets it read.
const (
	fileMode = 0o666
	dirMode  = 0o777
)

// BatchFile is the name of the batch description collect writes into a run
// directory (see Run.WriteFile).
const BatchFile = "batch.json"

// ErrRunFile means a file was to be written over one of the files a run
// directory is made of.
var ErrRunFile = errors.New("is one of the run's own files")

// ownEntries are the entries of a run directory that legato writes and
// reads back; nothing else may write over them. An entry a new release adds
// to the run directory belongs here.
var ownEntries = []string{RecordsFile, SummaryFile, BatchFile, MessagesDir, ImagesDir, TokensDir}

// CheckOutput returns an error wrapping ErrRunFile when writing the file
// path would replace one of the files the run directory dir is made of:
// rollouts.jsonl, summary.json, batch.json or anything under messages/ or
// images/. Any other path is fine, including a new file inside dir (a
// report next to the run). Symbolic links are followed, so a second name
// for dir is caught; path need not exist.
func CheckOutput(dir, path string) error {
	name, err := ownEntry(dir, path)
	if err != nil {
		return fmt.Errorf("check output %s: %w", path, err)
	}
	switch name {
	case "":
		return nil
	case ".":
		return fmt.Errorf("%s is the run directory itself: name a file to write", path)
	}
	return fmt.Errorf("%s %w (%s): choose another file; a new name inside the run directory is fine",
		path, ErrRunFile, name)
}

// ownEntry returns the entry of ownEntries that path is or lies under in
// the run directory dir, "." when path is dir, or "".
func ownEntry(dir, path string) (string, error) {
	d, err := resolve(dir)
	if err != nil {
		return "", err
	}
	p, err := resolve(path)
	if err != nil {
		return "", err
	}
	rel, err := filepath.Rel(d, p)
	if err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
		return "", nil // not inside dir
	}
	if rel == "." {
		return ".", nil
	}
	first, _, _ := strings.Cut(rel, string(filepath.Separator))
	for _, e := range ownEntries {
		if first == e {
			return e, nil
		}
	}
	return "", nil
}

// resolve returns the absolute path of p with the symbolic links of its
// longest existing prefix resolved; the rest, which does not exist yet, is
// kept as it is.
func resolve(p string) (string, error) {
	abs, err := filepath.Abs(p)
	if err != nil {
		return "", err
	}
	var rest []string
	for {
		real, err := filepath.EvalSymlinks(abs)
		if err == nil {
			return filepath.Join(append([]string{real}, rest...)...), nil
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return "", err
		}
		parent := filepath.Dir(abs)
		if parent == abs {
			return "", err
		}
		rest = append([]string{filepath.Base(abs)}, rest...)
		abs = parent
	}
}

// createTemp creates a new file in dir named prefix and a random number,
// like os.CreateTemp, but with mode 0666 less the umask, the mode os.Create
// gives: os.CreateTemp makes 0600 files, and a file renamed into place keeps
// its temp file's mode.
func createTemp(dir, prefix string) (*os.File, error) {
	for range 10000 {
		name := filepath.Join(dir, prefix+strconv.FormatUint(uint64(rand.Uint32()), 10))
		f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_EXCL, fileMode)
		if errors.Is(err, fs.ErrExist) {
			continue
		}
		return f, err
	}
	return nil, &fs.PathError{Op: "createtemp", Path: filepath.Join(dir, prefix+"*"), Err: fs.ErrExist}
}

// WriteFileAtomic writes the file path with write, through a temp file in
// its directory that is synced and renamed over path, then syncs the
// directory: path is never seen half-written, even after a crash, and on
// error nothing is left behind. It returns the bytes written. The file's
// mode is 0666 less the umask, as for os.Create. write's error is returned
// as it is; others name path. It is how legato writes the files it makes
// from a run (an export, a report), which are read by other tools.
//
// The temp file's name starts with "." and the base name of path, never
// with the prefix of a run's own temp files, which a collect opening the
// run directory deletes.
func WriteFileAtomic(path string, write func(io.Writer) error) (n int64, err error) {
	f, err := createTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-")
	if err != nil {
		return 0, fmt.Errorf("write %s: %w", path, err)
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	cw := &countingWriter{w: f}
	bw := bufio.NewWriterSize(cw, 1<<20)
	if err := write(bw); err != nil {
		return 0, err
	}
	if err := bw.Flush(); err != nil {
		return 0, fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		return 0, fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return 0, fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return 0, fmt.Errorf("write %s: %w", path, err)
	}
	if err := syncDir(filepath.Dir(path)); err != nil {
		return 0, fmt.Errorf("write %s: %w", path, err)
	}
	return cw.n, nil
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// WriteFile replaces the file name of the run directory with data, durably
// and atomically (temp file, sync, rename, directory sync), with mode 0666
// less the umask. It is for the files of a run other than its records,
// summary and content store, such as BatchFile; name is a plain file name.
func (r *Run) WriteFile(name string, data []byte) error {
	if name == "" || name != filepath.Base(name) || strings.HasPrefix(name, tempPrefix) ||
		name == RecordsFile || name == SummaryFile || name == MessagesDir || name == ImagesDir || name == TokensDir {
		return fmt.Errorf("write run file %q: want a plain file name other than the run's records, summary and store", name)
	}
	r.life.RLock()
	defer r.life.RUnlock()
	if r.closed {
		return ErrClosed
	}
	if err := writeFileAtomic(r.dir, name, data, true); err != nil {
		return fmt.Errorf("write %s: %w", name, err)
	}
	if err := syncDir(r.dir); err != nil {
		return fmt.Errorf("write %s: %w", name, err)
	}
	return nil
}
