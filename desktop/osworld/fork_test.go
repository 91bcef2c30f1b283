package osworld

import (
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

// The pool's templates: the first of a key stays, the least recently used
// idle one goes beyond max, one an attempt runs in stays until released,
// a dropped one goes, close empties it.
func TestForkTemplates(t *testing.T) {
	s := newForkTemplates(2, slog.New(slog.DiscardHandler))
	a, b, c := newFT("a"), newFT("b"), newFT("c")
	s.add(a)
	s.add(newFT("a")) // another desktop took one at once: the first stays
	s.add(b)
	if got := s.acquire("a"); got != a {
		t.Fatalf("acquire a = %p, want the first one added %p", got, a)
	}
	s.add(c) // b is the least recently used idle one
	if got := s.keys(); !slices.Equal(got, []string{"a", "c"}) {
		t.Errorf("after a third template with a in use: %q, want [a c]", got)
	}
	// All in use: beyond max, nothing can go until released.
	if s.acquire("c") != c {
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
	if s.acquire("a") != nil {
		t.Error("acquire of an evicted template")
	}
	s.drop(c, "test")
	if got := s.keys(); !slices.Equal(got, []string{"d"}) {
		t.Errorf("after dropping c: %q", got)
	}
	s.release(c) // the desktop that ran in it ends its attempt
	if err := s.close(); err != nil {
		t.Fatal(err)
	}
	if len(s.keys()) != 0 {
		t.Error("templates left after close")
	}
	s.add(newFT("e"))
	if s.has("e") {
		t.Error("a template added after close is kept")
	}
	var nilSet *forkTemplates
	if nilSet.has("a") || nilSet.acquire("a") != nil || nilSet.close() != nil {
		t.Error("a nil registry (no Golden.Fork) must have nothing")
	}
}
