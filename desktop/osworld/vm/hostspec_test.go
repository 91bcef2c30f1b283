package vm

import (
	"os/user"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseHostSpec(t *testing.T) {
	me, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		in      string
		want    HostSpec
		label   string
		wantErr string
	}{
		{in: "qemu:///system", want: HostSpec{URI: "qemu:///system"}, label: "local"},
		{in: "qemu:///system,desktops=3", want: HostSpec{URI: "qemu:///system", Desktops: 3}, label: "local"},
		{in: "qemu+unix:///system?socket=/run/x.sock", want: HostSpec{URI: "qemu+unix:///system?socket=/run/x.sock"}, label: "local"},
		{in: "qemu+ssh://root@10.0.0.7/system,desktops=16", want: HostSpec{URI: "qemu+ssh://root@10.0.0.7/system", Desktops: 16}, label: "10.0.0.7"},
		{in: "qemu+ssh://root@h1:2222/system?keyfile=/k&known_hosts=/kh,name=gpu-1",
			want: HostSpec{URI: "qemu+ssh://root@h1:2222/system?keyfile=/k&known_hosts=/kh", Name: "gpu-1"}, label: "gpu-1"},
		{in: "qemu+tls://h2/system,ssh=ops@h2,desktops=8", want: HostSpec{URI: "qemu+tls://h2/system", SSH: "ops@h2", Desktops: 8}, label: "h2"},
		{in: "qemu+ssh://h3/system", want: HostSpec{URI: "qemu+ssh://h3/system"}, label: "h3"},

		{in: "qemu:///system,desktops=0", wantErr: "at least 1"},
		{in: "qemu:///system,desktops=x", wantErr: "at least 1"},
		{in: "qemu:///system,gpus=2", wantErr: "unknown option"},
		{in: "qemu:///system,desktops", wantErr: "want desktops=N"},
		{in: "xen:///system", wantErr: `driver "xen"`},
		{in: "qemu+tcp://h/system", wantErr: `transport "tcp"`},
		{in: "qemu://h/system", wantErr: "qemu+tls://h/system"},
		{in: "qemu:///session", wantErr: "?socket=PATH"},
		{in: "qemu+ssh:///system", wantErr: "needs a host"},
		{in: "qemu+ssh://u:pw@h/system", wantErr: "no passwords"},
		{in: "qemu+ssh://h/system?no_verify=1", wantErr: "always checks the host's key"},
		{in: "qemu+ssh://h/system?known_hosts_verify=ignore", wantErr: "always checks the host's key"},
		{in: "qemu+ssh://h/system?command=/bin/nc", wantErr: `parameter "command"`},
		{in: "qemu+ssh://h/system?socket=run/sock", wantErr: "absolute path"},
		{in: "qemu+tls://h/system", wantErr: "add ,ssh=USER@h"},
		{in: "qemu+tls://h/system?no_verify=1,ssh=u@h", wantErr: "always verifies"},
		{in: "qemu+ssh://h/system,ssh=u@h", wantErr: "only qemu+tls hosts"},
		{in: "qemu:///system,name=a b", wantErr: "name"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseHostSpec(tt.in)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("ParseHostSpec(%q) = %+v, %v; want an error with %q", tt.in, got, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
			if l := got.Label(); l != tt.label {
				t.Errorf("label %q, want %q", l, tt.label)
			}
			again, err := ParseHostSpec(got.String())
			if err != nil || again != got {
				t.Errorf("String %q parses to %+v, %v; want the same spec", got.String(), again, err)
			}
		})
	}
	// How each transport is reached.
	for _, tt := range []struct {
		uri                      string
		transport                transport
		socket, sshAddr, sshUser string
	}{
		{"qemu:///system", transportLocal, DefaultSocket, "", ""},
		{"qemu+ssh://root@h:2222/system", transportSSH, DefaultSocket, "h:2222", "root"},
		{"qemu+ssh://h/system?socket=/run/other", transportSSH, "/run/other", "h:22", me.Username},
		{"qemu+tls://h/system", transportTLS, DefaultSocket, "h:22", "ops"},
	} {
		spec := HostSpec{URI: tt.uri}
		if tt.transport == transportTLS {
			spec.SSH = "ops@h"
		}
		ep, err := spec.endpoint()
		if err != nil {
			t.Fatal(err)
		}
		if ep.transport != tt.transport || ep.socket != tt.socket || ep.name != "qemu:///system" {
			t.Errorf("%s: transport %v socket %q name %q", tt.uri, ep.transport, ep.socket, ep.name)
		}
		var addr, usr string
		if ep.ssh != nil {
			addr, usr = ep.ssh.addr(), ep.ssh.user
		}
		if addr != tt.sshAddr || usr != tt.sshUser {
			t.Errorf("%s: ssh %s@%s, want %s@%s", tt.uri, usr, addr, tt.sshUser, tt.sshAddr)
		}
	}
}
