package vm

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"

	"legato/rl/internal/safeopen"
)

// The fork directory (Config.ForkDir) lies by default in /dev/shm, where
// every local user may create names. Root writes guest RAM, device states
// and disk layers under it and removes what it finds there, so a directory
// another user made first (with a symlink swapped in for a file root then
// writes, or a FIFO where root opens a lock) would be a way in. legato uses
// the directory only once it is sure the directory is its own: made by this
// uid (only root can give a file to root), not writable by anybody else,
// and under directories no other user can change (its parent and each
// above it: root's or ours, reached without a symlink, not writable by
// others but with the sticky bit, as /dev/shm and /tmp are; package
// safeopen). Nobody else can then rename it away or place
// anything inside it, so the paths under it are ours; the files legato opens
// there are opened with O_NOFOLLOW all the same.

// ErrForkDir is wrapped by the error about a fork directory legato refuses
// to use.
var ErrForkDir = errors.New("unsafe fork directory")

// forkDirMode is the fork directory's mode: the owner's, and the group's
// (QEMU's, once a template is made) to reach the template directories.
const forkDirMode = 0o750

// ensureForkDir makes dir if it is missing and checks that it is this
// process's own (see above). With gid ≥ 0 it gives the directory to that
// group (QEMU's: clones run as libvirt's QEMU user and must reach their
// template's files) with forkDirMode; a directory of ours whose mode only
// lets others read it is narrowed to that too.
func ensureForkDir(dir string, gid int) error {
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return fmt.Errorf("fork dir: %w", err)
	}
	if err := checkForkDirParent(dir); err != nil {
		return err
	}
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("fork dir: %w", err)
	}
	// O_NOFOLLOW: a symlink at dir fails here (ELOOP) rather than being
	// followed to wherever it points; the checks below are on what was
	// opened, not on a name that could change in between.
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
			return fmt.Errorf("%w: %s is not a directory but a symlink or a file: remove it, or choose another --fork-dir", ErrForkDir, dir)
		}
		return fmt.Errorf("fork dir %s: %w", dir, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("fork dir %s: %w", dir, err)
	}
	if err := checkForkDirStat(dir, st.Uid, os.FileMode(st.Mode&0o7777)); err != nil {
		return err
	}
	if gid >= 0 && int(st.Gid) != gid {
		if err := unix.Fchown(fd, -1, gid); err != nil {
			return fmt.Errorf("fork dir %s: give it to QEMU's group: %w", dir, err)
		}
	}
	want := uint32(0o700)
	if gid >= 0 {
		want = forkDirMode
	}
	if st.Mode&0o7777 != want && (gid >= 0 || st.Mode&0o077 != 0) {
		if err := unix.Fchmod(fd, want); err != nil {
			return fmt.Errorf("fork dir %s: %w", dir, err)
		}
	}
	return nil
}

// checkForkDir checks, without changing anything, that dir is a fork
// directory of this process's uid that nobody else can write in; a missing
// dir is fine (there is nothing in it).
func checkForkDir(dir string) error {
	switch err := checkForkDirParent(dir); {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		return err
	}
	fi, err := os.Lstat(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("fork dir: %w", err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("%w: %s is not a directory but a %s: remove it, or choose another --fork-dir", ErrForkDir, dir, kindOf(fi.Mode()))
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fmt.Errorf("%w: %s: no owner to check", ErrForkDir, dir)
	}
	return checkForkDirStat(dir, st.Uid, fi.Mode().Perm()|fi.Mode()&(fs.ModeSticky|fs.ModeSetgid|fs.ModeSetuid))
}

// checkForkDirStat refuses a fork directory another uid owns, or that a
// group or other users may write in.
func checkForkDirStat(dir string, uid uint32, mode os.FileMode) error {
	if me := os.Geteuid(); int(uid) != me {
		return fmt.Errorf("%w: %s belongs to uid %d, not to this process's uid %d: another user may have made it to reach what legato writes there; remove it, or choose another --fork-dir",
			ErrForkDir, dir, uid, me)
	}
	if mode.Perm()&0o022 != 0 {
		return fmt.Errorf("%w: %s has mode %#o: others may write in it; remove it (legato makes it %#o), or choose another --fork-dir",
			ErrForkDir, dir, mode.Perm(), forkDirMode)
	}
	return nil
}

// checkForkDirParent refuses a fork directory in a parent where another
// user could swap it: the parent and every directory above it must be
// root's or ours, reached without a symlink, and writable by nobody else
// but with the sticky bit (as /dev/shm). Checked first, it makes the
// checks of dir itself, by its path, safe: nobody else can then change
// what the path leads to.
func checkForkDirParent(dir string) error {
	err := safeopen.CheckDir(filepath.Dir(dir))
	switch {
	case errors.Is(err, safeopen.ErrUnsafe):
		return fmt.Errorf("%w: %s lies under a path another user could change: %w; or choose another --fork-dir", ErrForkDir, dir, err)
	case err != nil:
		return fmt.Errorf("fork dir: %w", err)
	}
	return nil
}

func kindOf(m os.FileMode) string {
	switch {
	case m&fs.ModeSymlink != 0:
		return "symlink"
	case m&fs.ModeNamedPipe != 0:
		return "FIFO"
	case m&fs.ModeSocket != 0:
		return "socket"
	case m&fs.ModeDevice != 0:
		return "device"
	}
	return "file"
}

// openNoFollow opens name in a fork directory without following a symlink
// and, for a flag without O_CREATE, without blocking on a FIFO; it refuses
// anything but a regular file.
func openNoFollow(name string, flag int, perm os.FileMode) (*os.File, error) {
	f, err := os.OpenFile(name, flag|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, perm)
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err == nil && !fi.Mode().IsRegular() {
		err = fmt.Errorf("%w: %s is a %s, not a file", ErrForkDir, name, kindOf(fi.Mode()))
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}
