package vm

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/digitalocean/go-libvirt"
	"github.com/google/go-cmp/cmp"
)

// testConn is a conn to the libvirtd at uri.
func testConn(t *testing.T, uri string, timeout time.Duration) *conn {
	t.Helper()
	h, err := OpenHost(HostSpec{URI: uri}, Config{CallTimeout: timeout}, HostOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return h.connect()
}

func lookup(ctx context.Context, c *conn, name string) (string, error) {
	var dom libvirt.Domain
	err := c.do(ctx, "look up domain", func(lv *libvirt.Libvirt) error {
		var err error
		dom, err = lv.DomainLookupByName(name)
		return err
	})
	return dom.Name, err
}

func TestConnAnswersAndClassifiesErrors(t *testing.T) {
	f := newFakeLibvirtd(t, false, func(_, proc int) fakeReply {
		return fakeReply{errCode: libvirtErrNoDomain, errMsg: "Domain not found: no domain with matching name 'gone'"}
	})
	c := testConn(t, f.uri(), 10*time.Second)
	defer c.close()
	_, err := lookup(t.Context(), c, "gone")
	if !isNoDomain(err) {
		t.Fatalf("lookup of a missing domain: got %v, want libvirt's no-domain error", err)
	}
	var e *Error
	if !errors.As(err, &e) || e.Op != "look up domain" {
		t.Errorf("error %v: want an *Error with op %q", err, "look up domain")
	}
	if isNotRunning(err) {
		t.Errorf("isNotRunning(%v) = true, want false", err)
	}
}

// A libvirtd that stops answering must not hang the caller: the call is cut
// off at CallTimeout, and the next call works on a new connection.
func TestConnHungCallIsCutOffAndRedials(t *testing.T) {
	f := newFakeLibvirtd(t, false, func(conn, proc int) fakeReply {
		if proc == procDomainLookup && conn == 0 {
			return fakeReply{hang: true}
		}
		return fakeReply{payload: xdrDomain("legato-0-abc")}
	})
	c := testConn(t, f.uri(), 300*time.Millisecond)
	defer c.close()
	_, err := lookup(t.Context(), c, "legato-0-abc")
	if !errors.Is(err, ErrTimeout) {
		t.Fatalf("hung call: got %v, want ErrTimeout", err)
	}
	name, err := lookup(t.Context(), c, "legato-0-abc")
	if err != nil {
		t.Fatalf("call after the cut-off: %v", err)
	}
	if diff := cmp.Diff("legato-0-abc", name); diff != "" {
		t.Errorf("domain name (-want +got):\n%s", diff)
	}
	if got := f.accepted(); got != 2 {
		t.Errorf("connections accepted = %d, want 2 (one cut off, one new)", got)
	}
}

func TestConnCallStopsWhenCtxIsCancelled(t *testing.T) {
	called := make(chan struct{}, 1)
	f := newFakeLibvirtd(t, false, func(_, proc int) fakeReply {
		called <- struct{}{}
		return fakeReply{hang: true}
	})
	c := testConn(t, f.uri(), time.Hour)
	defer c.close()
	ctx, cancel := context.WithCancel(t.Context())
	go func() {
		<-called // the call reached the daemon
		cancel()
	}()
	_, err := lookup(ctx, c, "x")
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want context.Canceled", err)
	}
}

func TestConnHandshakeHangIsBounded(t *testing.T) {
	f := newFakeLibvirtd(t, true, nil)
	c := testConn(t, f.uri(), 300*time.Millisecond)
	defer c.close()
	_, err := lookup(t.Context(), c, "x")
	if !errors.Is(err, ErrLibvirtUnavailable) || !errors.Is(err, ErrTimeout) {
		t.Fatalf("got %v, want ErrLibvirtUnavailable and ErrTimeout", err)
	}
}

func TestConnNoDaemon(t *testing.T) {
	c := testConn(t, "qemu+unix:///system?socket="+filepath.Join(t.TempDir(), "none"), time.Second)
	defer c.close()
	_, err := lookup(t.Context(), c, "x")
	if !errors.Is(err, ErrLibvirtUnavailable) || !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("got %v, want ErrLibvirtUnavailable wrapping a missing socket", err)
	}
}

// bounded's own logic, on a fake clock: the cut-off runs when the timeout
// passes, and bounded waits for fn to return.
func TestBoundedTimesOutAndWaits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		returned := false
		start := time.Now()
		err := bounded(t.Context(), 5*time.Second, func() error {
			<-release
			returned = true
			return errors.New("interrupted")
		}, func() { close(release) })
		if !errors.Is(err, ErrTimeout) {
			t.Errorf("got %v, want ErrTimeout", err)
		}
		if !returned {
			t.Error("bounded returned before fn did")
		}
		if got := time.Since(start); got != 5*time.Second {
			t.Errorf("cut off after %v, want 5s", got)
		}
	})
}

func TestBoundedReturnsFnResult(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		want := errors.New("boom")
		cut := false
		err := bounded(t.Context(), time.Second, func() error { return want }, func() { cut = true })
		if err != want || cut {
			t.Errorf("got err %v cut %v, want %v and no cut", err, cut, want)
		}
	})
}

func domainsReply(names ...string) []byte {
	b := xdrUint32(uint32(len(names)))
	for _, n := range names {
		b = append(b, xdrDomain(n)...)
	}
	return append(b, xdrUint32(uint32(len(names)))...)
}

func TestSweepRemovesPrefixedDomainsAndVolumes(t *testing.T) {
	const (
		procGetState     = 212
		procUndefine     = 231
		procDestroy      = 234
		procListDomains  = 273
		procPoolLookup   = 84
		procPoolRefresh  = 83
		procPoolIsActive = 154
		procPoolListVols = 282
		procVolLookup    = 95
		procVolDelete    = 94
		domainRunning    = 1
		libvirtErrNoVol  = 50
		pool             = "legato"
		prefix           = "legato-t-"
		otherPrefixed    = "other-0-0000ab11"
		longerPrefix     = prefix + "x-0-0000ab12" // another run's prefix that starts with this one
		runningLeftover  = prefix + "0-000000aa"
		secondLeftover   = prefix + "1-000000bb"
		orphanOverlayVM  = prefix + "2-000000cc"
		kept             = prefix + "3-000000dd"
		imageVolume      = "legato-base-0123456789abcdef.qcow2"
		imageMarker      = imageVolume + ".sha256"
		unrelatedVolume  = "unrelated.qcow2"
		notesVolume      = prefix + "notes.txt"
	)
	var mu sync.Mutex
	vols := []string{runningLeftover + ".qcow2", orphanOverlayVM + ".qcow2",
		kept + ".qcow2", imageVolume, imageMarker, unrelatedVolume, notesVolume, longerPrefix + ".qcow2"}
	f := newFakeLibvirtd(t, false, nil)
	f.scriptArgs = func(_, proc int, args []byte) fakeReply {
		mu.Lock()
		defer mu.Unlock()
		switch proc {
		case procListDomains:
			return fakeReply{payload: domainsReply(runningLeftover, otherPrefixed, secondLeftover, longerPrefix, kept)}
		case procDomainLookup:
			return fakeReply{payload: xdrDomain("looked-up")}
		case procGetState:
			return fakeReply{payload: append(xdrUint32(domainRunning), xdrUint32(1)...)}
		case procDestroy:
			return fakeReply{errCode: libvirtErrOpInvalid, errMsg: "domain is not running"}
		case procUndefine, procPoolRefresh:
			return fakeReply{}
		case procPoolLookup:
			return fakeReply{payload: xdrPool(pool)}
		case procPoolIsActive:
			return fakeReply{payload: xdrUint32(1)}
		case procPoolListVols:
			b := xdrUint32(uint32(len(vols)))
			for _, v := range vols {
				b = append(b, xdrVol(pool, v)...)
			}
			return fakeReply{payload: append(b, xdrUint32(uint32(len(vols)))...)}
		case procVolLookup:
			_, rest := xdrReadString(args) // the pool's name
			name, _ := xdrReadString(rest[16:])
			if !slices.Contains(vols, name) {
				return fakeReply{errCode: libvirtErrNoVol, errMsg: "Storage volume not found: " + name}
			}
			return fakeReply{payload: xdrVol(pool, name)}
		case procVolDelete:
			_, rest := xdrReadString(args)
			name, _ := xdrReadString(rest)
			vols = slices.DeleteFunc(vols, func(v string) bool { return v == name })
			return fakeReply{}
		}
		return fakeReply{errCode: 1, errMsg: "unexpected call"}
	}
	h, err := OpenHost(HostSpec{URI: f.uri(), Name: "fake"}, Config{CallTimeout: 10 * time.Second}, HostOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()

	left, err := h.Leftovers(t.Context(), prefix)
	if err != nil {
		t.Fatal(err)
	}
	wantLeft := []Leftover{
		{Host: "fake", Name: runningLeftover, Domain: true, Running: true, Volumes: []string{runningLeftover + ".qcow2"}},
		{Host: "fake", Name: secondLeftover, Domain: true, Running: true},
		{Host: "fake", Name: orphanOverlayVM, Volumes: []string{orphanOverlayVM + ".qcow2"}},
		{Host: "fake", Name: kept, Domain: true, Running: true, Volumes: []string{kept + ".qcow2"}},
	}
	if diff := cmp.Diff(wantLeft, left); diff != "" {
		t.Errorf("Leftovers (-want +got):\n%s", diff)
	}

	removed, err := h.Sweep(t.Context(), prefix, func(name string) bool { return name == kept })
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{runningLeftover, secondLeftover, orphanOverlayVM}, removed); diff != "" {
		t.Errorf("Sweep removed (-want +got):\n%s", diff)
	}
	mu.Lock()
	defer mu.Unlock()
	wantVols := []string{kept + ".qcow2", imageVolume, imageMarker, unrelatedVolume, notesVolume, longerPrefix + ".qcow2"}
	if diff := cmp.Diff(wantVols, vols); diff != "" {
		t.Errorf("volumes kept (-want +got):\n%s", diff)
	}
	f.mu.Lock()
	destroys, undefines := f.calls[procDestroy], f.calls[procUndefine]
	f.mu.Unlock()
	if destroys != 2 || undefines != 2 {
		t.Errorf("destroy calls %d, undefine calls %d; want 2 each (the two swept domains)", destroys, undefines)
	}
}

func TestSweepRefusesBadPrefix(t *testing.T) {
	_, err := Sweep(t.Context(), Config{NamePrefix: "*"})
	if err == nil {
		t.Fatal("Sweep with prefix \"*\": want an error")
	}
}
