//go:build !unix

package schema

import "os"

// lockFile is a no-op where flock is missing: legato's desktops need Linux,
// and readers of a run never lock.
func lockFile(*os.File) error { return nil }

// canLock reports whether lockFile locks.
const canLock = false

// lockFileWait is a no-op where flock is missing.
func lockFileWait(*os.File) error { return nil }
