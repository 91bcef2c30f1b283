package vm

import (
	"errors"
	"fmt"

	"legato/rl/desktop"
)

// Sentinel errors callers branch on with errors.Is.
var (
	// ErrLibvirtUnavailable means libvirtd could not be reached, or the
	// connection to it broke.
	ErrLibvirtUnavailable = errors.New("libvirt unavailable")
	// ErrTimeout means a libvirt call or a qemu-img run took longer than
	// Config.CallTimeout.
	ErrTimeout = errors.New("timed out")
	// ErrNotReady means the guest server did not answer within
	// Config.BootTimeout after a boot or a revert.
	ErrNotReady = errors.New("guest server not ready")
	// ErrNotRunning means the domain stopped (the guest powered off or
	// QEMU died).
	ErrNotRunning = errors.New("domain not running")
	// ErrClosed is returned by every method after Close. It wraps
	// desktop.ErrClosed, so a desktop built on a VM can pass it on.
	ErrClosed = fmt.Errorf("vm: %w", desktop.ErrClosed)
)

// Error is a failure of one operation on a VM.
type Error struct {
	// Op is what failed ("create overlay", "revert snapshot").
	Op string
	// VM names the domain, when there is one.
	VM  string
	Err error
}

func (e *Error) Error() string {
	if e.VM == "" {
		return fmt.Sprintf("%s: %v", e.Op, e.Err)
	}
	return fmt.Sprintf("vm %s: %s: %v", e.VM, e.Op, e.Err)
}

func (e *Error) Unwrap() error { return e.Err }
