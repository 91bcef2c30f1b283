// Package safeopen opens the files legato reads back from directories it
// wrote (kept end states, the fork directory) so that no other local user
// can make it open something else: legato often runs as root, and a
// symlink another user planted would have it read (and report) a file of
// root's, a FIFO would block it.
//
// The rule, like ssh's StrictModes and sudo's: the path is walked from /
// one name at a time, without following any symlink (openat with
// O_NOFOLLOW); every directory on the way, the last one's included,
// belongs to root or to this process's uid and is writable by nobody else
// (by the group or others only with its sticky bit, as /tmp is, where
// nobody can rename what is not theirs). Nobody else can then change what
// the path leads to. A file is opened with O_NONBLOCK, so a FIFO or device
// never blocks the open, and must be a regular file of root's or ours.
package safeopen

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// ErrUnsafe is wrapped by the errors about a path Open and OpenDir refuse.
var ErrUnsafe = errors.New("unsafe path")

// Open opens the regular file path for reading as the package comment
// says. An error about the path wraps ErrUnsafe and names the name on the
// way that is wrong, what is wrong with it and what to do; a missing name
// gives an error wrapping fs.ErrNotExist.
func Open(path string) (*os.File, error) {
	abs, err := absolute(path)
	if err != nil {
		return nil, err
	}
	dir, name := filepath.Split(abs)
	if name == "" {
		return nil, unsafe(abs, "is a directory, not a file", "name a file")
	}
	dfd, err := walk(dir)
	if err != nil {
		return nil, err
	}
	defer unix.Close(dfd)
	fd, err := openAt(dfd, abs, name, false)
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), abs), nil
}

// ReadFile reads the regular file at path as Open opens it.
func ReadFile(path string) ([]byte, error) {
	f, err := Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(f)
}

// OpenDir opens the directory path (to read its names, or to check it), as
// Open does a file's.
func OpenDir(path string) (*os.File, error) {
	abs, err := absolute(path)
	if err != nil {
		return nil, err
	}
	fd, err := walk(abs)
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), abs), nil
}

// CheckDir reports whether the directory path is one OpenDir opens: nil,
// an error wrapping ErrUnsafe, or one of opening it (fs.ErrNotExist).
func CheckDir(path string) error {
	f, err := OpenDir(path)
	if err != nil {
		return err
	}
	return f.Close()
}

// absolute is path from /: a relative path is taken from the working
// directory as the kernel has it (not $PWD, which may name it through a
// symlink).
func absolute(path string) (string, error) {
	if path == "" {
		return "", fmt.Errorf("%w: an empty path", ErrUnsafe)
	}
	if filepath.IsAbs(path) {
		return filepath.Clean(path), nil
	}
	wd, err := unix.Getwd()
	if err != nil {
		return "", fmt.Errorf("open %s: the working directory: %w", path, err)
	}
	return filepath.Join(wd, path), nil
}

// walk opens the directory abs (absolute and clean) from /, one name at a
// time, checking each directory as it is opened: the checks are on what
// was opened, never on a name that could change in between.
func walk(abs string) (int, error) {
	fd, err := unix.Open("/", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, &fs.PathError{Op: "open", Path: "/", Err: err}
	}
	if err := checkFd(fd, "/", true); err != nil {
		unix.Close(fd)
		return -1, err
	}
	at := "/"
	for _, name := range strings.Split(abs, "/") {
		if name == "" {
			continue
		}
		at = filepath.Join(at, name)
		next, err := openAt(fd, at, name, true)
		unix.Close(fd)
		if err != nil {
			return -1, err
		}
		fd = next
	}
	return fd, nil
}

// openAt opens name in the directory dfd without following a symlink or
// blocking, and checks what it opened; path is its whole path, for errors.
func openAt(dfd int, path, name string, dir bool) (int, error) {
	flags := unix.O_RDONLY | unix.O_NOFOLLOW | unix.O_NONBLOCK | unix.O_NOCTTY | unix.O_CLOEXEC
	if dir {
		flags |= unix.O_DIRECTORY
	}
	fd, err := unix.Openat(dfd, name, flags, 0)
	if err != nil {
		if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ENXIO) {
			// A symlink (ELOOP; with O_DIRECTORY, ENOTDIR), a file
			// where a directory should be, a socket: say which.
			var st unix.Stat_t
			if unix.Fstatat(dfd, name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil {
				if err := check(&st, path, dir); err != nil {
					return -1, err
				}
			}
		}
		return -1, &fs.PathError{Op: "open", Path: path, Err: err}
	}
	if err := checkFd(fd, path, dir); err != nil {
		unix.Close(fd)
		return -1, err
	}
	if !dir {
		// A regular file: O_NONBLOCK changes nothing for it, but an
		// os.File must not take it for a pollable one.
		flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0)
		if err == nil {
			_, err = unix.FcntlInt(uintptr(fd), unix.F_SETFL, flags&^unix.O_NONBLOCK)
		}
		if err != nil {
			unix.Close(fd)
			return -1, &fs.PathError{Op: "open", Path: path, Err: err}
		}
	}
	return fd, nil
}

func checkFd(fd int, path string, dir bool) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return &fs.PathError{Op: "stat", Path: path, Err: err}
	}
	return check(&st, path, dir)
}

func check(st *unix.Stat_t, path string, dir bool) error {
	if what, fix := problem(uint32(st.Mode), st.Uid, os.Geteuid(), dir); what != "" {
		return unsafe(path, what, fix)
	}
	return nil
}

// problem says what is wrong with a name on the way to a file, given its
// mode and owner as stat gives them: a directory on the way (dir) or the
// file at its end, and what to do about it; "" when nothing is.
func problem(mode, uid uint32, euid int, dir bool) (what, fix string) {
	kind := mode & unix.S_IFMT
	switch {
	case kind == unix.S_IFLNK && dir:
		return "is a symlink, which is not followed here (whoever can change it, or what it points to, could lead legato elsewhere)",
			"if it is yours, name the path it leads to instead; if not, remove it"
	case kind == unix.S_IFLNK:
		return "is a symlink, where legato writes only regular files", "remove it"
	case dir && kind != unix.S_IFDIR:
		return "is a " + kindName(kind) + ", not a directory", "remove it, or name another path"
	case !dir && kind != unix.S_IFREG:
		return "is a " + kindName(kind) + ", where legato writes only regular files", "remove it"
	case uid != 0 && int(uid) != euid:
		return fmt.Sprintf("belongs to uid %d, neither root nor this process's uid %d (its owner could change what lies under it)", uid, euid),
			"use a path of your own or root's"
	case dir && mode&0o022 != 0 && mode&unix.S_ISVTX == 0:
		return fmt.Sprintf("has mode %#o: its group or other users may write in it, and without the sticky bit they could swap what lies in it", mode&0o7777),
			"chmod go-w it, or use another directory"
	}
	return "", ""
}

func kindName(kind uint32) string {
	switch kind {
	case unix.S_IFREG:
		return "regular file"
	case unix.S_IFDIR:
		return "directory"
	case unix.S_IFLNK:
		return "symlink"
	case unix.S_IFIFO:
		return "FIFO"
	case unix.S_IFSOCK:
		return "socket"
	case unix.S_IFCHR, unix.S_IFBLK:
		return "device"
	}
	return "special file"
}

func unsafe(path, what, fix string) error {
	return fmt.Errorf("%w: %s %s: %s", ErrUnsafe, path, what, fix)
}
