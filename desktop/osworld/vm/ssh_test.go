package vm

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/agent"
)

// sshHost opens a qemu+ssh host on srv, logging in with keyFile and
// checking srv's key against knownHosts, with libvirtd's socket at sock.
func sshHost(t *testing.T, srv *sshServer, keyFile, knownHosts, sock string, sshCfg SSHConfig, lost func(*Host, error)) *Host {
	t.Helper()
	q := "socket=" + sock
	if keyFile != "" {
		q += "&keyfile=" + keyFile
	}
	if knownHosts != "" {
		q += "&known_hosts=" + knownHosts
	}
	spec := HostSpec{URI: "qemu+ssh://tester@127.0.0.1:" + srv.port() + "/system?" + q}
	h, err := OpenHost(spec, Config{SSH: sshCfg, CallTimeout: 10 * time.Second}, HostOptions{Lost: lost})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	return h
}

// noDefaults keeps the tests away from the machine's own keys, agent and
// known_hosts.
var noDefaults = SSHConfig{IdentityFiles: []string{}, KnownHosts: []string{}, NoAgent: true}

// Everything legato does on a host goes through one SSH connection: the
// host's loopback (the guests' forwarded ports), libvirtd's unix socket,
// and free ports picked by the host.
func TestSSHHostReachesLoopbackLibvirtAndPorts(t *testing.T) {
	keyFile, pub := newKeyFile(t, "")
	srv := newSSHServer(t, pub)
	f := newFakeLibvirtd(t, false, func(_, proc int) fakeReply {
		return fakeReply{payload: xdrDomain("legato-0-0000abcd")}
	})
	web := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "guest says hi")
	}))
	defer web.Close()
	h := sshHost(t, srv, keyFile, srv.knownHosts(t), f.path, noDefaults, nil)
	if !h.Remote() {
		t.Error("a qemu+ssh host is not Remote")
	}

	client := &http.Client{Transport: &http.Transport{DialContext: h.DialContext}}
	defer client.CloseIdleConnections()
	resp, err := client.Get(web.URL)
	if err != nil {
		t.Fatalf("GET %s through the host: %v", web.URL, err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(body) != "guest says hi" {
		t.Errorf("body %q through the host", body)
	}

	c := h.connect()
	name, err := lookup(t.Context(), c, "legato-0-0000abcd")
	c.close()
	if err != nil || name != "legato-0-0000abcd" {
		t.Errorf("libvirt call through the host: %q, %v", name, err)
	}
	if f.accepted() != 1 {
		t.Errorf("fake libvirtd accepted %d connections, want 1", f.accepted())
	}

	ports, err := h.freePorts(t.Context(), 3)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	for _, p := range ports {
		if p <= 0 || seen[p] {
			t.Fatalf("free ports %v: want 3 distinct ports", ports)
		}
		seen[p] = true
		// Released again (the server runs here, so its loopback is ours).
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			t.Errorf("port %d from the host is not free: %v", p, err)
			continue
		}
		l.Close()
	}
	if n := srv.loginCount(); n != 1 {
		t.Errorf("%d SSH logins, want 1: every use shares the host's connection", n)
	}
}

// Host keys are always checked: an unknown host and a changed key both
// fail, with what to do.
func TestSSHHostKeyChecked(t *testing.T) {
	keyFile, pub := newKeyFile(t, "")
	srv := newSSHServer(t, pub)
	dir := t.TempDir()
	other := newSigner(t)

	unknown := filepath.Join(dir, "unknown")
	if err := os.WriteFile(unknown, []byte("[127.0.0.1]:1 "+string(ssh.MarshalAuthorizedKey(other.PublicKey()))), 0o600); err != nil {
		t.Fatal(err)
	}
	changed := filepath.Join(dir, "changed")
	if err := os.WriteFile(changed, []byte("[127.0.0.1]:"+srv.port()+" "+string(ssh.MarshalAuthorizedKey(other.PublicKey()))), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name, knownHosts, want string
	}{
		{"host not listed", unknown, "ssh-keyscan"},
		{"key changed", changed, "key mismatch"},
		{"no file", filepath.Join(dir, "missing"), "no such file"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			h := sshHost(t, srv, keyFile, tt.knownHosts, "/nowhere", noDefaults, nil)
			_, err := h.DialContext(t.Context(), "tcp", "127.0.0.1:1")
			if !errors.Is(err, ErrHostKey) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("dial with known_hosts %s: %v; want ErrHostKey saying %q", tt.name, err, tt.want)
			}
		})
	}
}

// Keys come from the agent when no key file has them; a key with a
// passphrase is skipped, not fatal.
func TestSSHAgentKeys(t *testing.T) {
	locked, _ := newKeyFile(t, "secret")
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := ssh.NewPublicKey(priv.Public())
	if err != nil {
		t.Fatal(err)
	}
	srv := newSSHServer(t, pub)
	kh := srv.knownHosts(t)

	keyring := agent.NewKeyring()
	if err := keyring.Add(agent.AddedKey{PrivateKey: priv}); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(t.TempDir(), "agent.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			agent.ServeAgent(keyring, c)
			c.Close()
		}
	}()
	defer func() { ln.Close(); <-done }()
	t.Setenv("SSH_AUTH_SOCK", sock)

	withAgent := SSHConfig{IdentityFiles: []string{locked}, KnownHosts: []string{}}
	h := sshHost(t, srv, "", kh, "/nowhere", withAgent, nil)
	c, err := h.DialContext(t.Context(), "tcp", srv.ln.Addr().String())
	if err != nil {
		t.Fatalf("login with the agent's key: %v", err)
	}
	c.Close()
	h.Close()

	noAgent := withAgent
	noAgent.NoAgent = true
	h = sshHost(t, srv, "", kh, "/nowhere", noAgent, nil)
	if _, err := h.DialContext(t.Context(), "tcp", srv.ln.Addr().String()); err == nil {
		t.Fatal("login without the agent succeeded; want it refused (the only file key has a passphrase)")
	}
}

// A host that stops answering is noticed by the keep-alive: its connection
// is closed, which fails what goes through it, and the host says it is
// lost. Once it answers again the next call reconnects.
func TestSSHKeepAliveNoticesSilentHost(t *testing.T) {
	keyFile, pub := newKeyFile(t, "")
	srv := newSSHServer(t, pub)
	web := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer web.Close()
	lost := make(chan error, 4)
	cfg := noDefaults
	cfg.KeepAlive, cfg.KeepAliveCount = 50*time.Millisecond, 2
	h := sshHost(t, srv, keyFile, srv.knownHosts(t), "/nowhere", cfg, func(_ *Host, err error) { lost <- err })

	c, err := h.DialContext(t.Context(), "tcp", web.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	srv.proxy.freeze()
	select {
	case err := <-lost:
		t.Logf("lost: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("the host stopped answering and nothing noticed it")
	}
	// The open connection fails instead of hanging.
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Error("a read on a connection through the lost host succeeded")
	}

	srv.proxy.unfreeze()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	c2, err := h.DialContext(ctx, "tcp", web.Listener.Addr().String())
	if err != nil {
		t.Fatalf("dial after the host came back: %v", err)
	}
	c2.Close()
	if n := srv.loginCount(); n != 2 {
		t.Errorf("%d logins, want 2 (the first and the reconnect)", n)
	}
}
