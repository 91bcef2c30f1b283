package hostdns

import (
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"legato/rl/desktop/osworld/hostdns/dnstest"
	"legato/rl/desktop/osworld/vm"
)

func TestParseSource(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want Source
	}{
		{"dns:legato-hosts.legato.svc.cluster.local", Source{Name: "legato-hosts.legato.svc.cluster.local"}},
		{"dns:hosts.example:2222,user=root,desktops=4,every=10s", Source{Name: "hosts.example", Port: 2222, User: "root", Desktops: 4, Every: 10 * time.Second}},
		{"dns:_ssh._tcp.legato-hosts.legato.svc.cluster.local,keyfile=/keys/id,known_hosts=/keys/known", Source{Name: "_ssh._tcp.legato-hosts.legato.svc.cluster.local", KeyFile: "/keys/id", KnownHosts: "/keys/known"}},
		{"dns:hosts.example.", Source{Name: "hosts.example."}},
	} {
		got, err := ParseSource(tt.in)
		if err != nil {
			t.Errorf("ParseSource(%q): %v", tt.in, err)
			continue
		}
		if diff := cmp.Diff(tt.want, got, cmpopts.IgnoreUnexported(net.Resolver{})); diff != "" {
			t.Errorf("ParseSource(%q) (-want +got):\n%s", tt.in, diff)
		}
		if back, err := ParseSource(got.String()); err != nil || !cmp.Equal(back, got, cmpopts.IgnoreUnexported(net.Resolver{})) {
			t.Errorf("ParseSource(%q).String() = %q parses as %+v, %v", tt.in, got.String(), back, err)
		}
	}
	for _, tt := range []struct{ in, want string }{
		{"hosts.example", "want dns:NAME[:PORT]"},
		{"srv:hosts.example", "want dns:NAME[:PORT]"},
		{"dns:", "want a DNS name"},
		{"dns:hosts/example", "want a DNS name"},
		{"dns:hosts.example:0", `port "0": want 1 to 65535`},
		{"dns:hosts.example:ssh", `port "ssh"`},
		{"dns:_ssh._tcp.hosts.example:22", "SRV name, whose records give each host's port: drop :22"},
		{"dns:hosts.example,desktops=0", "desktops=0: want a whole number of at least 1"},
		{"dns:hosts.example,every=5", "every=5: want a duration"},
		{"dns:hosts.example,every=100ms", "every 100ms: want from 1s to 1h0m0s"},
		{"dns:hosts.example,user=a@b", `user "a@b"`},
		{"dns:hosts.example,port=22", `unknown option "port"`},
		{"dns:hosts.example,user", `"user": want user=USER`},
	} {
		_, err := ParseSource(tt.in)
		if err == nil || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), tt.in) {
			t.Errorf("ParseSource(%q) = %v; want an error naming it and saying %q", tt.in, err, tt.want)
		}
	}
}

func TestSpecs(t *testing.T) {
	for _, tt := range []struct {
		name string
		src  Source
		recs []Record
		want []vm.HostSpec
	}{
		{"none", Source{Name: "h"}, nil, []vm.HostSpec{}},
		{
			"addresses, sorted, with the source's user, cap and keys",
			Source{Name: "h", User: "root", Desktops: 4, KeyFile: "/k/id", KnownHosts: "/k/known hosts"},
			[]Record{{"10.0.0.9", 22}, {"10.0.0.10", 22}},
			[]vm.HostSpec{
				{URI: "qemu+ssh://root@10.0.0.10:22/system?keyfile=%2Fk%2Fid&known_hosts=%2Fk%2Fknown+hosts", Desktops: 4, Name: "10.0.0.10"},
				{URI: "qemu+ssh://root@10.0.0.9:22/system?keyfile=%2Fk%2Fid&known_hosts=%2Fk%2Fknown+hosts", Desktops: 4, Name: "10.0.0.9"},
			},
		},
		{
			"IPv6 in brackets, IPv4 in IPv6 unmapped",
			Source{Name: "h"},
			[]Record{{"fd00::5", 2222}, {"::ffff:10.0.0.7", 2222}},
			[]vm.HostSpec{{URI: "qemu+ssh://10.0.0.7:2222/system", Name: "10.0.0.7"}, {URI: "qemu+ssh://[fd00::5]:2222/system", Name: "fd00::5"}},
		},
		{
			"SRV targets without their dot; one target twice is taken at its lowest port",
			Source{Name: "_ssh._tcp.h", User: "root"},
			[]Record{{"Pod-1.H.Legato.svc.", 2200}, {"pod-0.h.legato.svc.", 22}, {"pod-1.h.legato.svc.", 22}},
			[]vm.HostSpec{{URI: "qemu+ssh://root@pod-0.h.legato.svc:22/system", Name: "pod-0.h.legato.svc"}, {URI: "qemu+ssh://root@pod-1.h.legato.svc:22/system", Name: "pod-1.h.legato.svc"}},
		},
		{"records without a host or port are left out", Source{Name: "h"}, []Record{{"", 22}, {".", 22}, {"10.0.0.1", 0}}, []vm.HostSpec{}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got := Specs(tt.src, tt.recs)
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("Specs (-want +got):\n%s", diff)
			}
			for _, s := range got {
				if err := s.Validate(); err != nil {
					t.Errorf("spec %+v: %v", s, err)
				}
				if s.Label() != s.Name {
					t.Errorf("spec %+v labelled %q", s, s.Label())
				}
			}
		})
	}
}

// Lookup finds a name's A and AAAA records, or an SRV name's records; a
// name without records is an error that names it, and so is a server
// that fails.
func TestLookup(t *testing.T) {
	dns := dnstest.Start(t)
	dns.SetA("hosts.legato.test", "10.0.0.2", "fd00::2")
	dns.SetSRV("_ssh._tcp.hosts.legato.test", net.SRV{Target: "pod-0.hosts.legato.test", Port: 22}, net.SRV{Target: "pod-1.hosts.legato.test", Port: 2222})
	dns.SetA("srvonly.legato.test")
	dns.SetSRV("srvonly.legato.test", net.SRV{Target: "pod-0.hosts.legato.test", Port: 22})
	ctx := t.Context()
	names := func(specs []vm.HostSpec) []string {
		var out []string
		for _, s := range specs {
			out = append(out, s.URI)
		}
		return out
	}

	got, err := Lookup(ctx, Source{Name: "hosts.legato.test", User: "root", Resolver: dns.Resolver()})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"qemu+ssh://root@10.0.0.2:22/system", "qemu+ssh://root@[fd00::2]:22/system"}, names(got)); diff != "" {
		t.Errorf("A and AAAA (-want +got):\n%s", diff)
	}
	got, err = Lookup(ctx, Source{Name: "_ssh._tcp.hosts.legato.test", Resolver: dns.Resolver()})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"qemu+ssh://pod-0.hosts.legato.test:22/system", "qemu+ssh://pod-1.hosts.legato.test:2222/system"}, names(got)); diff != "" {
		t.Errorf("SRV (-want +got):\n%s", diff)
	}
	for _, name := range []string{"nothing.legato.test", "srvonly.legato.test"} {
		_, err := Lookup(ctx, Source{Name: name, Resolver: dns.Resolver()})
		if !errors.Is(err, ErrNoRecords) || !strings.Contains(err.Error(), "dns name "+name+": no records of type A or AAAA") {
			t.Errorf("Lookup(%s): %v; want ErrNoRecords naming it", name, err)
		}
	}
	dns.Fail(true)
	_, err = Lookup(ctx, Source{Name: "hosts.legato.test", Resolver: dns.Resolver()})
	if err == nil || errors.Is(err, ErrNoRecords) || !strings.Contains(err.Error(), "resolve hosts.legato.test") {
		t.Errorf("Lookup with a failing server: %v; want its error, naming the name", err)
	}
}
