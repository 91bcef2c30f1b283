// Command legato runs the rollout side of reinforcement learning for
// computer-use agents. Run `legato rl help` for its subcommands.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sync"
	"syscall"
)

// Exit codes, mapped from errors in one place: exitCode. A run stopped by
// Ctrl-C or SIGTERM exits 130 like a shell job killed by SIGINT, so scripts
// can tell "stopped" from "failed".
const (
	exitOK          = 0
	exitFailure     = 1
	exitUsage       = 2
	exitInterrupted = 130
)

func main() {
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	ctx, stop := stopOnSignal(context.Background(), sigs, os.Stderr, os.Exit)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	code := exitCode(ctx, err, os.Stderr)
	signal.Stop(sigs)
	stop()
	os.Exit(code)
}

// stopOnSignal returns a ctx that the first signal on sigs cancels: the
// command starts no new work and records what is finishing, which can take
// a while (desktops closing, a record's sync). A second signal exits at
// once with exitInterrupted, for an operator who will not wait: records
// already synced stay, and collecting into the run directory again resumes
// the batch (a torn last line is cut off). stop ends the watch.
func stopOnSignal(parent context.Context, sigs <-chan os.Signal, stderr io.Writer, exit func(int)) (context.Context, func()) {
	ctx, cancel := context.WithCancel(parent)
	done := make(chan struct{})
	var watching sync.WaitGroup
	watching.Go(func() {
		select {
		case <-sigs:
		case <-done:
			return
		}
		cancel()
		fmt.Fprintln(stderr, "legato: stopping: no new work, recording what is finishing; interrupt again to exit at once")
		select {
		case <-sigs:
			fmt.Fprintln(stderr, "legato: interrupted again: exiting now; collect into the same directory to resume")
			exit(exitInterrupted)
		case <-done:
		}
	})
	return ctx, func() {
		close(done)
		watching.Wait()
		cancel()
	}
}

// run dispatches the command line (without the program name).
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		writeHelp(stderr)
		return usageErrorf("legato: missing command")
	}
	switch args[0] {
	case "rl":
		return runRL(ctx, args[1:], stdout, stderr)
	case "help", "-h", "-help", "--help":
		writeHelp(stdout)
		return nil
	}
	return usageErrorf("legato: unknown command %q; legato's commands are under \"legato rl\"", args[0])
}

// usageError is a command line that cannot run as given: a missing or
// unknown subcommand, a bad flag or flag value, a missing argument. It is
// the one error that exits with exitUsage, and it is found before anything
// starts.
type usageError struct{ err error }

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

func usageErrorf(format string, args ...any) error {
	return &usageError{err: fmt.Errorf(format, args...)}
}

// usage marks err, found while checking the command line, as a usage
// error; nil stays nil.
func usage(err error) error {
	if err == nil {
		return nil
	}
	return &usageError{err: err}
}

// exitCode reports err on stderr and returns the process's exit code. It
// is the one place that maps errors to exit codes. ctx is the context the
// command ran with; in main only a signal cancels it.
func exitCode(ctx context.Context, err error, stderr io.Writer) int {
	var usage *usageError
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, flag.ErrHelp):
		// The flag set printed the help that was asked for.
		return exitOK
	case ctx.Err() != nil:
		fmt.Fprintf(stderr, "%v\nlegato: interrupted\n", err)
		return exitInterrupted
	case errors.As(err, &usage):
		fmt.Fprintf(stderr, "%v\nRun 'legato rl help' for usage.\n", err)
		return exitUsage
	}
	fmt.Fprintln(stderr, err)
	return exitFailure
}
