package osworld

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"legato/rl/desktop"
	"legato/rl/desktop/osworld/grade"
	"legato/rl/desktop/osworld/vm"
)

// PasswordEnv is the environment variable that holds the guest user's
// password (Config.ClientPassword); it is never a flag, so it stays out of
// argv.
const PasswordEnv = "LEGATO_GUEST_PASSWORD"

// Flags are the command-line flags of the osworld backend, for `legato rl
// collect` and `legato rl gc`. Register binds them to a FlagSet; Config
// turns them into a Config. Fields not bound to a flag (Ready) are set by
// the caller from its own flags before calling Config or Factory.
type Flags struct {
	LibvirtURI  string
	Image       string
	Kernel      string
	Initrd      string
	Cmdline     string
	VCPUs       int
	MemoryMiB   int
	Accel       string
	OverlayDir  string
	NamePrefix  string
	BootTimeout time.Duration
	Guests      []GuestAddr
	OSWorldDir  string
	Grader      string
	Python      string
	NoFastReset bool
	CacheDir    string

	// Ready is the ready signal's configuration.
	Ready ReadyConfig
}

// Register defines the backend's flags on fs. It panics, as flag does, if
// fs already defines one of them.
func (f *Flags) Register(fs *flag.FlagSet) {
	fs.StringVar(&f.LibvirtURI, "libvirt-uri", vm.DefaultURI, "libvirt connection of the VMs (a local unix socket)")
	fs.StringVar(&f.Image, "image", "", "VM base image: a qcow2 file (OSWorld's Ubuntu image), or a directory built by desktop/osworld/testdata/image/build.sh (base.qcow2 with vmlinux, initrd.img, cmdline)")
	fs.StringVar(&f.Kernel, "kernel", "", "boot this kernel directly instead of the image's bootloader (set by --image DIR)")
	fs.StringVar(&f.Initrd, "initrd", "", "initrd for --kernel")
	fs.StringVar(&f.Cmdline, "cmdline", "", "kernel command line for --kernel")
	fs.IntVar(&f.VCPUs, "vcpus", vm.DefaultVCPUs, "vCPUs per VM")
	fs.IntVar(&f.MemoryMiB, "memory", vm.DefaultMemoryMiB, "memory per VM, MiB")
	fs.StringVar(&f.Accel, "accel", string(vm.AccelAuto), "VM acceleration: auto (KVM where it really works), kvm, or tcg (software emulation)")
	fs.StringVar(&f.OverlayDir, "overlay-dir", vm.DefaultOverlayDir, "directory of the VMs' overlays and console logs (readable by QEMU's user)")
	fs.StringVar(&f.NamePrefix, "vm-prefix", vm.DefaultNamePrefix, "name prefix of this run's VMs; a run removes every VM with its prefix left by a crashed one, so concurrent runs need different prefixes")
	fs.DurationVar(&f.BootTimeout, "boot-timeout", vm.DefaultBootTimeout, "bound on a VM's boot until its guest server answers")
	fs.Func("guest-url", "an OSWorld guest that already runs (Docker, another host), one per desktop; repeat the flag: URL[,devtools=PORT][,vlc=PORT]. Fast reset only: no snapshots", func(s string) error {
		a, err := ParseGuestAddr(s)
		if err != nil {
			return err
		}
		f.Guests = append(f.Guests, a)
		return nil
	})
	fs.StringVar(&f.OSWorldDir, "osworld", "", "OSWorld checkout: task files and the evaluators the grader runs")
	fs.StringVar(&f.Grader, "grader", "auto", "where metrics run: auto (OSWorld's Python with --osworld, else native), bridge, native (Go where implemented, Python for the rest), native-only")
	fs.StringVar(&f.Python, "python", grade.DefaultPython, "Python with the packages OSWorld's evaluators import")
	fs.BoolVar(&f.NoFastReset, "no-fast-reset", false, "revert the VM snapshot before every attempt (the baseline), instead of a fast reset where the domain allows")
	fs.StringVar(&f.CacheDir, "cache-dir", "", "cache of task files and cloud files (default: legato/osworld in the user cache directory)")
}

// Config returns the backend configuration the flags describe, checked.
func (f *Flags) Config(logger *slog.Logger) (Config, error) {
	cfg, err := f.config(logger)
	if err != nil {
		return Config{}, err
	}
	if err := cfg.Validate(); err != nil {
		return Config{}, err
	}
	return cfg, nil
}

// config builds the Config without validating it.
func (f *Flags) config(logger *slog.Logger) (Config, error) {
	cfg := Config{
		VM: vm.Config{
			URI:         f.LibvirtURI,
			NamePrefix:  f.NamePrefix,
			Kernel:      f.Kernel,
			Initrd:      f.Initrd,
			Cmdline:     f.Cmdline,
			VCPUs:       f.VCPUs,
			MemoryMiB:   f.MemoryMiB,
			Accel:       vm.Accel(f.Accel),
			OverlayDir:  f.OverlayDir,
			BootTimeout: f.BootTimeout,
			Logger:      logger,
		},
		Guests:         f.Guests,
		NoFastReset:    f.NoFastReset,
		Ready:          f.Ready,
		CacheDir:       f.CacheDir,
		ClientPassword: os.Getenv(PasswordEnv),
		Grade:          GradeConfig{OSWorldDir: f.OSWorldDir, Python: f.Python},
		Logger:         logger,
	}
	switch vm.Accel(f.Accel) {
	case "", vm.AccelAuto, vm.AccelKVM, vm.AccelTCG:
	default:
		return Config{}, fmt.Errorf("--accel %q: want auto, kvm or tcg", f.Accel)
	}
	switch f.Grader {
	case "", "auto":
		if f.OSWorldDir == "" {
			cfg.Grade.Mode = grade.NativeOnly
		}
	default:
		m, err := grade.ParseMode(f.Grader)
		if err != nil {
			return Config{}, fmt.Errorf("--grader: %w (or auto)", err)
		}
		if m != grade.NativeOnly && f.OSWorldDir == "" {
			return Config{}, fmt.Errorf("--grader %s runs OSWorld's Python evaluators: give the checkout with --osworld, or use --grader native-only", f.Grader)
		}
		cfg.Grade.Mode = m
	}
	if f.Image != "" {
		if len(f.Guests) > 0 {
			return Config{}, errors.New("--image and --guest-url: choose VMs started here or guests that already run")
		}
		if err := f.image(&cfg.VM); err != nil {
			return Config{}, err
		}
	}
	return cfg, nil
}

// image fills the VM's image from --image: a qcow2 file, or a directory of
// legato's test guest with its kernel, initrd and command line, which the
// explicit flags override.
func (f *Flags) image(c *vm.Config) error {
	st, err := os.Stat(f.Image)
	if err != nil {
		return fmt.Errorf("--image: %w", err)
	}
	if !st.IsDir() {
		c.BaseImage = f.Image
		return nil
	}
	c.BaseImage = filepath.Join(f.Image, "base.qcow2")
	if _, err := os.Stat(c.BaseImage); err != nil {
		return fmt.Errorf("--image %s: a directory needs base.qcow2 (built by desktop/osworld/testdata/image/build.sh): %w", f.Image, err)
	}
	if c.Kernel == "" {
		if k := filepath.Join(f.Image, "vmlinux"); exists(k) {
			c.Kernel = k
		}
	}
	if c.Initrd == "" && c.Kernel != "" {
		if i := filepath.Join(f.Image, "initrd.img"); exists(i) {
			c.Initrd = i
		}
	}
	if c.Cmdline == "" && c.Kernel != "" {
		if b, err := os.ReadFile(filepath.Join(f.Image, "cmdline")); err == nil {
			c.Cmdline = strings.TrimSpace(string(b))
		}
	}
	return nil
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// Factory returns the desktop factory the flags describe and the cleanup
// to run after the batch (see NewFactory). Use Pool for Pool.CheckTasks and
// Config.Slots.
func (f *Flags) Factory(ctx context.Context, logger *slog.Logger) (desktop.Factory, func() error, error) {
	p, err := f.Pool(ctx, logger)
	if err != nil {
		return nil, nil, err
	}
	return p.New, p.Close, nil
}

// Pool returns the desktop pool the flags describe.
func (f *Flags) Pool(ctx context.Context, logger *slog.Logger) (*Pool, error) {
	cfg, err := f.Config(logger)
	if err != nil {
		return nil, err
	}
	return NewPool(ctx, cfg)
}

// GC removes the VMs of cfg.VM's name prefix that a crashed run left
// behind (domains, overlays, console logs), and writes one line per VM to
// w. It only needs cfg.VM's URI, NamePrefix and OverlayDir. Run it when no
// run of that prefix is going on: it removes running VMs too.
func GC(ctx context.Context, cfg Config, w io.Writer) error {
	if len(cfg.Guests) > 0 {
		_, err := fmt.Fprintln(w, "guests given by URL: nothing to remove")
		return err
	}
	left, err := vm.List(ctx, cfg.VM)
	if err != nil {
		return fmt.Errorf("list leftover VMs: %w", err)
	}
	if len(left) == 0 {
		_, err := fmt.Fprintln(w, "no leftover VMs")
		return err
	}
	removed, err := vm.Sweep(ctx, cfg.VM)
	done := map[string]bool{}
	for _, n := range removed {
		done[n] = true
	}
	for _, l := range left {
		what := "files only"
		switch {
		case l.Running:
			what = "running domain"
		case l.Domain:
			what = "stopped domain"
		}
		verb := "removed"
		if !done[l.Name] {
			verb = "NOT removed"
		}
		if _, werr := fmt.Fprintf(w, "%s %s (%s; %d files)\n", verb, l.Name, what, len(l.Files)); werr != nil {
			return werr
		}
	}
	if err != nil {
		return fmt.Errorf("remove leftover VMs: %w", err)
	}
	return nil
}
