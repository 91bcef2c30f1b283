package osworld

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"legato/rl/desktop/osworld/hostdns"
	"legato/rl/desktop/osworld/vm"
)

func TestParseGuestAddr(t *testing.T) {
	tests := []struct {
		in      string
		want    GuestAddr
		wantErr string
	}{
		{in: "http://127.0.0.1:5000", want: GuestAddr{URL: "http://127.0.0.1:5000"}},
		{in: "http://127.0.0.1:5000/", want: GuestAddr{URL: "http://127.0.0.1:5000/"}},
		{in: "http://10.1.2.3:5001,devtools=9223,vlc=8081", want: GuestAddr{URL: "http://10.1.2.3:5001", DevToolsPort: 9223, VLCPort: 8081}},
		{in: "http://[::1]:5000, vlc=8080", want: GuestAddr{URL: "http://[::1]:5000", VLCPort: 8080}},
		{in: "127.0.0.1:5000", wantErr: "want http://HOST:PORT"},
		{in: "http://127.0.0.1:5000/api", wantErr: "want http://HOST:PORT"},
		{in: "http://u:p@127.0.0.1:5000", wantErr: "want http://HOST:PORT"},
		{in: "http://127.0.0.1:99999", wantErr: "port \"99999\": want 1-65535"},
		{in: "http://127.0.0.1:0", wantErr: "port \"0\": want 1-65535"},
		{in: "http://127.0.0.1:5000,devtools=0", wantErr: "devtools=PORT"},
		{in: "http://127.0.0.1:5000,devtools=x", wantErr: "devtools=PORT"},
		{in: "http://127.0.0.1:5000,vnc=5900", wantErr: "unknown option \"vnc\""},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseGuestAddr(tt.in)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Errorf("ParseGuestAddr(%q) = %+v, %v; want an error containing %q", tt.in, got, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
			back, err := ParseGuestAddr(got.String())
			if err != nil || back != got {
				t.Errorf("String() = %q does not parse back: %+v, %v", got.String(), back, err)
			}
		})
	}
}

func TestValidate(t *testing.T) {
	guests := []GuestAddr{{URL: "http://127.0.0.1:5000"}}
	tests := []struct {
		name string
		cfg  Config
		// want are substrings of the error, one per problem; none means
		// valid.
		want []string
	}{
		{name: "guests", cfg: Config{Guests: guests}},
		{name: "nothing", cfg: Config{}, want: []string{"no desktops"}},
		{name: "both", cfg: Config{Guests: guests, VM: vm.Config{BaseImage: "/x.qcow2"}}, want: []string{"choose VMs started here or guests"}},
		{name: "missing image", cfg: Config{VM: vm.Config{BaseImage: "/nonexistent/base.qcow2"}}, want: []string{"base.qcow2"}},
		{name: "same guest twice", cfg: Config{Guests: []GuestAddr{{URL: "http://127.0.0.1:5000"}, {URL: "http://127.0.0.1:5000/"}}}, want: []string{"given twice"}},
		{name: "bad guest", cfg: Config{Guests: []GuestAddr{{URL: "ftp://h"}}}, want: []string{"Guests[0]"}},
		{name: "home relative", cfg: Config{Guests: guests, Home: "home/user"}, want: []string{"Home \"home/user\""}},
		{name: "home root", cfg: Config{Guests: guests, Home: "/"}, want: []string{"Home \"/\"", "overlap"}},
		{name: "baseline in home", cfg: Config{Guests: guests, BaselineDir: "/home/user/.baseline"}, want: []string{"overlap"}},
		{name: "restore relative", cfg: Config{Guests: guests, FastReset: FastResetConfig{Restore: []string{"tmp"}}}, want: []string{`FastReset.Restore (--fast-reset-restore): "tmp"`}},
		{name: "restore holds the home", cfg: Config{Guests: guests, FastReset: FastResetConfig{Restore: []string{"/home"}}}, want: []string{`"/home" overlaps Home`}},
		{name: "restore in the state dir", cfg: Config{Guests: guests, FastReset: FastResetConfig{Restore: []string{"/var/lib/legato/clean/x"}}}, want: []string{"overlaps FastReset.StateDir"}},
		{name: "check not clean", cfg: Config{Guests: guests, FastReset: FastResetConfig{Check: []string{"/etc/"}}}, want: []string{`FastReset.Check (--fast-reset-check): "/etc/"`}},
		{name: "skip root", cfg: Config{Guests: guests, FastReset: FastResetConfig{Skip: []string{"/"}}}, want: []string{`FastReset.Skip: "/"`}},
		{name: "state dir relative", cfg: Config{Guests: guests, FastReset: FastResetConfig{StateDir: "x"}}, want: []string{`FastReset.StateDir "x"`}},
		{name: "bad load", cfg: Config{Guests: guests, Ready: ReadyConfig{MaxLoad: 1.5}}, want: []string{"Ready.MaxLoad"}},
		{name: "bad damage", cfg: Config{Guests: guests, Ready: ReadyConfig{MaxDamage: -1}}, want: []string{"Ready.MaxDamage"}},
		{name: "negative wait", cfg: Config{Guests: guests, Ready: ReadyConfig{BeforeEvalMax: -time.Second}}, want: []string{"Ready.BeforeEvalMax"}},
		{name: "negative launch wait", cfg: Config{Guests: guests, Ready: ReadyConfig{AfterLaunchMax: -time.Second}}, want: []string{"Ready.AfterLaunchMax"}},
		{name: "osworld dir", cfg: Config{Guests: guests, Grade: GradeConfig{OSWorldDir: "/nonexistent"}}, want: []string{"OSWorld checkout"}},
		{name: "hosts from DNS and hosts", cfg: Config{VM: vm.Config{BaseImage: "/nonexistent/base.qcow2", Hosts: []vm.HostSpec{{URI: "qemu:///system"}}}, HostsFrom: &hostdns.Source{Name: "hosts.test"}},
			want: []string{"HostsFrom (--hosts-from) and VM.Hosts (--host): give the hosts one way"}},
		{name: "hosts from DNS and guests", cfg: Config{Guests: guests, HostsFrom: &hostdns.Source{Name: "hosts.test"}}, want: []string{"HostsFrom (--hosts-from) names libvirt hosts, and Guests (--guest-url)"}},
		{name: "bad hosts from DNS", cfg: Config{Guests: guests, HostsFrom: &hostdns.Source{Name: "_ssh._tcp.hosts.test", Port: 22}}, want: []string{"HostsFrom (--hosts-from): _ssh._tcp.hosts.test is an SRV name"}},
		{name: "negative grader workers", cfg: Config{Guests: guests, Grade: GradeConfig{Workers: -1}}, want: []string{"Grade.Workers -1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if len(tt.want) == 0 {
				if err != nil {
					t.Errorf("Validate: %v; want nil", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Validate: nil; want errors containing %q", tt.want)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Validate: %v; want it to contain %q", err, w)
				}
			}
		})
	}
}

func TestDefaultFastResetIsValid(t *testing.T) {
	cfg := Config{Guests: []GuestAddr{{URL: "http://127.0.0.1:5000"}}}.withDefaults()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, d := range cfg.FastReset.Check {
		if slices.Contains(cfg.FastReset.Skip, d) || slices.Contains(cfg.FastReset.Restore, d) {
			t.Errorf("checked directory %s is also skipped or restored", d)
		}
	}
}

// TestReadyIntervals: the executor's quiet interval is its own default,
// unless only Interval is set: a user who asked for a longer quiet gets it
// everywhere.
func TestReadyIntervals(t *testing.T) {
	for _, tt := range []struct {
		name           string
		in             ReadyConfig
		probe, watcher time.Duration
	}{
		{"defaults", ReadyConfig{}, DefaultGuestReadyInterval, DefaultExecutorReadyInterval},
		{"interval set", ReadyConfig{Interval: time.Second}, time.Second, time.Second},
		{"both set", ReadyConfig{Interval: time.Second, ExecutorInterval: 200 * time.Millisecond}, time.Second, 200 * time.Millisecond},
		{"executor's set", ReadyConfig{ExecutorInterval: 400 * time.Millisecond}, DefaultGuestReadyInterval, 400 * time.Millisecond},
	} {
		got := tt.in.withDefaults()
		if got.Interval != tt.probe || got.ExecutorInterval != tt.watcher {
			t.Errorf("%s: Interval %v, ExecutorInterval %v; want %v, %v", tt.name, got.Interval, got.ExecutorInterval, tt.probe, tt.watcher)
		}
	}
	if errs := (ReadyConfig{ExecutorInterval: -time.Second}).validate(); len(errs) != 1 || !strings.Contains(errs[0].Error(), "Ready.ExecutorInterval") {
		t.Errorf("a negative ExecutorInterval: %v; want one error naming it", errs)
	}
}
