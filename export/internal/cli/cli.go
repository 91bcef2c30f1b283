// Package cli holds what the export and profile command lines share:
// flags before or after the run directory, and usage errors.
package cli

import (
	"errors"
	"flag"
	"fmt"
)

// UsageError is a command line that cannot run as given: a missing run
// directory, a bad flag. The command-line tool exits with its usage code.
type UsageError struct{ Msg string }

func (e *UsageError) Error() string { return e.Msg }

// Usagef returns a *UsageError.
func Usagef(format string, args ...any) error {
	return &UsageError{Msg: fmt.Sprintf(format, args...)}
}

// Parse parses args with fs, letting flags come before and after the
// positional arguments (`DIR --out FILE` as well as `--out FILE DIR`),
// which the flag package alone stops at the first positional argument to
// do. It returns the positional arguments. A bad flag is a *UsageError; -h
// gives flag.ErrHelp after fs printed its usage.
func Parse(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, err
			}
			return nil, &UsageError{Msg: err.Error()}
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		if used := len(args) - len(rest); used > 0 && args[used-1] == "--" {
			// fs stopped at "--": everything after it is positional.
			return append(pos, rest...), nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

// OneDir returns the single run directory among pos.
func OneDir(pos []string, command string) (string, error) {
	switch len(pos) {
	case 0:
		return "", Usagef("%s: missing run directory: pass the run directory written by collect", command)
	case 1:
		return pos[0], nil
	}
	return "", Usagef("%s: want one run directory, got %d arguments %q", command, len(pos), pos)
}
