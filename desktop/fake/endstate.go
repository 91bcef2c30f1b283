package fake

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"image"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"legato/rl/desktop"
	"legato/rl/internal/safeopen"
	"legato/rl/schema"
)

var (
	_ desktop.EndStateKeeper = (*Desktop)(nil)
	_ desktop.EndStateGrader = (*Desktop)(nil)
)

// endStatePrefix starts the name of every kept end state.
const endStatePrefix = "fake-end-"

// endState is a kept end state's file: what the screen and the grade are
// made of.
type endState struct {
	Task     string `json:"task"`
	TaskHash uint64 `json:"task_hash"`
	History  uint64 `json:"history"`
	// Target is a target task's target as [x0, y0, x1, y1], Click its
	// first click as [x, y]: all its grade is made of.
	Target *[4]int `json:"target,omitempty"`
	Click  *[2]int `json:"click,omitempty"`
}

// targetOf returns a kept end state's target and the pointer its grade
// reads.
func (st endState) targetOf() (image.Rectangle, pointer) {
	var t image.Rectangle
	var p pointer
	if st.Target != nil {
		t = image.Rect(st.Target[0], st.Target[1], st.Target[2], st.Target[3])
	}
	if st.Click != nil {
		p = pointer{clicked: true, click: image.Pt(st.Click[0], st.Click[1]), at: image.Pt(st.Click[0], st.Click[1])}
	}
	return t, p
}

// KeepEndState writes the attempt's state to a file in Config.EndStates
// named by its content.
func (d *Desktop) KeepEndState(ctx context.Context, name string) (desktop.EndState, error) {
	if d.cfg.EndStates == "" {
		return desktop.EndState{}, fmt.Errorf("%w: the fake keeps no end states without Config.EndStates", desktop.ErrUnsupported)
	}
	if _, err := d.enter(ctx, PhaseEvaluate, "", true); err != nil {
		return desktop.EndState{}, err
	}
	d.mu.Lock()
	st := endState{Task: d.cur.task, TaskHash: d.cur.taskHash, History: d.cur.history}
	if t := d.cur.target; !t.Empty() {
		st.Target = &[4]int{t.Min.X, t.Min.Y, t.Max.X, t.Max.Y}
		if p := d.cur.ptr; p.clicked {
			st.Click = &[2]int{p.click.X, p.click.Y}
		}
	}
	d.mu.Unlock()
	b, err := json.Marshal(st)
	if err != nil {
		return desktop.EndState{}, err
	}
	sum := sha256.Sum256(b)
	ref := desktop.EndStateRef(endStatePrefix, sum[:])
	if err := os.MkdirAll(d.cfg.EndStates, 0o755); err != nil {
		return desktop.EndState{}, d.fail(PhaseEvaluate, err)
	}
	// Written where nobody else can redirect it, as it is read back.
	if err := safeopen.CheckDir(d.cfg.EndStates); err != nil {
		return desktop.EndState{}, fmt.Errorf("keep end state: %w", err)
	}
	// The writer of every file legato writes: whole or absent, with the
	// mode the user's umask gives.
	if _, err := schema.WriteFileAtomic(d.endStatePath(ref), func(w io.Writer) error {
		_, err := w.Write(b)
		return err
	}); err != nil {
		return desktop.EndState{}, d.fail(PhaseEvaluate, fmt.Errorf("keep end state: %w", err))
	}
	return desktop.EndState{Ref: ref, Bytes: int64(len(b))}, nil
}

// DropEndState deletes a kept end state.
func (d *Desktop) DropEndState(ctx context.Context, ref string) error {
	path, err := d.checkedEndStatePath(ref)
	if err != nil {
		return err
	}
	if err := safeopen.CheckDir(d.cfg.EndStates); errors.Is(err, safeopen.ErrUnsafe) {
		return fmt.Errorf("drop end state %s: %w", ref, err)
	}
	if err := os.Remove(path); errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%w: %s", desktop.ErrNoEndState, ref)
	} else if err != nil {
		return fmt.Errorf("drop end state %s: %w", ref, err)
	}
	return nil
}

// GradeEndState brings the kept state ref back and grades it with task's
// evaluator as it is now (an infeasible one scores whether last was FAIL),
// drawing the reward as Evaluate did for the attempt ctx carries.
func (d *Desktop) GradeEndState(ctx context.Context, ref string, task desktop.Task, last desktop.Action) (float64, error) {
	path, err := d.checkedEndStatePath(ref)
	if err != nil {
		return 0, err
	}
	b, err := safeopen.ReadFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return 0, fmt.Errorf("%w: %s", desktop.ErrNoEndState, ref)
	case errors.Is(err, safeopen.ErrUnsafe):
		// Not the desktop's fault: another may not read it either.
		return 0, fmt.Errorf("kept end state %s: %w", ref, err)
	case err != nil:
		return 0, d.fail(PhaseEvaluate, err)
	}
	var st endState
	if err := json.Unmarshal(b, &st); err != nil {
		return 0, fmt.Errorf("kept end state %s: %w", ref, err)
	}
	if st.Task != task.ID {
		return 0, fmt.Errorf("kept end state %s is of task %q, not %q", ref, st.Task, task.ID)
	}
	if _, isTarget, _ := ParseTarget(task.Evaluator); isTarget && st.Target == nil {
		return 0, fmt.Errorf("kept end state %s holds no target, but task %q is a %s task: it was kept before the task was one; collect it again", ref, task.ID, TargetFunc)
	}
	target, ptr := st.targetOf()
	d.mu.Lock()
	d.cur = attempt{hasTask: true, task: task.ID, infeasible: isInfeasible(task.Evaluator),
		taskHash: st.TaskHash, history: st.History, last: last, acted: last != desktop.Action{},
		target: target, ptr: ptr}
	d.mu.Unlock()
	return d.Evaluate(ctx, task)
}

func (d *Desktop) endStatePath(ref string) string {
	return filepath.Join(d.cfg.EndStates, ref+".json")
}

// checkedEndStatePath is the file of ref, refusing a ref that is not a
// fake end state's name (it must not name another file).
func (d *Desktop) checkedEndStatePath(ref string) (string, error) {
	if !desktop.IsEndStateRef(endStatePrefix, ref) {
		return "", fmt.Errorf("%q is not the name of a fake's kept end state", ref)
	}
	if d.cfg.EndStates == "" {
		return "", fmt.Errorf("%w: the fake has no Config.EndStates", desktop.ErrUnsupported)
	}
	return d.endStatePath(ref), nil
}
