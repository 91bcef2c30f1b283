package hostagent

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"legato/rl/desktop/osworld/vm"
)

// fakeForker is a Forker in memory: its templates and clones are names,
// and it records what ended.
type fakeForker struct {
	mu       sync.Mutex
	n        int
	live     map[string]bool // templates and clones not closed
	reserved map[int]bool
	clones   []*fakeClone
	// forkErr, if set, is every Fork's error.
	forkErr error
	// forkGate, if set, holds every Fork until it is closed, whatever
	// the request's ctx says.
	forkGate chan struct{}
	forking  chan struct{} // gets a value when a Fork waits at the gate
	closed   chan string   // gets each name that closes
}

func newFakeForker() *fakeForker {
	return &fakeForker{live: map[string]bool{}, reserved: map[int]bool{}, closed: make(chan string, 100), forking: make(chan struct{}, 10)}
}

func (f *fakeForker) Template(ctx context.Context, d vm.DomainRef) (Template, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.n++
	t := &fakeTemplate{f: f, name: fmt.Sprintf("legato-fork-%d", f.n)}
	f.live[t.name] = true
	return t, nil
}

func (f *fakeForker) Reserve(p vm.Ports, on bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, port := range []int{p.Guest, p.DevTools, p.VLC} {
		f.reserved[port] = on
	}
}

func (f *fakeForker) Sweep() ([]string, error) {
	return []string{"/dev/shm/legato-fork/legato-fork-0"}, nil
}

func (f *fakeForker) ForkDir() string { return "/dev/shm/fake" }

// liveNames lists what is not closed.
func (f *fakeForker) liveNames() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for n, ok := range f.live {
		if ok {
			out = append(out, n)
		}
	}
	return out
}

func (f *fakeForker) end(name string) {
	f.mu.Lock()
	was := f.live[name]
	f.live[name] = false
	f.mu.Unlock()
	if was {
		f.closed <- name
	}
}

type fakeTemplate struct {
	f    *fakeForker
	name string
	seq  int
}

func (t *fakeTemplate) Name() string                              { return t.name }
func (t *fakeTemplate) Timings() vm.TemplateTimings               { return vm.TemplateTimings{RAMBytes: 42 << 20} }
func (t *fakeTemplate) Prestart(ctx context.Context, n int) error { return nil }
func (t *fakeTemplate) CheckRAM(ctx context.Context) error        { return nil }
func (t *fakeTemplate) Close() error                              { t.f.end(t.name); return nil }
func (t *fakeTemplate) Fork(ctx context.Context) (Clone, error) {
	f := t.f
	if f.forkGate != nil {
		f.forking <- struct{}{}
		<-f.forkGate
	}
	if f.forkErr != nil {
		return nil, f.forkErr
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	t.seq++
	c := &fakeClone{f: f, name: fmt.Sprintf("%s-c%d", t.name, t.seq), ports: vm.Ports{Guest: 40000 + t.seq, DevTools: 41000 + t.seq, VLC: 42000 + t.seq}}
	f.live[c.name] = true
	f.clones = append(f.clones, c)
	return c, nil
}

type fakeClone struct {
	f         *fakeForker
	name      string
	ports     vm.Ports
	mu        sync.Mutex
	forwarded []vm.Ports
}

func (c *fakeClone) Name() string                   { return c.name }
func (c *fakeClone) Ports() vm.Ports                { return c.ports }
func (c *fakeClone) PID() int                       { return 4242 }
func (c *fakeClone) Restore() time.Duration         { return 300 * time.Millisecond }
func (c *fakeClone) Started() (time.Duration, bool) { return time.Second, true }
func (c *fakeClone) Close() error                   { c.f.end(c.name); return nil }
func (c *fakeClone) Forward(ctx context.Context, p vm.Ports) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.forwarded = append(c.forwarded, p)
	return nil
}

// clone returns the clone of the name the fake made.
func (f *fakeForker) clone(t *testing.T, name string) *fakeClone {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range f.clones {
		if c.name == name {
			return c
		}
	}
	t.Fatalf("no clone %q", name)
	return nil
}

func (f *fakeForker) isReserved(port int) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.reserved[port]
}

// nextClosed waits for the next name that closes.
func (f *fakeForker) nextClosed(t *testing.T) string {
	t.Helper()
	return recv(t, f.closed)
}
