//go:build unix

package schema

import (
	"errors"
	"io/fs"
	"syscall"
)

// readHead reads up to len(head) bytes from the start of the file at path
// into head and returns how many it read and the file's size, in four
// system calls: an export reads the header of every screenshot of a run,
// and os.Open's non-blocking mode and poller registration doubled them.
func readHead(path string, head []byte) (n int, size int64, err error) {
	var fd int
	for {
		fd, err = syscall.Open(path, syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
		if !errors.Is(err, syscall.EINTR) {
			break
		}
	}
	if err != nil {
		return 0, 0, &fs.PathError{Op: "open", Path: path, Err: err}
	}
	defer syscall.Close(fd)
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		return 0, 0, &fs.PathError{Op: "stat", Path: path, Err: err}
	}
	for n < len(head) {
		m, err := syscall.Pread(fd, head[n:], int64(n))
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if err != nil {
			return n, 0, &fs.PathError{Op: "read", Path: path, Err: err}
		}
		if m == 0 {
			break
		}
		n += m
	}
	return n, st.Size, nil
}
