package osworld

import (
	"errors"
	"log/slog"
	"slices"
	"testing"

	"legato/rl/desktop"
	"legato/rl/desktop/osworld/vm"
	"legato/rl/desktop/osworld/vm/hostagent"
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

func newFT(key string) *forkTemplate {
	return &forkTemplate{t: hostagent.LocalTemplate(&vm.Template{}), key: key, task: key}
}

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

// Templates are per host: a golden key's template on one host is not one
// on another, and where a task's templates are says which desktops start
// its attempts fastest, once the pool spans hosts.
func TestForkTemplatesPerHost(t *testing.T) {
	s := newForkTemplates(4, slog.New(slog.DiscardHandler))
	ft := newFT(templateKey("h1", "k"))
	ft.host, ft.task = "h1", "task-1"
	s.add(ft)
	if !s.has(templateKey("h1", "k")) || s.has(templateKey("h2", "k")) {
		t.Error("a template taken on h1 must be h1's only")
	}
	if got, _ := s.acquire(templateKey("h2", "k")); got != nil {
		t.Error("a desktop on h2 acquired h1's template")
	}
	for _, tc := range []struct {
		spread     bool
		host, task string
		want       desktop.Affinity
	}{
		{false, "h1", "task-1", desktop.AnyDesktop},
		{true, "h1", "task-1", desktop.HereFaster},
		{true, "h2", "task-1", desktop.ElsewhereFaster},
		{true, "h2", "task-2", desktop.AnyDesktop},
	} {
		s.spread = tc.spread
		if got := s.affinity(tc.task, tc.host); got != tc.want {
			t.Errorf("spread %v: affinity of a desktop on %s to %s = %v, want %v", tc.spread, tc.host, tc.task, got, tc.want)
		}
	}
	var none *forkTemplates
	if got := none.affinity("task-1", "h1"); got != desktop.AnyDesktop {
		t.Errorf("a desktop that does not fork: %v", got)
	}
}

func TestAffinityOf(t *testing.T) {
	for _, tc := range []struct {
		name    string
		holders []string
		host    string
		want    desktop.Affinity
	}{
		{"no template", nil, "h1", desktop.AnyDesktop},
		{"on this host", []string{"h1"}, "h1", desktop.HereFaster},
		{"here and elsewhere", []string{"h2", "h1"}, "h1", desktop.HereFaster},
		{"only elsewhere", []string{"h2", "h3"}, "h1", desktop.ElsewhereFaster},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := affinityOf(tc.holders, tc.host); got != tc.want {
				t.Errorf("affinityOf(%q, %q) = %v, want %v", tc.holders, tc.host, got, tc.want)
			}
		})
	}
}

// A VM starts forkable for the pool's templates here, or on a remote host
// whose agent answers; for kept end states only here.
func TestForkVM(t *testing.T) {
	for _, tc := range []struct {
		name                      string
		fork, keep, remote, agent bool
		want                      bool
	}{
		{"no fork, no keep", false, false, false, false, false},
		{"fork here", true, false, false, false, true},
		{"keep here", false, true, false, false, true},
		{"fork on a remote host with an agent", true, false, true, true, true},
		{"fork on a remote host without one", true, false, true, false, false},
		{"keep on a remote host", false, true, true, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := forkVM(tc.fork, tc.keep, tc.remote, tc.agent); got != tc.want {
				t.Errorf("forkVM = %v, want %v", got, tc.want)
			}
		})
	}
}
