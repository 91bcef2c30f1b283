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
	"slices"
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
var ownEntries = []string{RecordsFile, SummaryFile, BatchFile, QuarantineFile, TaskQuarantineFile, MessagesDir, ImagesDir, TokensDir, ServiceFile, RegradeFile, EndStatesDir, ReplayFile}

// CheckOutput returns an error wrapping ErrRunFile when writing the file
// path would replace one of the files the run directory dir is made of:
// rollouts.jsonl, summary.json, batch.json or anything under messages/,
// images/ or tokens/. Any other path is fine, including a new file inside dir (a
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
	return createTempFlags(dir, prefix, 0)
}

// createTempFlags is createTemp opening the file with flags added.
func createTempFlags(dir, prefix string, flags int) (*os.File, error) {
	for range 10000 {
		name := filepath.Join(dir, prefix+strconv.FormatUint(uint64(rand.Uint32()), 10))
		f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_EXCL|flags, fileMode)
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
func WriteFileAtomic(path string, write func(io.Writer) error) (int64, error) {
	return WriteFileAtomicPatched(path, write, nil)
}

// WriteFileAtomicPatched is WriteFileAtomic for a writer that learns some
// of what it wrote only once it has written it all (an export writing in
// one pass learns a group's advantages at the end of the records): after
// write, patch (when not nil) overwrites bytes of the written file in
// place, at offsets counted from its start, before the file is synced and
// renamed. Either's error leaves path as it was.
func WriteFileAtomicPatched(path string, write func(io.Writer) error, patch func(io.WriterAt) error) (int64, error) {
	var werr error
	f, err := createOutputTemp(path)
	if err != nil {
		return 0, fmt.Errorf("write %s: %w", path, err)
	}
	// The temp file is locked against the sweeps of other writers of path
	// only while it is open: it is renamed before it is closed.
	n, err := writeThrough(f, path, true, true, func(w io.Writer) error {
		bw := bufio.NewWriterSize(w, 1<<20)
		if werr = write(bw); werr != nil {
			return werr
		}
		if err := bw.Flush(); err != nil || patch == nil {
			return err
		}
		werr = patch(f)
		return werr
	})
	switch {
	case werr != nil:
		return 0, werr
	case err != nil:
		return 0, fmt.Errorf("write %s: %w", path, err)
	}
	return n, nil
}

// writeAtomic is the one atomic file writer of everything legato writes
// from a run: the run directory's files (summary, batch.json, the content
// store) and the files made from a run (export, profile). It writes through
// a temp file named prefix and a random number (createTemp, which decides
// the mode) in path's directory, and renames it over path, so path is
// absent, the old file or the whole new one. With durable, the temp file is
// synced before the rename and the directory after it, so that holds after
// a power loss too; without (the content store, which syncs a commit's
// files together), the caller syncs the file and its directory before it
// relies on them. On error the temp file is removed.
func writeAtomic(path, prefix string, durable bool, write func(io.Writer) error) (n int64, err error) {
	f, err := createTemp(filepath.Dir(path), prefix)
	if err != nil {
		return 0, err
	}
	return writeThrough(f, path, durable, false, write)
}

// writeThrough is writeAtomic with the temp file f already made. With
// renameOpen, f is renamed before it is closed: f is a locked output temp
// file (createOutputTemp), and closing it would let another writer's sweep
// remove it before the rename.
func writeThrough(f *os.File, path string, durable, renameOpen bool, write func(io.Writer) error) (n int64, err error) {
	dir := filepath.Dir(path)
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	cw := &countingWriter{w: f}
	if err := write(cw); err != nil {
		return 0, err
	}
	if durable {
		if err := f.Sync(); err != nil {
			return 0, err
		}
	}
	if !renameOpen {
		if err := f.Close(); err != nil {
			return 0, err
		}
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return 0, err
	}
	if renameOpen {
		// Synced above: a close that fails now loses nothing written.
		if err := f.Close(); err != nil {
			return 0, err
		}
	}
	if durable {
		if err := syncDir(dir); err != nil {
			return 0, err
		}
	}
	return cw.n, nil
}

// writeBytes is a write function of writeAtomic that writes data.
func writeBytes(data []byte) func(io.Writer) error {
	return func(w io.Writer) error {
		_, err := w.Write(data)
		return err
	}
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
	// Of the run's own entries only the batch manifest is written whole.
	if name == "" || name != filepath.Base(name) || strings.HasPrefix(name, tempPrefix) ||
		(slices.Contains(ownEntries, name) && name != BatchFile) {
		return fmt.Errorf("write run file %q: want a plain file name other than the run's records, summary and store", name)
	}
	r.life.RLock()
	defer r.life.RUnlock()
	if r.closed {
		return ErrClosed
	}
	if _, err := writeAtomic(filepath.Join(r.dir, name), tempPrefix, true, writeBytes(data)); err != nil {
		return fmt.Errorf("write %s: %w", name, err)
	}
	return nil
}
