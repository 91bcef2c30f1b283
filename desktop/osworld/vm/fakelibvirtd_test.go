package vm

import (
	"encoding/binary"
	"io"
	"net"
	"path/filepath"
	"sync"
	"testing"
)

// libvirt RPC numbers the fake daemon knows (remote_protocol.x).
const (
	rpcProgram            = 0x20008086
	procConnectOpen       = 1
	procConnectClose      = 2
	procDomainLookup      = 23
	procAuthList          = 66
	rpcReply              = 1
	rpcStatusOK           = 0
	rpcStatusError        = 1
	libvirtErrNoDomain    = 42
	libvirtErrOpInvalid   = 55
	fakeDomainUUIDPayload = 16
)

// fakeReply is what the fake daemon does with one call.
type fakeReply struct {
	hang    bool   // never answer
	errCode uint32 // answer with this libvirt error
	errMsg  string
	payload []byte // answer OK with this XDR payload
}

// fakeLibvirtd is a libvirtd stand-in on a unix socket that speaks just
// enough of the RPC framing for go-libvirt: it answers the handshake and
// then each call as its script says. Closing it closes every connection and
// waits for its goroutines.
type fakeLibvirtd struct {
	t      *testing.T
	path   string
	ln     net.Listener
	script func(conn, proc int) fakeReply
	// scriptArgs, when set, answers instead of script and also sees the
	// call's XDR arguments.
	scriptArgs func(conn, proc int, args []byte) fakeReply
	// hangHandshake leaves the connection handshake unanswered.
	hangHandshake bool

	mu    sync.Mutex
	conns []net.Conn
	n     int // connections accepted
	calls map[int]int
	wg    sync.WaitGroup
}

func newFakeLibvirtd(t *testing.T, hangHandshake bool, script func(conn, proc int) fakeReply) *fakeLibvirtd {
	t.Helper()
	path := filepath.Join(t.TempDir(), "libvirt-sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeLibvirtd{t: t, path: path, ln: ln, script: script, hangHandshake: hangHandshake, calls: map[int]int{}}
	f.wg.Add(1)
	go f.accept()
	t.Cleanup(f.close)
	return f
}

func (f *fakeLibvirtd) uri() string { return "qemu+unix:///system?socket=" + f.path }

func (f *fakeLibvirtd) accept() {
	defer f.wg.Done()
	for {
		c, err := f.ln.Accept()
		if err != nil {
			return
		}
		f.mu.Lock()
		f.conns = append(f.conns, c)
		n := f.n
		f.n++
		f.mu.Unlock()
		f.wg.Add(1)
		go f.serve(c, n)
	}
}

func (f *fakeLibvirtd) serve(c net.Conn, n int) {
	defer f.wg.Done()
	defer c.Close()
	for {
		var hdr [28]byte // length + program, version, procedure, type, serial, status
		if _, err := io.ReadFull(c, hdr[:]); err != nil {
			return
		}
		size := binary.BigEndian.Uint32(hdr[0:4])
		args := make([]byte, int(size)-28)
		if _, err := io.ReadFull(c, args); err != nil {
			return
		}
		proc := int(binary.BigEndian.Uint32(hdr[12:16]))
		serial := binary.BigEndian.Uint32(hdr[20:24])
		f.mu.Lock()
		f.calls[proc]++
		f.mu.Unlock()
		var r fakeReply
		switch proc {
		case procAuthList:
			r = fakeReply{hang: f.hangHandshake, payload: xdrUint32(0)} // no auth types
		case procConnectOpen, procConnectClose:
			r = fakeReply{hang: f.hangHandshake}
		default:
			if f.scriptArgs != nil {
				r = f.scriptArgs(n, proc, args)
			} else {
				r = f.script(n, proc)
			}
		}
		if r.hang {
			continue
		}
		status, payload := uint32(rpcStatusOK), r.payload
		if r.errCode != 0 {
			status = rpcStatusError
			payload = xdrError(r.errCode, r.errMsg)
		}
		if _, err := c.Write(rpcPacket(proc, serial, status, payload)); err != nil {
			return
		}
	}
}

func (f *fakeLibvirtd) close() {
	f.ln.Close()
	f.mu.Lock()
	for _, c := range f.conns {
		c.Close()
	}
	f.mu.Unlock()
	f.wg.Wait()
}

func (f *fakeLibvirtd) accepted() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.n
}

func rpcPacket(proc int, serial, status uint32, payload []byte) []byte {
	b := make([]byte, 28, 28+len(payload))
	binary.BigEndian.PutUint32(b[0:], uint32(28+len(payload)))
	binary.BigEndian.PutUint32(b[4:], rpcProgram)
	binary.BigEndian.PutUint32(b[8:], 1)
	binary.BigEndian.PutUint32(b[12:], uint32(proc))
	binary.BigEndian.PutUint32(b[16:], rpcReply)
	binary.BigEndian.PutUint32(b[20:], serial)
	binary.BigEndian.PutUint32(b[24:], status)
	return append(b, payload...)
}

func xdrUint32(v uint32) []byte { return binary.BigEndian.AppendUint32(nil, v) }

func xdrString(s string) []byte {
	b := binary.BigEndian.AppendUint32(nil, uint32(len(s)))
	b = append(b, s...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

// xdrError is a remote_error: code, domain, message (optional string), level.
func xdrError(code uint32, msg string) []byte {
	b := xdrUint32(code)
	b = append(b, xdrUint32(10)...) // VIR_FROM_QEMU
	b = append(b, xdrUint32(1)...)  // message present
	b = append(b, xdrString(msg)...)
	return append(b, xdrUint32(2)...) // VIR_ERR_ERROR
}

// xdrDomain is a remote_nonnull_domain: name, uuid[16], id.
func xdrDomain(name string) []byte {
	b := xdrString(name)
	b = append(b, make([]byte, fakeDomainUUIDPayload)...)
	return append(b, xdrUint32(1)...)
}

// xdrPool is a remote_nonnull_storage_pool: name, uuid[16].
func xdrPool(name string) []byte {
	return append(xdrString(name), make([]byte, 16)...)
}

// xdrVol is a remote_nonnull_storage_vol: pool, name, key.
func xdrVol(pool, name string) []byte {
	b := append(xdrString(pool), xdrString(name)...)
	return append(b, xdrString("/pool/"+name)...)
}

// xdrReadString reads an XDR string at the start of b and returns it with
// the rest of b.
func xdrReadString(b []byte) (string, []byte) {
	if len(b) < 4 {
		return "", nil
	}
	n := int(binary.BigEndian.Uint32(b))
	padded := (n + 3) &^ 3
	if len(b) < 4+padded {
		return "", nil
	}
	return string(b[4 : 4+n]), b[4+padded:]
}
