//go:build integration

package vm

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"legato/rl/desktop/osworld/vm/hosttest"
)

// startFleet makes n namespace hosts for a test and removes them after it,
// checking that nothing is left of them.
func startFleet(t *testing.T, name string, n int) *hosttest.Fleet {
	t.Helper()
	f, err := hosttest.Start(t.Context(), hosttest.Options{Hosts: n, Name: name, TLS: true, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := f.Close(); err != nil {
			t.Errorf("remove the namespace hosts: %v", err)
		}
		out, _ := exec.Command("ip", "netns", "list").Output()
		for _, h := range f.Hosts {
			if strings.Contains(string(out), h.Name) {
				t.Errorf("namespace %s still exists", h.Name)
			}
		}
	})
	return f
}

func hostSpec(h *hosttest.Host, desktops int) HostSpec {
	return HostSpec{URI: h.URI(), Desktops: desktops, Name: h.Name}
}

// domains lists the host's domains as its own libvirtd sees them.
func domains(t *testing.T, h *hosttest.Host) string {
	t.Helper()
	out, err := h.Exec(context.Background(), "virsh", "-q", "-c", "qemu:///system", "list", "--all", "--name")
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(out))
}

// A VM on a remote host: its image files uploaded through libvirt, its
// guest reached through SSH only, its console read through libvirt; the
// host killed under it (the host is reported lost, calls fail, Close does
// not hang), brought back and swept clean. The second host is reached over
// TLS (its guests over SSH).
func TestIntegrationRemoteHost(t *testing.T) {
	if os.Getenv(crashChildEnv) != "" {
		t.Skip("crash child")
	}
	fleet := startFleet(t, "lgvm", 2)
	cfg := testConfig(t, "legato-itremote-")
	cfg.Accel = AccelTCG
	cfg.SSH.KeepAlive, cfg.SSH.KeepAliveCount = time.Second, 3
	h1, h2 := fleet.Hosts[0], fleet.Hosts[1]
	cfg.Hosts = []HostSpec{hostSpec(h1, 1), {URI: h2.TLSURI(), SSH: "root@" + h2.Addr, Desktops: 1, Name: h2.Name}}
	cfg.SSH.IdentityFiles, cfg.SSH.KnownHosts, cfg.SSH.NoAgent = []string{fleet.KeyFile}, []string{fleet.KnownHosts}, true
	ctx := t.Context()
	var lost atomic.Int32
	hosts := map[string]*Host{}
	for _, spec := range cfg.Hosts {
		h, err := OpenHost(spec, cfg, HostOptions{Lost: func(h *Host, err error) {
			t.Logf("host %s lost: %v", h.Name(), err)
			lost.Add(1)
		}})
		if err != nil {
			t.Fatal(err)
		}
		defer h.Close()
		hosts[h.Name()] = h
	}
	rh1, rh2 := hosts[h1.Name], hosts[h2.Name]

	// A fresh host has no pool and no image; sync uploads them once.
	st, err := rh1.CheckImages(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range st {
		if s.Present || s.Matches {
			t.Errorf("fresh host: %s present=%v matches=%v", s.Volume, s.Present, s.Matches)
		}
	}
	if _, err := StartOn(ctx, rh1, cfg, 0); !errors.Is(err, ErrImageMissing) && !errors.Is(err, ErrNoPool) {
		t.Errorf("start on a host without the image: %v, want ErrImageMissing or ErrNoPool", err)
	}
	for _, h := range []*Host{rh1, rh2} {
		t0 := time.Now()
		st, err := h.SyncImages(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		var bytes int64
		for _, s := range st {
			if !s.Matches {
				t.Errorf("%s after sync: %s", s.Volume, s.Why)
			}
			bytes += s.File.Size
		}
		d := time.Since(t0)
		t.Logf("sync to %s: %d MB in %v (%.0f MB/s)", h.Name(), bytes>>20, d.Round(time.Millisecond), float64(bytes)/(1<<20)/d.Seconds())
	}
	t0 := time.Now()
	if _, err := rh1.SyncImages(ctx, nil); err != nil {
		t.Fatal(err)
	}
	t.Logf("sync again (nothing to upload): %v", time.Since(t0).Round(time.Millisecond))

	// Another image's file (here: another initrd) is pruned once nothing
	// uses it; the current image stays.
	stale := filepath.Join(t.TempDir(), "initrd.img")
	b, err := os.ReadFile(cfg.Initrd)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(stale, append(b, 0), 0o644); err != nil {
		t.Fatal(err)
	}
	other := cfg
	other.Initrd = stale
	oh, err := OpenHost(other.Hosts[0], other, HostOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := oh.SyncImages(ctx, nil); err != nil {
		t.Fatal(err)
	}
	oh.Close()
	pruned, err := rh1.PruneImages(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(pruned) != 2 || !strings.HasPrefix(pruned[0], "legato-initrd-") || !strings.HasPrefix(pruned[1], "legato-initrd-") {
		t.Errorf("pruned %v, want the other initrd and its marker", pruned)
	}
	if st, err := rh1.CheckImages(ctx); err != nil {
		t.Fatal(err)
	} else {
		for _, s := range st {
			if !s.Matches {
				t.Errorf("%s after the prune: %s", s.Volume, s.Why)
			}
		}
	}

	// A VM on the TLS host: libvirt over TLS, the guest over SSH.
	v2, err := StartOn(ctx, rh2, cfg, 1)
	if err != nil {
		t.Fatal(err)
	}
	c2 := &http.Client{Transport: &http.Transport{DialContext: v2.DialContext}}
	if resp, err := c2.Get(v2.Ports().GuestURL() + "/platform"); err != nil {
		t.Errorf("guest of the TLS host through ssh: %v", err)
	} else {
		resp.Body.Close()
	}
	c2.CloseIdleConnections()
	if b, err := v2.Console(ctx, 4096); err != nil || !strings.Contains(string(b), "legato-init") {
		t.Errorf("console through libvirt over TLS: %q, %v", b, err)
	}
	if err := v2.Close(); err != nil {
		t.Errorf("close on the TLS host: %v", err)
	}
	if left, err := rh2.Leftovers(ctx, cfg.NamePrefix); err != nil || len(left) != 0 {
		t.Errorf("TLS host after close: %+v, %v", left, err)
	}

	v, err := StartOn(ctx, rh1, cfg, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	ports := v.Ports()
	// The guest answers through SSH ...
	client := &http.Client{Transport: &http.Transport{DialContext: v.DialContext}}
	resp, err := client.Get(ports.GuestURL() + "/platform")
	if err != nil {
		t.Fatalf("guest through ssh: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	t.Logf("guest platform through ssh: %q", body)
	client.CloseIdleConnections()
	// ... and its port is on the host's loopback only: nothing listens
	// on it here, nor on the host's address.
	if listening(t, ports.Guest) {
		t.Errorf("guest port %d listens on this machine", ports.Guest)
	}
	if c, err := net.DialTimeout("tcp", net.JoinHostPort(h1.Addr, strconv.Itoa(ports.Guest)), 2*time.Second); err == nil {
		c.Close()
		t.Errorf("guest port %d answers on the host's address %s", ports.Guest, h1.Addr)
	}
	out, err := h1.Exec(ctx, "ss", "-Hltn")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(out), "\n") {
		// Beyond its loopback, only sshd and libvirtd's TLS listener.
		if f := strings.Fields(line); len(f) >= 4 && !strings.HasPrefix(f[3], "127.0.0.1:") && f[3] != h1.Addr+":22" && f[3] != h1.Addr+":16514" {
			t.Errorf("host %s listens beyond its loopback, sshd and libvirtd: %s", h1.Name, line)
		}
	}
	console, err := v.Console(ctx, 4096)
	if err != nil || !strings.Contains(string(console), "legato-init") {
		t.Errorf("console through libvirt: %q, %v", console, err)
	}
	if err := v.Revert(ctx); err != nil {
		t.Errorf("revert on the remote host: %v", err)
	}

	// The host crashes under the VM.
	if err := h1.Kill(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for lost.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	if lost.Load() == 0 {
		t.Error("the host was killed and its SSH connection was not reported lost")
	}
	callCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	req, _ := http.NewRequestWithContext(callCtx, http.MethodGet, ports.GuestURL()+"/platform", nil)
	if resp, err := client.Do(req); err == nil {
		resp.Body.Close()
		t.Error("a guest call on the dead host succeeded")
	}
	cancel()
	t0 = time.Now()
	if err := v.Close(); err == nil {
		t.Error("Close on a dead host succeeded; want it to say the VM could not be removed")
	} else {
		t.Logf("close on the dead host (%v): %v", time.Since(t0).Round(time.Millisecond), err)
	}

	// Back again: the domain it had (stopped now) and the volumes are
	// found and swept.
	if err := h1.StartDaemons(ctx); err != nil {
		t.Fatal(err)
	}
	if err := rh1.Ping(ctx); err != nil {
		t.Fatalf("ping after the host came back: %v", err)
	}
	left, err := rh1.Leftovers(ctx, cfg.NamePrefix)
	if err != nil {
		t.Fatal(err)
	}
	if len(left) != 1 || left[0].Name != v.Name() || left[0].Running || len(left[0].Volumes) != 1 {
		t.Errorf("after the crash: %+v; want %s stopped with its overlay", left, v.Name())
	}
	removed, err := rh1.Sweep(ctx, cfg.NamePrefix, nil)
	if err != nil || len(removed) != 1 {
		t.Errorf("sweep: %v, %v", removed, err)
	}
	if d := domains(t, h1); d != "" {
		t.Errorf("domains left on %s: %s", h1.Name, d)
	}
	st, err = rh1.CheckImages(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range st {
		if !s.Matches {
			t.Errorf("image %s after the crash: %s", s.Volume, s.Why)
		}
	}
	vols, err := h1.Exec(ctx, "virsh", "-q", "-c", "qemu:///system", "vol-list", "--pool", cfg.withDefaults().StoragePool)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(vols), cfg.NamePrefix) {
		t.Errorf("volumes of the VM left on %s:\n%s", h1.Name, vols)
	}
}

// BenchmarkIntegrationGuestCall measures an HTTP call to a server on a
// namespace host: through the host's sshd (OpenSSH, the path legato uses
// for guest ports) and directly to the host's address (the path without
// SSH), with a small answer and a 1 MB one, on a kept-alive connection.
func BenchmarkIntegrationGuestCall(b *testing.B) {
	fleet, err := hosttest.Start(b.Context(), hosttest.Options{Hosts: 1, Name: "lgbench"})
	if err != nil {
		b.Fatal(err)
	}
	defer fleet.Close()
	hn := fleet.Hosts[0]
	dir := filepath.Join(hn.Dir, "www")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "platform"), []byte("Linux"), 0o644); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "screenshot"), make([]byte, 1<<20), 0o644); err != nil {
		b.Fatal(err)
	}
	const port = 18080
	web := exec.Command("nsenter", "--net=/run/netns/"+hn.Name, "python3", "-m", "http.server", "--protocol", "HTTP/1.1", "--bind", "0.0.0.0", "--directory", dir, strconv.Itoa(port))
	if err := web.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { web.Process.Kill(); web.Wait() }()
	h, err := OpenHost(HostSpec{URI: hn.URI()}, Config{}, HostOptions{})
	if err != nil {
		b.Fatal(err)
	}
	defer h.Close()
	direct := &net.Dialer{}
	for _, via := range []struct {
		name, addr string
		dial       func(ctx context.Context, network, addr string) (net.Conn, error)
	}{
		{"direct", net.JoinHostPort(hn.Addr, strconv.Itoa(port)), direct.DialContext},
		{"ssh", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), h.DialContext},
	} {
		for _, path := range []string{"/platform", "/screenshot"} {
			b.Run(via.name+path, func(b *testing.B) {
				tr := &http.Transport{DialContext: via.dial}
				defer tr.CloseIdleConnections()
				c := &http.Client{Transport: tr}
				url := "http://" + via.addr + path
				get := func() int64 {
					resp, err := c.Get(url)
					if err != nil {
						b.Fatal(err)
					}
					defer resp.Body.Close()
					n, _ := io.Copy(io.Discard, resp.Body)
					if resp.StatusCode != 200 {
						b.Fatalf("%s: %s", url, resp.Status)
					}
					return n
				}
				for deadline := time.Now().Add(10 * time.Second); ; {
					resp, err := c.Get(url)
					if err == nil {
						io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
						break
					}
					if time.Now().After(deadline) {
						b.Fatal(err)
					}
					time.Sleep(100 * time.Millisecond)
				}
				for b.Loop() {
					b.SetBytes(get())
				}
			})
		}
	}
}
