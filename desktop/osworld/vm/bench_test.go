package vm

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// BenchmarkGuestCall measures one guest-server-sized HTTP call (a small
// answer, and a 1 MB one like a screenshot) to the host's loopback: direct
// (a local host) and through the host's SSH connection (a remote host, here
// an in-process SSH server on loopback, so only the SSH path's own cost
// shows), on kept-alive connections as the guest client uses them, and on a
// new connection per call (a new SSH channel).
func BenchmarkGuestCall(b *testing.B) {
	shot := strings.Repeat("x", 1<<20)
	web := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/screenshot" {
			io.WriteString(w, shot)
			return
		}
		io.WriteString(w, `{"status":"ok"}`)
	}))
	defer web.Close()
	keyFile, pub := newKeyFile(b, "")
	srv := newSSHServer(b, pub)
	kh := srv.knownHosts(b)
	spec := HostSpec{URI: "qemu+ssh://bench@127.0.0.1:" + srv.port() + "/system?keyfile=" + keyFile + "&known_hosts=" + kh}
	h, err := OpenHost(spec, Config{SSH: noDefaults}, HostOptions{})
	if err != nil {
		b.Fatal(err)
	}
	defer h.Close()
	local, err := OpenHost(HostSpec{URI: DefaultURI}, Config{}, HostOptions{})
	if err != nil {
		b.Fatal(err)
	}
	for _, via := range []struct {
		name string
		host *Host
	}{{"local", local}, {"ssh", h}} {
		for _, keep := range []bool{true, false} {
			for _, path := range []string{"/platform", "/screenshot"} {
				name := via.name + path
				if !keep {
					name += "/new-conn"
				}
				b.Run(name, func(b *testing.B) {
					tr := &http.Transport{DialContext: via.host.DialContext, DisableKeepAlives: !keep}
					c := &http.Client{Transport: tr}
					defer tr.CloseIdleConnections()
					for b.Loop() {
						resp, err := c.Get(web.URL + path)
						if err != nil {
							b.Fatal(err)
						}
						n, _ := io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
						b.SetBytes(n)
					}
				})
			}
		}
	}
}
