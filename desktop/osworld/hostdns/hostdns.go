// Package hostdns finds a batch's libvirt hosts through DNS: the A and
// AAAA records of a name (a Kubernetes headless Service's, one per ready
// pod), or its SRV records, each a host whose sshd the records name. Specs
// turns one lookup's records into host specs (qemu+ssh URIs), Lookup
// resolves a name once (legato rl hosts, gc), and a Watcher resolves it
// again and again during a batch, so that a host that joins gets desktops
// and one that leaves gets none (osworld.Pool follows it).
package hostdns

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"legato/rl/desktop/osworld/vm"
)

// Defaults of Source.
const (
	DefaultPort  = 22
	DefaultEvery = 30 * time.Second
	// MinEvery and MaxEvery bound Source.Every.
	MinEvery = time.Second
	MaxEvery = time.Hour
)

// Scheme starts the value of --hosts-from.
const Scheme = "dns:"

// Source is a DNS name whose records are a batch's libvirt hosts, and how
// to reach each (every host takes the same user, keys and cap: neither an
// A record nor a Kubernetes SRV record can carry more).
type Source struct {
	// Name is the DNS name. A name starting with '_' is an SRV name
	// (_ssh._tcp.legato-hosts.legato.svc.cluster.local): each record's
	// target and port is a host. Any other name's A and AAAA records are,
	// each address a host, its sshd at Port.
	Name string
	// Port is the sshd port of the addresses of A and AAAA records
	// (default 22); an SRV record names its own.
	Port int
	// User logs in to each host (default: the current user).
	User string
	// Desktops caps the desktops of each host (0: no cap).
	Desktops int
	// KeyFile and KnownHosts are the hosts' ?keyfile= and ?known_hosts=
	// (default: vm.SSHConfig's). Pod addresses change: their known_hosts
	// needs a line that covers them all (@cert-authority, or a pattern).
	KeyFile, KnownHosts string
	// Every is the time between two lookups during a batch (default 30s).
	Every time.Duration
	// Resolver looks the name up (nil: Go's own resolver, reading
	// /etc/resolv.conf and /etc/hosts).
	Resolver *net.Resolver
}

var (
	dnsNameRE = regexp.MustCompile(`^[A-Za-z0-9_]([A-Za-z0-9_.-]*[A-Za-z0-9_.])?$`)
	userRE    = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]*$`)
)

// ParseSource parses the value of --hosts-from:
// dns:NAME[:PORT][,user=USER][,desktops=N][,every=DUR][,keyfile=PATH][,known_hosts=PATH].
func ParseSource(s string) (Source, error) {
	fail := func(format string, args ...any) (Source, error) {
		return Source{}, fmt.Errorf("hosts from %q: %s", s, fmt.Sprintf(format, args...))
	}
	parts := strings.Split(s, ",")
	name, ok := strings.CutPrefix(strings.TrimSpace(parts[0]), Scheme)
	if !ok {
		return fail("want dns:NAME[:PORT] (the A/AAAA records of NAME, sshd at PORT) or dns:_ssh._tcp.NAME (its SRV records)")
	}
	var src Source
	src.Name = name
	if n, port, has := strings.Cut(name, ":"); has {
		p, err := strconv.Atoi(port)
		if err != nil || p < 1 || p > 65535 {
			return fail("port %q: want 1 to 65535", port)
		}
		src.Name, src.Port = n, p
	}
	for _, p := range parts[1:] {
		k, v, ok := strings.Cut(strings.TrimSpace(p), "=")
		if !ok || v == "" {
			return fail("%q: want user=USER, desktops=N, every=DURATION, keyfile=PATH or known_hosts=PATH", p)
		}
		switch k {
		case "user":
			src.User = v
		case "desktops":
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 {
				return fail("desktops=%s: want a whole number of at least 1", v)
			}
			src.Desktops = n
		case "every":
			d, err := time.ParseDuration(v)
			if err != nil {
				return fail("every=%s: want a duration such as 30s", v)
			}
			src.Every = d
		case "keyfile":
			src.KeyFile = v
		case "known_hosts":
			src.KnownHosts = v
		default:
			return fail("unknown option %q: want user=USER, desktops=N, every=DURATION, keyfile=PATH or known_hosts=PATH", k)
		}
	}
	if err := src.Validate(); err != nil {
		return fail("%v", err)
	}
	return src, nil
}

// Validate reports what is wrong with the source.
func (s Source) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if s.Name == "" || len(s.Name) > 253 || !dnsNameRE.MatchString(s.Name) {
		bad("name %q: want a DNS name (letters, digits, '-', '_', '.')", s.Name)
	}
	if s.srv() && s.Port != 0 {
		bad("%s is an SRV name, whose records give each host's port: drop :%d", s.Name, s.Port)
	}
	if s.Port < 0 || s.Port > 65535 {
		bad("port %d: want 1 to 65535", s.Port)
	}
	if s.User != "" && !userRE.MatchString(s.User) {
		bad("user %q: want a user name (letters, digits, '-', '_', '.')", s.User)
	}
	if s.Desktops < 0 {
		bad("desktops %d: want 0 (no cap) or more", s.Desktops)
	}
	if s.Every != 0 && (s.Every < MinEvery || s.Every > MaxEvery) {
		bad("every %v: want from %v to %v", s.Every, MinEvery, MaxEvery)
	}
	return errors.Join(errs...)
}

// String returns the source in ParseSource's form.
func (s Source) String() string {
	b := Scheme + s.Name
	if s.Port != 0 {
		b += ":" + strconv.Itoa(s.Port)
	}
	for _, o := range []struct{ k, v string }{
		{"user", s.User}, {"desktops", strconv.Itoa(s.Desktops)}, {"every", s.Every.String()},
		{"keyfile", s.KeyFile}, {"known_hosts", s.KnownHosts},
	} {
		if o.v != "" && o.v != "0" && o.v != "0s" {
			b += "," + o.k + "=" + o.v
		}
	}
	return b
}

// srv reports whether the name is an SRV name.
func (s Source) srv() bool { return strings.HasPrefix(s.Name, "_") }

// every returns Every or its default.
func (s Source) every() time.Duration {
	if s.Every == 0 {
		return DefaultEvery
	}
	return s.Every
}

// Record is one host a lookup found: an address of an A or AAAA record, or
// the target of an SRV record, and its sshd's port.
type Record struct {
	Host string
	Port int
}

// Specs turns the records of one lookup into host specs, sorted by name:
// qemu+ssh://USER@HOST:PORT/system with the source's keys and cap, named
// after the address or the SRV target (no trailing dot). A host that two
// records name (one target at two ports) is taken once, at the lowest
// port; records without a host or with a port out of range are left out.
func Specs(src Source, recs []Record) []vm.HostSpec {
	port := map[string]int{}
	for _, r := range recs {
		host := strings.ToLower(strings.TrimSuffix(r.Host, "."))
		if a, err := netip.ParseAddr(host); err == nil {
			host = a.Unmap().WithZone("").String()
		}
		if host == "" || r.Port < 1 || r.Port > 65535 {
			continue
		}
		if p, seen := port[host]; !seen || r.Port < p {
			port[host] = r.Port
		}
	}
	q := url.Values{}
	if src.KeyFile != "" {
		q.Set("keyfile", src.KeyFile)
	}
	if src.KnownHosts != "" {
		q.Set("known_hosts", src.KnownHosts)
	}
	specs := make([]vm.HostSpec, 0, len(port))
	for host, p := range port {
		u := url.URL{Scheme: "qemu+ssh", Host: net.JoinHostPort(host, strconv.Itoa(p)), Path: "/system", RawQuery: q.Encode()}
		if src.User != "" {
			u.User = url.User(src.User)
		}
		specs = append(specs, vm.HostSpec{URI: u.String(), Desktops: src.Desktops, Name: host})
	}
	slices.SortFunc(specs, func(a, b vm.HostSpec) int { return strings.Compare(a.Name, b.Name) })
	return specs
}

// ErrNoRecords means the name has no record that names a host.
var ErrNoRecords = errors.New("no records")

// Lookup resolves the source's name once and returns its hosts. A name
// without records is an error wrapping ErrNoRecords.
func Lookup(ctx context.Context, src Source) ([]vm.HostSpec, error) {
	recs, err := lookupRecords(ctx, src)
	if err != nil {
		return nil, err
	}
	specs := Specs(src, recs)
	if len(specs) == 0 {
		what := "A or AAAA"
		if src.srv() {
			what = "SRV"
		}
		return nil, fmt.Errorf("dns name %s: %w of type %s: is the name right, and does its Service have ready pods?", src.Name, ErrNoRecords, what)
	}
	return specs, nil
}

// lookupRecords asks for the name's records; a name that does not exist
// has none.
func lookupRecords(ctx context.Context, src Source) ([]Record, error) {
	r := src.Resolver
	if r == nil {
		r = &net.Resolver{PreferGo: true}
	}
	port := src.Port
	if port == 0 {
		port = DefaultPort
	}
	var recs []Record
	var err error
	if src.srv() {
		var srvs []*net.SRV
		_, srvs, err = r.LookupSRV(ctx, "", "", src.Name)
		for _, s := range srvs {
			recs = append(recs, Record{Host: s.Target, Port: int(s.Port)})
		}
	} else {
		var addrs []netip.Addr
		addrs, err = r.LookupNetIP(ctx, "ip", src.Name)
		for _, a := range addrs {
			recs = append(recs, Record{Host: a.String(), Port: port})
		}
	}
	var dnsErr *net.DNSError
	if errors.As(err, &dnsErr) && dnsErr.IsNotFound {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("resolve %s: %w", src.Name, err)
	}
	return recs, nil
}
