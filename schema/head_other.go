//go:build !unix

package schema

import (
	"errors"
	"io"
	"os"
)

// readHead reads up to len(head) bytes from the start of the file at path
// into head and returns how many it read and the file's size.
func readHead(path string, head []byte) (n int, size int64, err error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return 0, 0, err
	}
	n, err = io.ReadFull(f, head)
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		err = nil
	}
	return n, fi.Size(), err
}
