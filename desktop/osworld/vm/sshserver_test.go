package vm

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"
)

// sshServer is an in-process SSH server that does what legato asks of a
// host's sshd: public-key login, direct-tcpip (the host's loopback),
// direct-streamlocal (libvirtd's socket), remote forwards on port 0 (free
// ports), keep-alive requests, and exec sessions (with exec set). Clients reach it through a proxy that a
// test can freeze, as a host that stops answering does.
type sshServer struct {
	hostKey ssh.Signer
	cfg     *ssh.ServerConfig
	// exec, if set (setExec), runs a session's command: it reads the
	// session's stdin and writes its stdout, and returns the exit status.
	exec  func(command string, stdin io.Reader, stdout io.Writer) int
	ln    net.Listener
	proxy *freezeProxy

	mu     sync.Mutex
	conns  []net.Conn
	logins int
	wg     sync.WaitGroup
}

// newSSHServer starts a server that lets in the holders of authorized.
func newSSHServer(t testing.TB, authorized ...ssh.PublicKey) *sshServer {
	t.Helper()
	s := &sshServer{hostKey: newSigner(t)}
	s.cfg = &ssh.ServerConfig{
		PublicKeyCallback: func(_ ssh.ConnMetadata, key ssh.PublicKey) (*ssh.Permissions, error) {
			for _, k := range authorized {
				if string(k.Marshal()) == string(key.Marshal()) {
					return nil, nil
				}
			}
			return nil, errUnauthorized
		},
	}
	s.cfg.AddHostKey(s.hostKey)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.ln = ln
	s.proxy = newFreezeProxy(t, ln.Addr().String())
	s.wg.Add(1)
	go s.accept()
	t.Cleanup(s.close)
	return s
}

type sshError string

func (e sshError) Error() string { return string(e) }

const errUnauthorized = sshError("unauthorized")

// addr is where clients connect: the proxy.
func (s *sshServer) addr() string { return s.proxy.addr() }

func (s *sshServer) port() string {
	_, p, _ := net.SplitHostPort(s.addr())
	return p
}

// knownHosts writes a known_hosts file listing the server's key.
func (s *sshServer) knownHosts(t testing.TB) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "known_hosts")
	line := knownhosts.Line([]string{knownhosts.Normalize(s.addr())}, s.hostKey.PublicKey())
	if err := os.WriteFile(p, []byte(line+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func (s *sshServer) loginCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.logins
}

func (s *sshServer) accept() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		s.conns = append(s.conns, c)
		s.mu.Unlock()
		s.wg.Add(1)
		go s.serve(c)
	}
}

func (s *sshServer) serve(c net.Conn) {
	defer s.wg.Done()
	defer c.Close()
	conn, chans, reqs, err := ssh.NewServerConn(c, s.cfg)
	if err != nil {
		return
	}
	s.mu.Lock()
	s.logins++
	s.mu.Unlock()
	var forwards sync.WaitGroup
	var fmu sync.Mutex
	listeners := map[uint32]net.Listener{}
	defer func() {
		fmu.Lock()
		for _, l := range listeners {
			l.Close()
		}
		fmu.Unlock()
		forwards.Wait()
	}()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for r := range reqs {
			switch r.Type {
			case "tcpip-forward":
				var m struct {
					Addr string
					Port uint32
				}
				if ssh.Unmarshal(r.Payload, &m) != nil {
					r.Reply(false, nil)
					continue
				}
				l, err := net.Listen("tcp", net.JoinHostPort(m.Addr, strconv.Itoa(int(m.Port))))
				if err != nil {
					r.Reply(false, nil)
					continue
				}
				port := uint32(l.Addr().(*net.TCPAddr).Port)
				fmu.Lock()
				listeners[port] = l
				fmu.Unlock()
				r.Reply(true, ssh.Marshal(struct{ Port uint32 }{port}))
			case "cancel-tcpip-forward":
				var m struct {
					Addr string
					Port uint32
				}
				ssh.Unmarshal(r.Payload, &m)
				fmu.Lock()
				if l, ok := listeners[m.Port]; ok {
					l.Close()
					delete(listeners, m.Port)
				}
				fmu.Unlock()
				r.Reply(true, nil)
			default:
				// OpenSSH refuses what it does not know, keep-alives
				// included.
				r.Reply(false, nil)
			}
		}
	}()
	for nc := range chans {
		var target, network string
		switch nc.ChannelType() {
		case "session":
			s.mu.Lock()
			exec := s.exec
			s.mu.Unlock()
			if exec == nil {
				nc.Reject(ssh.UnknownChannelType, "no sessions here")
				continue
			}
			ch, creqs, err := nc.Accept()
			if err != nil {
				continue
			}
			forwards.Add(1)
			go func() {
				defer forwards.Done()
				session(ch, creqs, exec)
			}()
			continue
		case "direct-tcpip":
			var m struct {
				Host       string
				Port       uint32
				OriginHost string
				OriginPort uint32
			}
			if err := ssh.Unmarshal(nc.ExtraData(), &m); err != nil {
				nc.Reject(ssh.ConnectionFailed, err.Error())
				continue
			}
			network, target = "tcp", net.JoinHostPort(m.Host, strconv.Itoa(int(m.Port)))
		case "direct-streamlocal@openssh.com":
			var m struct {
				Path      string
				Reserved0 string
				Reserved1 uint32
			}
			if err := ssh.Unmarshal(nc.ExtraData(), &m); err != nil {
				nc.Reject(ssh.ConnectionFailed, err.Error())
				continue
			}
			network, target = "unix", m.Path
		default:
			nc.Reject(ssh.UnknownChannelType, "not here")
			continue
		}
		out, err := net.Dial(network, target)
		if err != nil {
			nc.Reject(ssh.ConnectionFailed, err.Error())
			continue
		}
		ch, creqs, err := nc.Accept()
		if err != nil {
			out.Close()
			continue
		}
		forwards.Add(3)
		go func() { defer forwards.Done(); ssh.DiscardRequests(creqs) }()
		go func() { defer forwards.Done(); io.Copy(out, ch); out.Close() }()
		go func() { defer forwards.Done(); io.Copy(ch, out); ch.CloseWrite(); ch.Close() }()
	}
	conn.Close()
}

// setExec makes the server run sessions' commands with exec.
func (s *sshServer) setExec(exec func(command string, stdin io.Reader, stdout io.Writer) int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.exec = exec
}

// session serves one session channel: its exec request runs exec.
func session(ch ssh.Channel, reqs <-chan *ssh.Request, exec func(string, io.Reader, io.Writer) int) {
	defer ch.Close()
	for r := range reqs {
		if r.Type != "exec" {
			r.Reply(false, nil)
			continue
		}
		var m struct{ Command string }
		if err := ssh.Unmarshal(r.Payload, &m); err != nil {
			r.Reply(false, nil)
			continue
		}
		r.Reply(true, nil)
		go ssh.DiscardRequests(reqs)
		status := exec(m.Command, ch, ch)
		ch.SendRequest("exit-status", false, ssh.Marshal(struct{ Status uint32 }{uint32(status)}))
		return
	}
}

func (s *sshServer) close() {
	s.ln.Close()
	s.mu.Lock()
	for _, c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

// freezeProxy forwards TCP connections to a target until frozen: then it
// stops moving bytes without closing anything, as a host that stops
// answering (a cable pulled, a kernel hung) does.
type freezeProxy struct {
	ln     net.Listener
	target string

	mu     sync.Mutex
	frozen bool
	thaw   chan struct{}
	conns  []net.Conn
	wg     sync.WaitGroup
}

func newFreezeProxy(t testing.TB, target string) *freezeProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &freezeProxy{ln: ln, target: target, thaw: make(chan struct{})}
	close(p.thaw)
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

func (p *freezeProxy) addr() string { return p.ln.Addr().String() }

func (p *freezeProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		out, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, out)
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(out, c)
		go p.pipe(c, out)
	}
}

func (p *freezeProxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	defer dst.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			thaw := p.thaw
			p.mu.Unlock()
			<-thaw
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// freeze stops every byte until unfreeze.
func (p *freezeProxy) freeze() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.frozen {
		p.frozen = true
		p.thaw = make(chan struct{})
	}
}

func (p *freezeProxy) unfreeze() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.frozen {
		p.frozen = false
		close(p.thaw)
	}
}

func (p *freezeProxy) close() {
	p.ln.Close()
	p.unfreeze()
	p.mu.Lock()
	for _, c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// newSigner returns a fresh ed25519 key.
func newSigner(t testing.TB) ssh.Signer {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	s, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// newKeyFile writes a fresh ed25519 private key in OpenSSH's format
// (protected by passphrase, if not empty) and returns its path and public
// key.
func newKeyFile(t testing.TB, passphrase string) (string, ssh.PublicKey) {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	var block *pem.Block
	if passphrase == "" {
		block, err = ssh.MarshalPrivateKey(priv, "")
	} else {
		block, err = ssh.MarshalPrivateKeyWithPassphrase(priv, "", []byte(passphrase))
	}
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "id_ed25519")
	if err := os.WriteFile(p, pem.EncodeToMemory(block), 0o600); err != nil {
		t.Fatal(err)
	}
	pub, err := ssh.NewPublicKey(priv.Public())
	if err != nil {
		t.Fatal(err)
	}
	return p, pub
}
