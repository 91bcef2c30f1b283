package vm

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"os/user"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/digitalocean/go-libvirt"
)

// HostSpec is one libvirt host of a batch: how to reach its libvirtd and
// how many desktops it runs at most.
type HostSpec struct {
	// URI is the host's libvirt URI:
	//
	//	qemu:///system                        the local libvirtd
	//	qemu+unix:///system?socket=PATH       a local libvirtd on another socket
	//	qemu+ssh://[USER@]HOST[:PORT]/system  over SSH (keys from ~/.ssh and the agent,
	//	                                      HOST checked against known_hosts)
	//	qemu+tls://HOST[:PORT]/system         over TLS (certificates from libvirt's PKI
	//	                                      paths or ?pkipath=DIR); needs SSH too
	//
	// qemu+ssh takes ?socket=PATH (the daemon's socket on the host),
	// ?keyfile=PATH and ?known_hosts=PATH, as libvirt does.
	URI string
	// Desktops caps the VMs running on the host at once; 0 means no cap.
	Desktops int
	// SSH is [USER@]HOST[:PORT] of the host's sshd, through which the
	// guests' ports, bound to the host's 127.0.0.1, are reached. qemu+ssh
	// hosts use their own connection; qemu+tls hosts need it.
	SSH string
	// Name labels the host in logs, records and reports (default: the
	// URI's host[:port], or "local").
	Name string
}

// ParseHostSpec parses the value of --host:
// URI[,desktops=N][,ssh=[USER@]HOST[:PORT]][,name=NAME].
func ParseHostSpec(s string) (HostSpec, error) {
	parts := strings.Split(s, ",")
	h := HostSpec{URI: strings.TrimSpace(parts[0])}
	for _, p := range parts[1:] {
		k, v, ok := strings.Cut(strings.TrimSpace(p), "=")
		if !ok || v == "" {
			return HostSpec{}, fmt.Errorf("host %q: %q: want desktops=N, ssh=USER@HOST or name=NAME", s, p)
		}
		switch k {
		case "desktops":
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 {
				return HostSpec{}, fmt.Errorf("host %q: desktops=%s: want a whole number of at least 1", s, v)
			}
			h.Desktops = n
		case "ssh":
			h.SSH = v
		case "name":
			h.Name = v
		default:
			return HostSpec{}, fmt.Errorf("host %q: unknown option %q: want desktops=N, ssh=USER@HOST or name=NAME", s, k)
		}
	}
	if _, err := h.endpoint(); err != nil {
		return HostSpec{}, err
	}
	return h, nil
}

// String returns the spec in ParseHostSpec's form.
func (h HostSpec) String() string {
	s := h.URI
	if h.Desktops > 0 {
		s += ",desktops=" + strconv.Itoa(h.Desktops)
	}
	if h.SSH != "" {
		s += ",ssh=" + h.SSH
	}
	if h.Name != "" {
		s += ",name=" + h.Name
	}
	return s
}

// Label is the name the host goes by in logs, records and reports.
func (h HostSpec) Label() string {
	if h.Name != "" {
		return h.Name
	}
	ep, err := h.endpoint()
	if err != nil {
		return h.URI
	}
	return ep.label
}

// Validate reports what is wrong with the spec.
func (h HostSpec) Validate() error {
	_, err := h.endpoint()
	return err
}

// transport is how a host's libvirtd is reached.
type transport int

const (
	transportLocal transport = iota // a unix socket on this machine
	transportSSH                    // a unix socket on the host, through SSH
	transportTLS                    // libvirtd's TLS port
)

// endpoint is a parsed HostSpec: everything needed to reach the host.
type endpoint struct {
	transport transport
	label     string
	// name is what libvirtd is asked to open (qemu:///system).
	name libvirt.ConnectURI
	// socket is the daemon's unix socket (local, or on the SSH host).
	socket string

	// ssh is set for qemu+ssh hosts and for qemu+tls hosts with an SSH
	// address: the guests' ports are reached through it.
	ssh *sshTarget

	tlsHost, tlsPort, pkiPath string
}

// sshTarget is an SSH server and how to log in.
type sshTarget struct {
	user, host, port string
	// keyFile and knownHosts come from the URI's keyfile and known_hosts
	// parameters; empty means the defaults (SSHConfig).
	keyFile, knownHosts string
}

// addr is host:port for dialing.
func (t *sshTarget) addr() string { return net.JoinHostPort(t.host, t.port) }

const (
	defaultSSHPort = "22"
	defaultTLSPort = "16514"
)

var hostLabelRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.:@\[\]-]*$`)

// endpoint parses the spec. Each error names the spec and what to do.
func (h HostSpec) endpoint() (endpoint, error) {
	fail := func(format string, args ...any) (endpoint, error) {
		return endpoint{}, fmt.Errorf("host %q: %s", h.URI, fmt.Sprintf(format, args...))
	}
	if h.Desktops < 0 {
		return fail("desktops %d: want 0 (no cap) or more", h.Desktops)
	}
	if h.Name != "" && !hostLabelRE.MatchString(h.Name) {
		return fail("name %q: use letters, digits and '-', '_', '.', ':'", h.Name)
	}
	u, err := url.Parse(h.URI)
	if err != nil {
		return fail("%v", err)
	}
	if u.Opaque != "" || u.Fragment != "" {
		return fail("want a libvirt URI such as qemu:///system or qemu+ssh://user@host/system")
	}
	driver, trans, _ := strings.Cut(u.Scheme, "+")
	if driver != "qemu" {
		return fail("driver %q: legato runs QEMU domains; want qemu:// (or qemu+ssh://, qemu+tls://)", driver)
	}
	q := u.Query()
	var ep endpoint
	ep.name = libvirt.ConnectURI("qemu://" + u.Path)
	allowed := []string{"socket"}
	switch trans {
	case "", "unix":
		if u.Host != "" || u.User != nil {
			if trans == "" {
				return fail("a host in a plain qemu:// URI means TLS to libvirt: write qemu+tls://%s%s (or qemu+ssh://)", u.Host, u.Path)
			}
			return fail("qemu+unix takes no host: it is this machine's socket")
		}
		ep.transport = transportLocal
		ep.label = "local"
	case "ssh":
		if u.Hostname() == "" {
			return fail("qemu+ssh needs a host: qemu+ssh://user@host/system")
		}
		ep.transport = transportSSH
		t := &sshTarget{host: u.Hostname(), port: u.Port(), keyFile: q.Get("keyfile"), knownHosts: q.Get("known_hosts")}
		if t.port == "" {
			t.port = defaultSSHPort
		}
		if u.User != nil {
			if _, has := u.User.Password(); has {
				return fail("no passwords in the URI: legato logs in with keys (~/.ssh, the agent, ?keyfile=)")
			}
			t.user = u.User.Username()
		}
		ep.ssh = t
		ep.label = u.Host
		allowed = append(allowed, "keyfile", "known_hosts")
		if v := q.Get("no_verify"); v != "" && v != "0" {
			return fail("no_verify=%s: legato always checks the host's key against known_hosts; add the host's key there instead", v)
		}
		if v := q.Get("known_hosts_verify"); v != "" && v != "normal" {
			return fail("known_hosts_verify=%s: legato always checks the host's key against known_hosts; add the host's key there instead", v)
		}
		allowed = append(allowed, "no_verify", "known_hosts_verify")
	case "tls":
		if u.Hostname() == "" {
			return fail("qemu+tls needs a host: qemu+tls://host/system")
		}
		if u.User != nil {
			return fail("qemu+tls takes no user: TLS authenticates with certificates")
		}
		ep.transport = transportTLS
		ep.tlsHost, ep.tlsPort, ep.pkiPath = u.Hostname(), u.Port(), q.Get("pkipath")
		if ep.tlsPort == "" {
			ep.tlsPort = defaultTLSPort
		}
		ep.label = u.Host
		allowed = []string{"pkipath"}
		if v := q.Get("no_verify"); v != "" && v != "0" {
			return fail("no_verify=%s: legato always verifies the host's certificate", v)
		}
		allowed = append(allowed, "no_verify")
	default:
		return fail("transport %q: want qemu:///system, qemu+unix://, qemu+ssh:// or qemu+tls://", trans)
	}
	for k := range q {
		if !slices.Contains(allowed, k) {
			return fail("parameter %q is not supported here (supported: %s)", k, strings.Join(allowed, ", "))
		}
	}
	switch s := q.Get("socket"); {
	case s != "":
		if !strings.HasPrefix(s, "/") {
			return fail("socket %q: want an absolute path", s)
		}
		ep.socket = s
	case u.Path == "/system":
		ep.socket = DefaultSocket
	case ep.transport != transportTLS:
		return fail("path %q: only /system has a known socket; add ?socket=PATH", u.Path)
	}
	if ep.transport == transportTLS && u.Path != "/system" {
		return fail("path %q: want /system", u.Path)
	}
	if h.SSH != "" {
		if ep.transport != transportTLS {
			return fail("ssh=%s: only qemu+tls hosts take an SSH address; qemu+ssh hosts use their own connection and local guests need none", h.SSH)
		}
		t, err := parseSSHAddr(h.SSH)
		if err != nil {
			return fail("%v", err)
		}
		ep.ssh = t
	} else if ep.transport == transportTLS {
		return fail("the guests' ports are bound to the host's 127.0.0.1 and reached over SSH: add ,ssh=USER@%s", ep.tlsHost)
	}
	if ep.ssh != nil && ep.ssh.user == "" {
		cur, err := user.Current()
		if err != nil {
			return fail("no user in the URI and the current user is unknown (%v): write USER@%s", err, ep.ssh.host)
		}
		ep.ssh.user = cur.Username
	}
	if h.Name != "" {
		ep.label = h.Name
	}
	return ep, nil
}

// parseSSHAddr parses [USER@]HOST[:PORT].
func parseSSHAddr(s string) (*sshTarget, error) {
	u, err := url.Parse("ssh://" + s)
	if err != nil || u.Hostname() == "" || u.Path != "" || u.RawQuery != "" {
		return nil, fmt.Errorf("ssh=%s: want [USER@]HOST[:PORT]", s)
	}
	t := &sshTarget{host: u.Hostname(), port: u.Port()}
	if t.port == "" {
		t.port = defaultSSHPort
	}
	if u.User != nil {
		if _, has := u.User.Password(); has {
			return nil, fmt.Errorf("ssh=%s: no passwords: legato logs in with keys", s)
		}
		t.user = u.User.Username()
	}
	return t, nil
}

// checkHostSpecs reports specs that are invalid or share a label (records
// and reports tell hosts apart by it).
func checkHostSpecs(specs []HostSpec) error {
	var errs []error
	seen := map[string]int{}
	for i, h := range specs {
		if err := h.Validate(); err != nil {
			errs = append(errs, err)
			continue
		}
		l := h.Label()
		if j, dup := seen[l]; dup {
			errs = append(errs, fmt.Errorf("hosts %d and %d are both %q: give each its own name (,name=NAME)", j, i, l))
		}
		seen[l] = i
	}
	return errors.Join(errs...)
}
