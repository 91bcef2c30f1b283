package rl

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"legato/rl/desktop"
	"legato/rl/internal/backoff"
)

// maxDesktopStarts bounds how often in a row a worker tries to create a
// desktop before it gives up its slot.
const maxDesktopStarts = 3

// desktopRetry is the wait after each failed try to create a desktop: 1 s,
// then doubling (the cap is never reached within maxDesktopStarts).
var desktopRetry = backoff.Policy{Base: time.Second, Max: time.Minute}

// worker owns one desktop slot for the whole batch: it creates the slot's
// desktop, replaces it when it failed, and closes it at the end.
type worker struct {
	slot     int
	create   desktop.Factory
	workLeft func(context.Context) bool
	log      *slog.Logger
	desk     desktop.Desktop
}

// desktop returns the slot's desktop, creating one if it has none or if
// the one it has asks to be replaced (desktop.Retirer). It returns nil and
// no error when no work is left or ctx is done, and nil and why when no
// desktop could be created (the worker then gives up its slot).
func (w *worker) desktop(ctx context.Context) (desktop.Desktop, error) {
	if r, ok := w.desk.(desktop.Retirer); ok && r.Retiring() {
		w.log.Info("replacing the slot's desktop: its machine is leaving", "slot", w.slot)
		w.discard()
	}
	var lastErr error
	for failures := 0; w.desk == nil; {
		// A replacement desktop may take minutes to boot: make none when
		// no attempt is left that could need it.
		if !w.workLeft(ctx) {
			return nil, nil
		}
		if failures >= maxDesktopStarts {
			w.log.Error("worker gives up its slot: no desktop could be created", "slot", w.slot, "tries", failures, "err", lastErr)
			return nil, fmt.Errorf("%w for slot %d after %d tries: %w", errNoDesktop, w.slot, failures, lastErr)
		}
		d, err := w.create(ctx, w.slot)
		if err == nil && d == nil {
			err = errors.New("the desktop factory returned no desktop and no error")
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil, nil
			}
			failures++
			lastErr = err
			w.log.Warn("create desktop", "slot", w.slot, "try", failures, "err", err)
			if backoff.Sleep(ctx, desktopRetry.Wait(failures-1)) != nil {
				return nil, nil
			}
			continue
		}
		w.desk = d
	}
	return w.desk, nil
}

// discard closes the desktop, which failed; the next call to desktop makes
// a new one.
func (w *worker) discard() {
	if w.desk == nil {
		return
	}
	if err := w.desk.Close(); err != nil {
		w.log.Warn("close desktop", "slot", w.slot, "err", err)
	}
	w.desk = nil
}

// onDesktops runs do(w, i) for i from 0 to n-1 on up to slots workers, each
// with its own desktop from create (made when first needed, made again
// after do discards it), and returns once every started call returned. It
// starts no call once ctx is done; the desktops are closed at the end.
func onDesktops(ctx context.Context, n, slots int, create desktop.Factory, log *slog.Logger, do func(w *worker, i int)) {
	next := make(chan int)
	var wg sync.WaitGroup
	for slot := range min(max(slots, 1), n) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w := &worker{slot: slot, create: create, workLeft: func(ctx context.Context) bool { return ctx.Err() == nil }, log: log}
			defer w.discard()
			for i := range next {
				do(w, i)
			}
		}()
	}
feed:
	for i := range n {
		select {
		case next <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
}
