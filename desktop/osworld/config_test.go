package osworld

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"legato/rl/desktop/osworld/grade"
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
		{name: "long process name", cfg: Config{Guests: guests, AppsToKill: map[string][]string{"os": {"gnome-terminal-server"}}}, want: []string{"longer than 15 bytes"}},
		{name: "process path", cfg: Config{Guests: guests, AppsToKill: map[string][]string{"os": {"/usr/bin/gedit"}}}, want: []string{"not a path"}},
		{name: "bad load", cfg: Config{Guests: guests, Ready: ReadyConfig{MaxLoad: 1.5}}, want: []string{"Ready.MaxLoad"}},
		{name: "negative wait", cfg: Config{Guests: guests, Ready: ReadyConfig{BeforeEvalMax: -time.Second}}, want: []string{"Ready.BeforeEvalMax"}},
		{name: "osworld dir", cfg: Config{Guests: guests, Grade: GradeConfig{OSWorldDir: "/nonexistent"}}, want: []string{"OSWorld checkout"}},
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

func TestDefaultAppsToKillAreValid(t *testing.T) {
	cfg := Config{Guests: []GuestAddr{{URL: "http://127.0.0.1:5000"}}, AppsToKill: DefaultAppsToKill()}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	list := cfg.killList()
	for _, want := range []string{"chrome", "soffice.bin", "gimp", "vlc", "thunderbird", "code"} {
		if !strings.Contains(" "+strings.Join(list, " ")+" ", " "+want+" ") {
			t.Errorf("kill list %v lacks %s", list, want)
		}
	}
	for i := 1; i < len(list); i++ {
		if list[i-1] >= list[i] {
			t.Errorf("kill list %v is not sorted and unique", list)
		}
	}
}

func TestFlags(t *testing.T) {
	img := t.TempDir()
	// QEMU runs as another user: Validate wants the image readable by it.
	for _, d := range []string{filepath.Dir(img), img} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{"base.qcow2", "vmlinux", "initrd.img"} {
		if err := os.WriteFile(filepath.Join(img, f), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(img, "cmdline"), []byte("root=/dev/vda quiet\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	osw := t.TempDir()
	tests := []struct {
		name    string
		args    []string
		env     string
		want    Config
		wantErr string
	}{
		{
			name: "test guest directory",
			args: []string{"--image", img, "--vcpus", "2", "--memory", "1536", "--accel", "tcg", "--no-fast-reset"},
			want: Config{
				VM: vm.Config{URI: vm.DefaultURI, NamePrefix: vm.DefaultNamePrefix, BaseImage: filepath.Join(img, "base.qcow2"),
					Kernel: filepath.Join(img, "vmlinux"), Initrd: filepath.Join(img, "initrd.img"), Cmdline: "root=/dev/vda quiet",
					VCPUs: 2, MemoryMiB: 1536, Accel: vm.AccelTCG, OverlayDir: vm.DefaultOverlayDir, BootTimeout: vm.DefaultBootTimeout},
				NoFastReset: true,
				Grade:       GradeConfig{Python: grade.DefaultPython, Mode: grade.NativeOnly},
			},
		},
		{
			name: "guests with osworld",
			args: []string{"--guest-url", "http://127.0.0.1:5000,devtools=9222", "--guest-url", "http://127.0.0.1:5001", "--osworld", osw, "--grader", "native"},
			env:  "hunter2",
			want: Config{
				VM:             vm.Config{URI: vm.DefaultURI, NamePrefix: vm.DefaultNamePrefix, VCPUs: vm.DefaultVCPUs, MemoryMiB: vm.DefaultMemoryMiB, Accel: vm.AccelAuto, OverlayDir: vm.DefaultOverlayDir, BootTimeout: vm.DefaultBootTimeout},
				Guests:         []GuestAddr{{URL: "http://127.0.0.1:5000", DevToolsPort: 9222}, {URL: "http://127.0.0.1:5001"}},
				Grade:          GradeConfig{OSWorldDir: osw, Python: grade.DefaultPython, Mode: grade.PreferNative},
				ClientPassword: "hunter2",
			},
		},
		{name: "bridge without checkout", args: []string{"--guest-url", "http://127.0.0.1:5000", "--grader", "bridge"}, wantErr: "--osworld"},
		{name: "bad grader", args: []string{"--guest-url", "http://127.0.0.1:5000", "--grader", "magic"}, wantErr: "--grader"},
		{name: "bad accel", args: []string{"--guest-url", "http://127.0.0.1:5000", "--accel", "hvf"}, wantErr: "--accel"},
		{name: "image and guests", args: []string{"--image", img, "--guest-url", "http://127.0.0.1:5000"}, wantErr: "choose"},
		{name: "bad guest url", args: []string{"--guest-url", "localhost:5000"}, wantErr: "http://HOST:PORT"},
		{name: "nothing", args: nil, wantErr: "no desktops"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv(PasswordEnv, tt.env)
			var f Flags
			fs := flag.NewFlagSet("collect", flag.ContinueOnError)
			fs.SetOutput(&strings.Builder{})
			f.Register(fs)
			err := fs.Parse(tt.args)
			var cfg Config
			if err == nil {
				cfg, err = f.Config(nil)
			}
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Errorf("flags %q: %v; want an error containing %q", tt.args, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, cfg, cmpopts.IgnoreFields(vm.Config{}, "Logger")); diff != "" {
				t.Errorf("config (-want +got):\n%s", diff)
			}
		})
	}
}
