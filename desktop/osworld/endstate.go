package osworld

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"legato/rl/desktop"
	"legato/rl/desktop/osworld/vm"
	"legato/rl/internal/safeopen"
)

var (
	_ desktop.EndStateKeeper = (*Desktop)(nil)
	_ desktop.EndStateGrader = (*Desktop)(nil)
)

// endStatePrefix starts the name of every end state an osworld desktop
// keeps: a directory of Config.EndStates.
const endStatePrefix = "osworld-end-"

// resetKeptState names, in the log, bringing a kept end state back.
const resetKeptState ResetKind = "kept-end-state"

// KeepEndState writes the guest's whole state (RAM, devices, disk) to a
// directory of its own in Config.EndStates, whether the attempt runs in
// the VM or in a clone of a golden state; the guest is paused meanwhile
// (about a second and a half for the test guest's 1.5 GiB here). It needs
// what forking needs: root and a VM on this machine.
func (d *Desktop) KeepEndState(ctx context.Context, name string) (desktop.EndState, error) {
	ctx, done, err := d.begin(ctx)
	if err != nil {
		return desktop.EndState{}, err
	}
	defer done()
	if err := d.canKeep(); err != nil {
		return desktop.EndState{}, err
	}
	var suffix [16]byte
	if _, err := rand.Read(suffix[:]); err != nil {
		return desktop.EndState{}, err
	}
	ref := desktop.EndStateRef(endStatePrefix, suffix[:])
	if err := os.MkdirAll(d.cfg.EndStates, 0o755); err != nil {
		return desktop.EndState{}, d.fail("keep end state", err)
	}
	// Written, as root, where nobody else can redirect it, as it is
	// read back.
	if err := safeopen.CheckDir(d.cfg.EndStates); err != nil {
		return desktop.EndState{}, fmt.Errorf("keep end state: %w", err)
	}
	f := &d.golden.fork
	f.mu.Lock()
	c := f.clone
	f.mu.Unlock()
	dir := filepath.Join(d.cfg.EndStates, ref)
	var st vm.KeptStats
	switch lc, local := c.(*vm.Clone); {
	case local:
		st, err = lc.Keep(ctx, dir)
	case c != nil:
		// canKeep refuses a VM on another host, whose clones are too.
		err = fmt.Errorf("%w: clone %s runs on another host", desktop.ErrUnsupported, c.Name())
	default:
		st, err = d.vm.Keep(ctx, dir)
	}
	if err != nil {
		return desktop.EndState{}, d.fail("keep end state", err)
	}
	d.log.Info("kept the end state", "attempt", name, "ref", ref, "in_clone", c != nil, "paused", st.Paused,
		"stream_mib", st.StreamBytes>>20, "disk_mib", st.Bytes>>20)
	return desktop.EndState{Ref: ref, Bytes: st.Bytes}, nil
}

// canKeep says why the desktop cannot keep end states, if it cannot.
func (d *Desktop) canKeep() error {
	switch {
	case d.cfg.EndStates == "":
		return fmt.Errorf("%w: no directory for end states (Config.EndStates)", desktop.ErrUnsupported)
	case d.vm == nil:
		return fmt.Errorf("%w: a guest given by URL cannot keep end states: run VMs", desktop.ErrUnsupported)
	case !d.vm.Forkable():
		return fmt.Errorf("%w: keeping end states needs legato to run as root, with VMs on this machine", desktop.ErrUnsupported)
	}
	return nil
}

// DropEndState deletes a kept end state, whichever desktop kept it.
func (d *Desktop) DropEndState(ctx context.Context, ref string) error {
	dir, err := d.endStateDir(ref)
	if err != nil {
		return err
	}
	if err := safeopen.CheckDir(d.cfg.EndStates); errors.Is(err, safeopen.ErrUnsafe) {
		return fmt.Errorf("drop end state %s: %w", ref, err)
	}
	if _, err := os.Lstat(dir); errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%w: %s", desktop.ErrNoEndState, ref)
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("drop end state %s: %w", ref, err)
	}
	return nil
}

// GradeEndState brings the kept state ref back in a clone on this
// desktop's ports (its VM parks meanwhile, as for a forked golden state)
// and grades it with task's evaluator as it is now; last is the
// attempt's last action (an infeasible task's grade is whether it was
// FAIL). The clone goes when the grade is done.
func (d *Desktop) GradeEndState(ctx context.Context, ref string, task desktop.Task, last desktop.Action) (float64, error) {
	ctx, done, err := d.begin(ctx)
	if err != nil {
		return 0, err
	}
	defer done()
	dir, err := d.endStateDir(ref)
	if err != nil {
		return 0, err
	}
	// Its files are opened the same way (vm.LoadKept).
	switch err := safeopen.CheckDir(dir); {
	case errors.Is(err, fs.ErrNotExist):
		return 0, fmt.Errorf("%w: %s", desktop.ErrNoEndState, ref)
	case err != nil:
		return 0, fmt.Errorf("end state %s: %w", ref, err)
	}
	if err := d.canKeep(); err != nil {
		return 0, err
	}
	if err := d.checkTask(task); err != nil {
		return 0, d.fail("grade end state", err)
	}
	t0 := time.Now()
	t, err := d.vm.LoadKept(ctx, dir)
	if err != nil {
		return 0, d.fail("grade end state", fmt.Errorf("end state %s: %w", ref, err))
	}
	// Close ends it too: its files are on tmpfs.
	f := &d.golden.fork
	if !f.hold(func() { f.kept = t }) {
		t.Close()
		return 0, d.fail("grade end state", desktop.ErrClosed)
	}
	defer func() {
		f.hold(func() { f.kept = nil })
		t.Close()
	}()
	defer func() {
		// The VM takes its ports back whatever happened, so the
		// desktop serves its next call.
		if err := d.endClone(context.WithoutCancel(ctx), false); err != nil {
			d.log.Warn("after grading a kept end state", "err", err)
		}
	}()
	if err := d.forkKept(ctx, t); err != nil {
		return 0, d.fail("bring the end state back", err)
	}
	t1 := time.Now()
	d.pending = nil
	d.lastAction = last
	r, err := d.grader.Evaluate(ctx, task, last)
	d.mu.Lock()
	d.lastGrading = r.Metrics
	d.mu.Unlock()
	if err != nil {
		return 0, d.fail("evaluate", err)
	}
	d.log.Info("graded a kept end state", "ref", ref, "task", task.ID, "score", r.Score,
		"load", t1.Sub(t0), "grade", time.Since(t1))
	return r.Score, nil
}

// forkKept runs a clone of the kept state's template on the desktop's
// ports, with the guest's clock set to now.
func (d *Desktop) forkKept(ctx context.Context, t *vm.Template) error {
	if err := d.endClone(ctx, true); err != nil {
		return err
	}
	if err := d.park(ctx); err != nil {
		return err
	}
	return d.restore(ctx, resetKeptState, func(ctx context.Context) error {
		c, err := t.Fork(ctx)
		if err != nil {
			return err
		}
		return d.serveClone(ctx, c)
	}, newSeed())
}

// endStateDir is the directory of ref, refusing a ref that is not an
// osworld end state's name (it must not name another file).
func (d *Desktop) endStateDir(ref string) (string, error) {
	if !desktop.IsEndStateRef(endStatePrefix, ref) {
		return "", fmt.Errorf("%q is not the name of an osworld desktop's kept end state", ref)
	}
	if d.cfg.EndStates == "" {
		return "", fmt.Errorf("%w: no directory for end states (Config.EndStates)", desktop.ErrUnsupported)
	}
	return filepath.Join(d.cfg.EndStates, ref), nil
}
