//go:build unix

package schema

import (
	"errors"
	"os"
	"syscall"
)

// lockFile takes an exclusive advisory lock on f without waiting. The lock
// belongs to the open file and is released when f is closed or the process
// dies, so a crashed writer never leaves a stale lock behind.
func lockFile(f *os.File) error {
	err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
	if errors.Is(err, syscall.EWOULDBLOCK) {
		return ErrLocked
	}
	return err
}

// canLock reports whether lockFile locks.
const canLock = true

// lockFileWait takes an exclusive advisory lock on f, waiting for the
// holder to let go.
func lockFileWait(f *os.File) error {
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX)
		if !errors.Is(err, syscall.EINTR) {
			return err
		}
	}
}
