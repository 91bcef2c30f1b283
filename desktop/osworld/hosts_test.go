package osworld

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"legato/rl/desktop/osworld/hostdns"
	"legato/rl/desktop/osworld/hostdns/dnstest"
	"legato/rl/desktop/osworld/vm"
)

func TestPickHost(t *testing.T) {
	for _, tt := range []struct {
		name  string
		hosts []hostLoad
		want  int
	}{
		{"none", nil, -1},
		{"most free slots", []hostLoad{{true, 4, 3}, {true, 4, 1}, {true, 8, 6}}, 1},
		{"no cap beats any cap", []hostLoad{{true, 64, 0}, {true, 0, 10}}, 1},
		{"ties: fewest desktops", []hostLoad{{true, 4, 2}, {true, 3, 1}}, 1},
		{"ties: the first", []hostLoad{{true, 2, 1}, {true, 2, 1}}, 0},
		{"uncapped ties: fewest desktops", []hostLoad{{true, 0, 3}, {true, 0, 2}}, 1},
		{"down hosts take none", []hostLoad{{false, 8, 0}, {true, 2, 1}}, 1},
		{"full hosts take none", []hostLoad{{true, 2, 2}, {false, 2, 0}}, -1},
		{"over a cap (a cap lowered) takes none", []hostLoad{{true, 1, 2}}, -1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := pickHost(tt.hosts); got != tt.want {
				t.Errorf("pickHost(%+v) = %d, want %d", tt.hosts, got, tt.want)
			}
		})
	}
}

// testHostPool is a pool of hosts that are never dialed: placement,
// waiting and marking down need none.
func testHostPool(t *testing.T, caps ...int) *Pool {
	t.Helper()
	p := &Pool{cfg: Config{HostWait: time.Minute, HostRetryMax: 8 * time.Second}.withDefaults(),
		log: slog.New(slog.DiscardHandler), open: map[*Desktop]int{}, changed: make(chan struct{})}
	p.stopCtx, p.stopNow = context.WithCancel(context.Background())
	for i, c := range caps {
		h, err := vm.OpenHost(vm.HostSpec{URI: "qemu+unix:///system?socket=/nonexistent", Name: "h" + string(rune('1'+i))}, vm.Config{}, vm.HostOptions{})
		if err != nil {
			t.Fatal(err)
		}
		p.hosts = append(p.hosts, &poolHost{h: h, cap: c, vms: map[string]bool{}})
	}
	return p
}

// A desktop goes to the host with the most free slots, waits while every
// host is full or down, and gets a slot as soon as one is released or a
// host comes back; the wait is bounded.
func TestAcquireSpreadsAndWaits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testHostPool(t, 1, 2)
		ctx := t.Context()
		var got []string
		for range 3 {
			ph, err := p.acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, ph.name())
		}
		if strings.Join(got, ",") != "h2,h1,h2" {
			t.Errorf("placement %v, want h2,h1,h2 (most free slots first)", got)
		}

		// Every slot is taken: the next desktop waits for a release.
		type result struct {
			ph  *poolHost
			err error
		}
		done := make(chan result, 1)
		go func() { ph, err := p.acquire(ctx); done <- result{ph, err} }()
		synctest.Wait()
		select {
		case r := <-done:
			t.Fatalf("acquire with every slot taken returned %v, %v", r.ph, r.err)
		default:
		}
		p.release(p.hosts[0], "")
		if r := <-done; r.err != nil || r.ph != p.hosts[0] {
			t.Fatalf("after h1's release: %v, %v; want h1", r.ph, r.err)
		}

		// h2 goes down with its desktops: it takes none until it is back,
		// and the wait for it ends at HostWait.
		p.hostDown(p.hosts[1], errors.New("connection reset"))
		p.release(p.hosts[1], "")
		p.release(p.hosts[1], "")
		start := time.Now()
		if _, err := p.acquire(ctx); err == nil || !strings.Contains(err.Error(), "h2 down (connection reset") || !strings.Contains(err.Error(), "h1 full") {
			t.Errorf("acquire with h1 full and h2 down: %v; want an error naming both", err)
		}
		if waited := time.Since(start); waited != p.cfg.HostWait {
			t.Errorf("waited %v, want HostWait %v", waited, p.cfg.HostWait)
		}
		p.mu.Lock()
		backoff, unclean := p.hosts[1].backoff, p.hosts[1].unclean
		p.mu.Unlock()
		if backoff != hostRetryMin || !unclean {
			t.Errorf("h2 down: backoff %v, unclean %v; want %v and true (it had desktops)", backoff, unclean, hostRetryMin)
		}
		for _, want := range []time.Duration{2 * time.Second, 4 * time.Second, 8 * time.Second, 8 * time.Second} {
			p.hostDown(p.hosts[1], errors.New("still down"))
			if p.hosts[1].backoff != want {
				t.Errorf("backoff %v after another failed try, want %v", p.hosts[1].backoff, want)
			}
		}

		go func() { ph, err := p.acquire(ctx); done <- result{ph, err} }()
		synctest.Wait()
		p.mu.Lock()
		p.hosts[1].down = false
		p.notifyLocked()
		p.mu.Unlock()
		if r := <-done; r.err != nil || r.ph != p.hosts[1] {
			t.Fatalf("after h2 came back: %v, %v; want h2", r.ph, r.err)
		}

		// Closing the pool ends a wait at once.
		if ph, err := p.acquire(ctx); err != nil || ph != p.hosts[1] {
			t.Fatalf("h2's second slot: %v, %v", ph, err)
		}
		go func() { ph, err := p.acquire(ctx); done <- result{ph, err} }()
		synctest.Wait()
		p.mu.Lock()
		p.closed = true
		p.notifyLocked()
		p.mu.Unlock()
		if r := <-done; r.err == nil {
			t.Error("acquire on a closed pool succeeded")
		}
		p.closeHosts()
	})
}

func TestSlots(t *testing.T) {
	for _, tt := range []struct {
		name string
		cfg  Config
		want int
	}{
		{"guests", Config{Guests: []GuestAddr{{URL: "http://a:1"}, {URL: "http://b:1"}}}, 2},
		{"one local host", Config{}, 0},
		{"capped hosts", Config{VM: vm.Config{Hosts: []vm.HostSpec{{URI: "qemu:///system", Desktops: 2}, {URI: "qemu+ssh://h/system", Desktops: 3}}}}, 5},
		{"an uncapped host", Config{VM: vm.Config{Hosts: []vm.HostSpec{{URI: "qemu:///system", Desktops: 2}, {URI: "qemu+ssh://h/system"}}}}, 0},
		{"capped hosts from DNS", Config{HostsFrom: &hostdns.Source{Name: "hosts.test", Desktops: 2}}.withDefaults(), 0},
	} {
		if got := tt.cfg.Slots(); got != tt.want {
			t.Errorf("%s: Slots = %d, want %d", tt.name, got, tt.want)
		}
	}
}

// A forward passes connections to the address a host's dialer reaches,
// both ways, and closing it ends every connection it holds.
func TestForward(t *testing.T) {
	web := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "through "+r.URL.Path)
	}))
	defer web.Close()
	var dials atomic.Int32
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		dials.Add(1)
		var d net.Dialer
		return d.DialContext(ctx, network, web.Listener.Addr().String()) // the "host's" view of addr
	}
	var fs forwards
	port, err := fs.add(dial, "127.0.0.1", 5000)
	if err != nil {
		t.Fatal(err)
	}
	if none, err := fs.add(dial, "127.0.0.1", 0); none != 0 || err != nil {
		t.Errorf("a forward of no port: %d, %v; want none", none, err)
	}
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	for range 2 {
		resp, err := client.Get("http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) + "/platform")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(b) != "through /platform" {
			t.Errorf("through the forward: %q", b)
		}
	}
	if n := dials.Load(); n != 2 {
		t.Errorf("%d dials for 2 connections", n)
	}
	// A connection still open when the forward closes is closed with it.
	c, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fs.close()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Error("a connection through a closed forward still reads")
	}
	if _, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port))); err == nil {
		t.Error("a closed forward still accepts")
	}
}

// waitHosts waits until the pool's hosts are as ok wants them, waking on
// each change of a host's state or load, and returns them.
func waitHosts(t *testing.T, p *Pool, what string, ok func(map[string]HostStatus) bool) map[string]HostStatus {
	t.Helper()
	deadline := time.After(time.Minute)
	for {
		p.mu.Lock()
		changed := p.changed
		p.mu.Unlock()
		hs := map[string]HostStatus{}
		for _, h := range p.Hosts() {
			hs[h.Name] = h
		}
		if ok(hs) {
			return hs
		}
		select {
		case <-changed:
		case <-deadline:
			t.Fatalf("%s: not within a minute; hosts %+v", what, hs)
		}
	}
}

// Hosts from DNS follow the name's records during the batch: a host that
// joins is prepared in the background, then takes desktops; one that
// leaves takes no new desktop while the desktop on it keeps its slot
// (its attempt goes on) and asks to be replaced; a leaving host that is
// back takes desktops again; once a leaving host has no desktop it is
// dropped, and if it joins again it is prepared again. The hosts' SSH is
// never dialed: preparing them is the test's.
func TestHostsFromDNS(t *testing.T) {
	dns := dnstest.Start(t)
	const name = "hosts.legato.test"
	const h1, h2 = "192.0.2.1", "192.0.2.2" // TEST-NET-1: never reached
	dns.SetA(name, h1)
	img := filepath.Join(t.TempDir(), "base.qcow2")
	if err := os.WriteFile(img, []byte("image"), 0o644); err != nil {
		t.Fatal(err)
	}
	p := testHostPool(t)
	p.cfg.VM.Hosts, p.cfg.VM.BaseImage, p.cfg.VM.HashCache = nil, img, "-"
	p.cfg.HostsFrom = &hostdns.Source{Name: name, User: "root", Desktops: 2, Every: hostdns.MinEvery, Resolver: dns.Resolver()}
	p.cfg.HostWait = 100 * time.Millisecond
	prepared := make(chan string, 8)
	p.prepare = func(_ context.Context, ph *poolHost, leftBy string) error {
		prepared <- ph.name() + " (" + leftBy + ")"
		return nil
	}
	if err := p.openHosts(t.Context()); err != nil {
		t.Fatal(err)
	}
	defer func() {
		p.mu.Lock()
		p.closed = true
		p.notifyLocked()
		p.mu.Unlock()
		if err := p.closeHosts(); err != nil {
			t.Error(err)
		}
	}()
	nextPrepared := func(want string) {
		t.Helper()
		select {
		case got := <-prepared:
			if got != want {
				t.Errorf("prepared %s, want %s", got, want)
			}
		case <-time.After(time.Minute):
			t.Fatalf("%s was not prepared within a minute", want)
		}
	}
	nextPrepared(h1 + " (an earlier run)")
	ctx := t.Context()
	onH1, err := p.acquire(ctx)
	if err != nil || onH1.name() != h1 {
		t.Fatalf("first desktop: %v, %v; want %s", onH1, err, h1)
	}
	if uri := onH1.h.Spec().URI; uri != "qemu+ssh://root@"+h1+":22/system" {
		t.Errorf("host from DNS: URI %s", uri)
	}
	retiring := (&Desktop{leaving: p.leavingOf(onH1)}).Retiring

	// h2 joins: prepared, then it takes desktops.
	dns.SetA(name, h1, h2)
	nextPrepared(h2 + " (an earlier run)")
	waitHosts(t, p, h2+" up", func(hs map[string]HostStatus) bool { return len(hs) == 2 && !hs[h2].Down })
	if ph, err := p.acquire(ctx); err != nil || ph.name() != h2 {
		t.Fatalf("a desktop after %s joined: %v, %v; want %s (most free slots)", h2, ph, err, h2)
	}

	// h1 leaves: it keeps its desktop, which asks to be replaced, and
	// takes no new one though it has a free slot (and would win the tie).
	dns.SetA(name, h2)
	hs := waitHosts(t, p, h1+" leaving", func(hs map[string]HostStatus) bool { return hs[h1].Leaving })
	if hs[h1].InUse != 1 || hs[h1].Down || !retiring() {
		t.Errorf("%s leaving: %+v, its desktop retiring %v; want its desktop kept, the host not down, and the desktop asking to be replaced", h1, hs[h1], retiring())
	}
	if ph, err := p.acquire(ctx); err != nil || ph.name() != h2 {
		t.Fatalf("a desktop with %s leaving: %v, %v; want %s", h1, ph, err, h2)
	}
	if ph, err := p.acquire(ctx); err == nil || !strings.Contains(err.Error(), h1+" leaving (gone from the DNS name; 1 desktops finishing)") {
		t.Errorf("a desktop with %s leaving and %s full: %v, %v; want none, naming %s leaving", h1, h2, ph, err, h1)
	}

	// h1 is back before its desktop ended: it takes desktops again.
	dns.SetA(name, h1, h2)
	waitHosts(t, p, h1+" back", func(hs map[string]HostStatus) bool { return !hs[h1].Leaving })
	if retiring() {
		t.Errorf("the desktop on %s, back in DNS, still asks to be replaced", h1)
	}
	again, err := p.acquire(ctx)
	if err != nil || again != onH1 {
		t.Fatalf("a desktop after %s came back: %v, %v; want it", h1, again, err)
	}
	p.release(again, "")

	// h1 leaves again; once its desktop is closed, it is dropped, its
	// connection closed; joining again, it is prepared again.
	dns.SetA(name, h2)
	waitHosts(t, p, h1+" leaving again", func(hs map[string]HostStatus) bool { return hs[h1].Leaving })
	p.release(onH1, "")
	waitHosts(t, p, h1+" dropped", func(hs map[string]HostStatus) bool { _, ok := hs[h1]; return !ok })
	p.mu.Lock()
	gone := onH1.gone
	p.mu.Unlock()
	if !gone {
		t.Errorf("%s dropped but not marked gone", h1)
	}
	dns.SetA(name, h1, h2)
	nextPrepared(h1 + " (an earlier run)")
	waitHosts(t, p, h1+" up again", func(hs map[string]HostStatus) bool { h, ok := hs[h1]; return ok && !h.Down })
	if ph, err := p.acquire(ctx); err != nil || ph.name() != h1 || ph == onH1 {
		t.Errorf("a desktop after %s joined again: %v, %v; want it, as a new host", h1, ph, err)
	}
}
