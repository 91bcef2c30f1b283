package osworld

import (
	"errors"
	"log/slog"
	"slices"
	"testing"

	"legato/rl/desktop/osworld/vm"
)

// keys lists the registry's templates.
func (s *forkTemplates) keys() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var ks []string
	for k := range s.byKey {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

func newFT(key string) *forkTemplate { return &forkTemplate{t: &vm.Template{}, key: key, task: key} }

// closed reports whether a registry closed ft's template.
func closed(t *testing.T, ft *forkTemplate) bool {
	t.Helper()
	_, err := ft.t.Fork(t.Context())
	return errors.Is(err, vm.ErrClosed)
}

// The pool's templates: the first of a key stays, the least recently used
// idle one goes beyond max (never the one just taken), one an attempt
// runs in stays until released, a dropped one is unlisted at once and
// closed when its last attempt ends, close empties it.
func TestForkTemplates(t *testing.T) {
	s := newForkTemplates(2, slog.New(slog.DiscardHandler))
	a, b, c := newFT("a"), newFT("b"), newFT("c")
	s.add(a)
	dup := newFT("a")
	s.add(dup) // another desktop took one at once: the first stays
	if !closed(t, dup) || closed(t, a) {
		t.Error("of two templates of one key, the second must close and the first stay")
	}
	s.add(b)
	if got, n := s.acquire("a"); got != a || n != 1 {
		t.Fatalf("acquire a = %p (fork %d), want the first one added %p, fork 1", got, n, a)
	}
	s.add(c) // b is the least recently used idle one
	if got := s.keys(); !slices.Equal(got, []string{"a", "c"}) {
		t.Errorf("after a third template with a in use: %q, want [a c]", got)
	}
	if !closed(t, b) {
		t.Error("the evicted template is not closed")
	}
	// All in use: beyond max, only the one just taken is idle, and stays.
	if got, _ := s.acquire("c"); got != c {
		t.Fatal("acquire c")
	}
	s.add(newFT("d"))
	if got := s.keys(); !slices.Equal(got, []string{"a", "c", "d"}) {
		t.Errorf("with a and c in use: %q, want [a c d]: the one just taken stays", got)
	}
	s.release(a)
	if got := s.keys(); !slices.Equal(got, []string{"c", "d"}) {
		t.Errorf("after a was released: %q, want [c d]", got)
	}
	if s.has("a") || !s.has("c") {
		t.Error("has disagrees with the templates")
	}
	if got, _ := s.acquire("a"); got != nil {
		t.Error("acquire of an evicted template")
	}
	// c's fork failed on one desktop while another's attempt runs in it.
	s.drop(c, "test")
	if got := s.keys(); !slices.Equal(got, []string{"d"}) {
		t.Errorf("after dropping c: %q", got)
	}
	if closed(t, c) {
		t.Error("a dropped template closed under an attempt that runs in it")
	}
	s.release(c)
	if !closed(t, c) {
		t.Error("a dropped template not closed when its last attempt ended")
	}
	// A template whose clones start but never serve goes after
	// maxFailedForks in a row; one that serves in between stays.
	f := newFT("f")
	if s.forkDone(f, false) || s.forkDone(f, true) || s.forkDone(f, false) {
		t.Error("a template dropped before maxFailedForks failures in a row")
	}
	if !s.forkDone(f, false) {
		t.Errorf("a template kept after %d failed forks in a row", maxFailedForks)
	}
	if !s.needsCheck(newFT("x")) {
		t.Error("a new template needs its check")
	}
	d := newFT("d2")
	if !s.needsCheck(d) || s.needsCheck(d) {
		t.Error("a template is checked once")
	}
	if err := s.close(); err != nil {
		t.Fatal(err)
	}
	if len(s.keys()) != 0 {
		t.Error("templates left after close")
	}
	e := newFT("e")
	s.add(e)
	if s.has("e") || !closed(t, e) {
		t.Error("a template added after close is kept")
	}
	var nilSet *forkTemplates
	if ft, _ := nilSet.acquire("a"); nilSet.has("a") || ft != nil || nilSet.close() != nil {
		t.Error("a nil registry (no Golden.Fork) must have nothing")
	}
}
