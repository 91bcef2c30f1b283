package benchrun

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"time"
)

// CopyTime reads path and writes a synced copy of it beside it (removed
// before it returns), and returns how long that took: the bound the disk
// sets for a program that reads a run and writes as many bytes.
func CopyTime(path string) (_ time.Duration, err error) {
	t0 := time.Now()
	src, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer src.Close()
	dst, err := os.Create(path + ".copy")
	if err != nil {
		return 0, err
	}
	defer os.Remove(dst.Name())
	defer func() { err = errors.Join(err, dst.Close()) }()
	// Not io.Copy's copy_file_range: the bytes pass through memory, as
	// they do for an exporter.
	if _, err := io.Copy(struct{ io.Writer }{dst}, src); err != nil {
		return 0, err
	}
	if err := dst.Sync(); err != nil {
		return 0, err
	}
	return time.Since(t0), nil
}

// CompleteMarker is the file Generate writes in a run directory once the
// run in it is whole.
const CompleteMarker = ".complete"

// Generate writes r into dir unless dir holds a run Generate completed
// before (then it is reused as it is), and says whether it wrote it. A dir
// holding other files is an error: Generate never writes into them.
func Generate(dir string, r Run) (wrote bool, err error) {
	complete := filepath.Join(dir, CompleteMarker)
	if _, err := os.Stat(complete); err == nil {
		return false, nil
	}
	if entries, _ := os.ReadDir(dir); len(entries) > 0 {
		return false, fmt.Errorf("%s holds files but no complete generated run: remove it or name an empty directory", dir)
	}
	if err := r.Write(dir); err != nil {
		return false, err
	}
	return true, os.WriteFile(complete, nil, 0o644)
}

// ReadTime reads every file under each of paths (files or directories)
// to the end and returns how long that took and how many bytes it read.
func ReadTime(paths ...string) (time.Duration, int64, error) {
	t0 := time.Now()
	var n int64
	buf := make([]byte, 1<<20)
	for _, root := range paths {
		err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			f, err := os.Open(path)
			if err != nil {
				return err
			}
			defer f.Close()
			m, err := io.CopyBuffer(io.Discard, struct{ io.Reader }{f}, buf)
			n += m
			return err
		})
		if err != nil {
			return 0, n, err
		}
	}
	return time.Since(t0), n, nil
}
