package vm

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"testing/synctest"
	"time"

	"github.com/digitalocean/go-libvirt"
	"github.com/google/go-cmp/cmp"
)

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
	c, err := newConn(f.uri(), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.close()
	_, err = lookup(t.Context(), c, "gone")
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
	c, err := newConn(f.uri(), 300*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	defer c.close()
	_, err = lookup(t.Context(), c, "legato-0-abc")
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
	c, err := newConn(f.uri(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	defer c.close()
	ctx, cancel := context.WithCancel(t.Context())
	go func() {
		<-called // the call reached the daemon
		cancel()
	}()
	_, err = lookup(ctx, c, "x")
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want context.Canceled", err)
	}
}

func TestConnHandshakeHangIsBounded(t *testing.T) {
	f := newFakeLibvirtd(t, true, nil)
	c, err := newConn(f.uri(), 300*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	defer c.close()
	_, err = lookup(t.Context(), c, "x")
	if !errors.Is(err, ErrLibvirtUnavailable) || !errors.Is(err, ErrTimeout) {
		t.Fatalf("got %v, want ErrLibvirtUnavailable and ErrTimeout", err)
	}
}

func TestConnNoDaemon(t *testing.T) {
	c, err := newConn("qemu+unix:///system?socket="+filepath.Join(t.TempDir(), "none"), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.close()
	_, err = lookup(t.Context(), c, "x")
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

func TestSweepRemovesPrefixedDomainsAndFiles(t *testing.T) {
	const (
		procGetState    = 212
		procUndefine    = 231
		procDestroy     = 234
		procListDomains = 273
		domainRunning   = 1
		domainShutoff   = 5
		prefix          = "legato-t-"
		otherPrefixed   = "other-0-11"
		runningLeftover = prefix + "0-aa"
		secondLeftover  = prefix + "1-bb"
		orphanOverlayVM = prefix + "2-cc"
		unrelatedFile   = "unrelated.qcow2"
	)
	f := newFakeLibvirtd(t, false, func(_, proc int) fakeReply {
		switch proc {
		case procListDomains:
			return fakeReply{payload: domainsReply(runningLeftover, otherPrefixed, secondLeftover)}
		case procDomainLookup:
			return fakeReply{payload: xdrDomain("looked-up")}
		case procGetState:
			return fakeReply{payload: append(xdrUint32(domainRunning), xdrUint32(1)...)}
		case procDestroy:
			return fakeReply{errCode: libvirtErrOpInvalid, errMsg: "domain is not running"}
		case procUndefine:
			return fakeReply{}
		}
		return fakeReply{errCode: 1, errMsg: "unexpected call"}
	})
	dir := t.TempDir()
	for _, n := range []string{runningLeftover + ".qcow2", runningLeftover + ".console.log",
		orphanOverlayVM + ".qcow2", unrelatedFile, prefix + "notes.txt"} {
		if err := os.WriteFile(filepath.Join(dir, n), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cfg := Config{URI: f.uri(), NamePrefix: prefix, OverlayDir: dir, CallTimeout: 10 * time.Second}

	left, err := List(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	wantLeft := []Leftover{
		{Name: runningLeftover, Domain: true, Running: true, Files: []string{
			filepath.Join(dir, runningLeftover+".console.log"), filepath.Join(dir, runningLeftover+".qcow2")}},
		{Name: secondLeftover, Domain: true, Running: true},
		{Name: orphanOverlayVM, Files: []string{filepath.Join(dir, orphanOverlayVM+".qcow2")}},
	}
	if diff := cmp.Diff(wantLeft, left); diff != "" {
		t.Errorf("List (-want +got):\n%s", diff)
	}

	removed, err := Sweep(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{runningLeftover, secondLeftover, orphanOverlayVM}, removed); diff != "" {
		t.Errorf("Sweep removed (-want +got):\n%s", diff)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var kept []string
	for _, e := range ents {
		kept = append(kept, e.Name())
	}
	if diff := cmp.Diff([]string{prefix + "notes.txt", unrelatedFile}, kept); diff != "" {
		t.Errorf("files kept (-want +got):\n%s", diff)
	}
	f.mu.Lock()
	destroys, undefines := f.calls[procDestroy], f.calls[procUndefine]
	f.mu.Unlock()
	if destroys != 2 || undefines != 2 {
		t.Errorf("destroy calls %d, undefine calls %d; want 2 each (the two prefixed domains)", destroys, undefines)
	}
}

func TestSweepRefusesBadPrefix(t *testing.T) {
	_, err := Sweep(t.Context(), Config{NamePrefix: "*"})
	if err == nil {
		t.Fatal("Sweep with prefix \"*\": want an error")
	}
}
