package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"path/filepath"

	"legato/rl/schema"
)

// repairCommand is `legato rl repair`: it moves the lines of a run's
// rollouts.jsonl that no reader may use to the run's quarantine file, so
// that export works again and nothing is deleted.
type repairCommand struct{}

func (c *repairCommand) flagSet(stderr io.Writer) *flag.FlagSet {
	fs := newFlagSet("legato rl repair", stderr)
	setUsage(fs, `Usage: legato rl repair DIR

Moves the lines of DIR/rollouts.jsonl that export refuses to
DIR/`+schema.QuarantineFile+`, each with its line number and the reason:
damaged lines (not JSON, not a legato record) and, when an attempt has two
final records, the later ones (the first is the record collect's resume
kept). rollouts.jsonl is rewritten atomically; nothing is deleted. A record
lost to damage leaves its attempt without a record, so collect runs it again
when it resumes the batch.

It takes the run's lock, so it refuses to run while a collect writes DIR.
Collect does the same repair when it resumes a batch.

`)
	return fs
}

// Run parses args, repairs the run and lists the lines it moved.
func (c *repairCommand) Run(_ context.Context, args []string, stdout, stderr io.Writer) error {
	fs := c.flagSet(stderr)
	dir, err := parseRunDir(fs, args)
	if err != nil {
		return err
	}
	run, err := schema.Open(dir)
	if errors.Is(err, schema.ErrLocked) {
		return fmt.Errorf("%s: %w: a collect is writing it; stop it first (its resume repairs the run too)", dir, err)
	}
	if err != nil {
		return err
	}
	st, err := run.Repair()
	if cerr := run.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	records := filepath.Join(dir, schema.RecordsFile)
	if st.Moved() == 0 {
		fmt.Fprintf(stdout, "%s needs no repair\n", records)
		return nil
	}
	for _, l := range st.Lines {
		fmt.Fprintf(stdout, "moved line %d: %s\n", l.Line, l.Reason)
	}
	fmt.Fprintf(stdout, "moved %d lines (%d damaged, %d duplicate final records) from %s to %s\n",
		st.Moved(), st.Unreadable, st.Duplicates, records, filepath.Join(dir, schema.QuarantineFile))
	return nil
}
