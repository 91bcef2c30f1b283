// Package dnstest is a DNS server on loopback for tests whose records the
// test sets, and changes while the code under test resolves them.
//
// It speaks DNS over TCP only: Resolver's Dial connects every lookup to it
// over TCP, which Go's resolver then uses as it would UDP (it picks the
// framing by the connection's kind), so one listener serves it all.
package dnstest

import (
	"context"
	"encoding/binary"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"

	"golang.org/x/net/dns/dnsmessage"
)

// Server answers A, AAAA and SRV questions from the records set with SetA
// and SetSRV: NXDOMAIN for a name without any, an empty answer for a name
// with records of another type only.
type Server struct {
	ln net.Listener
	wg sync.WaitGroup

	mu    sync.Mutex
	addrs map[string][]netip.Addr
	srvs  map[string][]net.SRV
	fail  bool
	conns map[net.Conn]bool
	// queries counts the questions answered.
	queries int
}

// Start starts a server on 127.0.0.1, closed when the test ends.
func Start(t testing.TB) *Server {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{ln: ln, addrs: map[string][]netip.Addr{}, srvs: map[string][]net.SRV{}, conns: map[net.Conn]bool{}}
	s.wg.Add(1)
	go s.serve()
	t.Cleanup(s.Close)
	return s
}

// Resolver returns a resolver that asks the server, whatever name server
// /etc/resolv.conf names.
func (s *Server) Resolver() *net.Resolver {
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", s.ln.Addr().String())
	}}
}

// SetA makes addrs (IPv4 or IPv6) the A and AAAA records of name; none
// removes them.
func (s *Server) SetA(name string, addrs ...string) {
	var as []netip.Addr
	for _, a := range addrs {
		as = append(as, netip.MustParseAddr(a))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.addrs[fqdn(name)] = as
}

// SetSRV makes recs the SRV records of name; none removes them.
func (s *Server) SetSRV(name string, recs ...net.SRV) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.srvs[fqdn(name)] = recs
}

// Fail makes the server answer every question with SERVFAIL while on.
func (s *Server) Fail(on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fail = on
}

// Queries returns the number of questions answered so far.
func (s *Server) Queries() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.queries
}

// Close stops the server and ends its connections. It is idempotent.
func (s *Server) Close() {
	s.ln.Close()
	s.mu.Lock()
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

func fqdn(name string) string {
	name = strings.ToLower(name)
	if !strings.HasSuffix(name, ".") {
		name += "."
	}
	return name
}

func (s *Server) serve() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		s.conns[c] = true
		s.mu.Unlock()
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer func() {
				s.mu.Lock()
				delete(s.conns, c)
				s.mu.Unlock()
				c.Close()
			}()
			s.serveConn(c)
		}()
	}
}

// serveConn answers the messages of one connection, each framed by its
// two-byte length, until the client closes it.
func (s *Server) serveConn(c net.Conn) {
	for {
		var n [2]byte
		if _, err := io.ReadFull(c, n[:]); err != nil {
			return
		}
		msg := make([]byte, binary.BigEndian.Uint16(n[:]))
		if _, err := io.ReadFull(c, msg); err != nil {
			return
		}
		out, err := s.answer(msg)
		if err != nil {
			return
		}
		if _, err := c.Write(binary.BigEndian.AppendUint16(nil, uint16(len(out)))); err != nil {
			return
		}
		if _, err := c.Write(out); err != nil {
			return
		}
	}
}

// answer builds the reply to a query.
func (s *Server) answer(query []byte) ([]byte, error) {
	var p dnsmessage.Parser
	h, err := p.Start(query)
	if err != nil {
		return nil, err
	}
	q, err := p.Question()
	if err != nil {
		return nil, err
	}
	name := strings.ToLower(q.Name.String())
	s.mu.Lock()
	s.queries++
	fail := s.fail
	addrs, srvs := s.addrs[name], s.srvs[name]
	s.mu.Unlock()
	rh := dnsmessage.Header{ID: h.ID, Response: true, Authoritative: true, RecursionDesired: h.RecursionDesired, RecursionAvailable: true}
	switch {
	case fail:
		rh.RCode = dnsmessage.RCodeServerFailure
	case len(addrs) == 0 && len(srvs) == 0:
		rh.RCode = dnsmessage.RCodeNameError
	}
	b := dnsmessage.NewBuilder(nil, rh)
	b.EnableCompression()
	if err := b.StartQuestions(); err != nil {
		return nil, err
	}
	if err := b.Question(q); err != nil {
		return nil, err
	}
	if err := b.StartAnswers(); err != nil {
		return nil, err
	}
	if rh.RCode == dnsmessage.RCodeSuccess {
		if err := addAnswers(&b, q, addrs, srvs); err != nil {
			return nil, err
		}
	}
	return b.Finish()
}

// addAnswers adds the records of q's type.
func addAnswers(b *dnsmessage.Builder, q dnsmessage.Question, addrs []netip.Addr, srvs []net.SRV) error {
	rrh := dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: 1}
	switch q.Type {
	case dnsmessage.TypeA, dnsmessage.TypeAAAA:
		for _, a := range addrs {
			var err error
			switch {
			case a.Is4() && q.Type == dnsmessage.TypeA:
				err = b.AResource(rrh, dnsmessage.AResource{A: a.As4()})
			case a.Is6() && q.Type == dnsmessage.TypeAAAA:
				err = b.AAAAResource(rrh, dnsmessage.AAAAResource{AAAA: a.As16()})
			}
			if err != nil {
				return err
			}
		}
	case dnsmessage.TypeSRV:
		for _, r := range srvs {
			target, err := dnsmessage.NewName(fqdn(r.Target))
			if err != nil {
				return err
			}
			if err := b.SRVResource(rrh, dnsmessage.SRVResource{Priority: r.Priority, Weight: r.Weight, Port: r.Port, Target: target}); err != nil {
				return err
			}
		}
	}
	return nil
}
