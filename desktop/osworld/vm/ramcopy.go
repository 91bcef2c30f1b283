package vm

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// copySparse copies the guest RAM in src (a memfd of the running QEMU,
// opened through /proc) to dst, keeping holes: it visits only the data
// ranges the kernel reports (SEEK_DATA/SEEK_HOLE) and skips pages that
// are all zeros, so a 4 GiB guest that touched 600 MiB costs 600 MiB of
// tmpfs. It returns the bytes written and ramSum of the content.
func copySparse(dst, src *os.File) (written int64, sum [32]byte, err error) {
	st, err := src.Stat()
	if err != nil {
		return 0, sum, err
	}
	if err := dst.Truncate(st.Size()); err != nil {
		return 0, sum, err
	}
	h := newRAMSum(st.Size())
	err = eachPage(src, st.Size(), func(off int64, page []byte) error {
		h.add(off, page)
		_, err := dst.WriteAt(page, off)
		written += int64(len(page))
		return err
	})
	return written, h.sum(), err
}

// ramFileSum is ramSum of a RAM file as copySparse wrote it.
func ramFileSum(ctx context.Context, f *os.File) ([32]byte, error) {
	st, err := f.Stat()
	if err != nil {
		return [32]byte{}, err
	}
	h := newRAMSum(st.Size())
	err = eachPage(f, st.Size(), func(off int64, page []byte) error {
		h.add(off, page)
		if off%(64<<20) == 0 {
			return ctx.Err()
		}
		return nil
	})
	return h.sum(), err
}

// ramSum hashes a RAM image's size and its non-zero pages with their
// offsets: the same content gives the same sum however its zeros are
// stored, and hashing skips the (mostly zero) rest.
type ramSum struct{ h hash.Hash }

func newRAMSum(size int64) ramSum {
	h := sha256.New()
	binary.Write(h, binary.LittleEndian, size)
	return ramSum{h}
}

func (r ramSum) add(off int64, page []byte) {
	binary.Write(r.h, binary.LittleEndian, off)
	r.h.Write(page)
}

func (r ramSum) sum() (s [32]byte) {
	copy(s[:], r.h.Sum(nil))
	return s
}

// eachPage calls f with every 4 KiB page of f's data ranges that is not
// all zeros, in order.
func eachPage(src *os.File, size int64, f func(off int64, page []byte) error) error {
	const pageSize = 4096
	buf := make([]byte, 1<<20)
	zero := make([]byte, pageSize)
	fd := int(src.Fd())
	for off := int64(0); off < size; {
		data, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			return nil // only a hole is left
		}
		if err != nil {
			return fmt.Errorf("seek data: %w", err)
		}
		hole, err := unix.Seek(fd, data, unix.SEEK_HOLE)
		if err != nil {
			return fmt.Errorf("seek hole: %w", err)
		}
		for pos := data; pos < hole; {
			n, err := src.ReadAt(buf[:min(int64(len(buf)), hole-pos)], pos)
			if n == 0 {
				if err == nil || errors.Is(err, io.EOF) {
					break
				}
				return err
			}
			for p := 0; p < n; p += pageSize {
				page := buf[p:min(p+pageSize, n)]
				if bytes.Equal(page, zero[:len(page)]) {
					continue
				}
				if err := f(pos+int64(p), page); err != nil {
					return err
				}
			}
			pos += int64(n)
		}
		off = hole
	}
	return nil
}
