package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"legato/rl/desktop/osworld"
	"legato/rl/desktop/osworld/grade"
	"legato/rl/desktop/osworld/hostdns"
	"legato/rl/desktop/osworld/vm"
)

// osworldFlags are the flags of the osworld backend (`legato rl collect
// --backend osworld`), bound into an osworld.Config. The flags that need
// more than a field (--image, --grader) are resolved by Config.
type osworldFlags struct {
	cfg    osworld.Config
	image  string
	grader string
}

// registerVMPlace binds where a run's VMs live and what they are called:
// the flags gc and hosts share with collect. from receives --hosts-from.
func registerVMPlace(fs *flag.FlagSet, c *vm.Config, from **hostdns.Source) {
	fs.Func("host", "a libvirt host of the VMs, `URI[,desktops=N]`; repeat the flag for several (URI: qemu:///system, the default; qemu+ssh://USER@HOST/system; qemu+tls://HOST/system,ssh=USER@HOST). Desktops spread over the hosts by free slots", func(s string) error {
		h, err := vm.ParseHostSpec(s)
		if err != nil {
			return err
		}
		c.Hosts = append(c.Hosts, h)
		return nil
	})
	fs.Func("hosts-from", "instead of --host: the libvirt hosts are the records of a DNS name, `dns:NAME[:PORT][,OPTION]...`: each A/AAAA record of NAME "+
		"a host qemu+ssh://USER@ADDR:PORT/system (PORT 22 by default), or each SRV record of a NAME starting with _ (_ssh._tcp.SERVICE) its target and port. "+
		"Options: user=USER; desktops=N, each host's cap; every=DUR (default 30s): a batch resolves NAME again that often, a host that joins gets desktops, "+
		"one that leaves gets no new one and its desktops move to other hosts after their attempt; keyfile=PATH and known_hosts=PATH, as a qemu+ssh URI takes them", func(s string) error {
		if *from != nil {
			return fmt.Errorf("given twice (%s, then %s): the hosts come from one DNS name", *from, s)
		}
		src, err := hostdns.ParseSource(s)
		if err != nil {
			return err
		}
		*from = &src
		return nil
	})
	fs.StringVar(&c.NamePrefix, "vm-prefix", vm.DefaultNamePrefix, "name prefix of this run's VMs; a run removes every VM with its prefix left by a crashed one, so concurrent runs need different prefixes")
	fs.StringVar(&c.StoragePool, "storage-pool", vm.DefaultStoragePool, "libvirt storage pool (`name`) on every host of the image files and the VMs' overlays and console logs; created as a directory pool where missing")
}

// Register defines the backend's flags on fs.
func (f *osworldFlags) Register(fs *flag.FlagSet) {
	c := &f.cfg
	registerVMPlace(fs, &c.VM, &c.HostsFrom)
	fs.StringVar(&f.image, "image", "", "VM base image: a qcow2 file (OSWorld's Ubuntu image), or a directory built by desktop/osworld/testdata/image/build.sh (base.qcow2 with vmlinux, initrd.img, cmdline)")
	fs.StringVar(&c.VM.Kernel, "kernel", "", "boot this kernel directly instead of the image's bootloader (set by --image DIR)")
	fs.StringVar(&c.VM.Initrd, "initrd", "", "initrd for --kernel")
	fs.StringVar(&c.VM.Cmdline, "cmdline", "", "kernel command line for --kernel")
	intVar(fs, &c.VM.VCPUs, "vcpus", vm.DefaultVCPUs, 1, 256, "vCPUs per VM")
	intVar(fs, &c.VM.MemoryMiB, "memory", vm.DefaultMemoryMiB, 256, 1<<20, "memory per VM, MiB")
	fs.TextVar(&c.VM.Accel, "accel", vm.AccelAuto, "VM acceleration `mode`: auto (KVM where it really works), kvm, or tcg (software emulation)")
	durationVar(fs, &c.BootTimeout, "boot-timeout", osworld.DefaultBootTimeout, time.Second, 24*time.Hour,
		"bound on the wait for a desktop's guest server to answer: a VM's boot or revert, or a --guest-url guest when attached")
	fs.Func("guest-url", "an OSWorld guest that already runs (Docker, another host), one per desktop; repeat the flag: URL[,devtools=PORT][,vlc=PORT]. Fast reset only: no snapshots", func(s string) error {
		a, err := osworld.ParseGuestAddr(s)
		if err != nil {
			return err
		}
		c.Guests = append(c.Guests, a)
		return nil
	})
	fs.BoolVar(&c.FastReset.Dedicated, "guest-dedicated", false, "the --guest-url guests run nothing but the desktop (a VM or a container of their own): without it a fast reset refuses a guest that looks shared with other work (other users' processes, more than one X server, root's processes started outside the desktop's session); either way it ends only the processes of the desktop's session (its display, the guest server's, X server's and window manager's sessions) that are its user's")
	fs.BoolVar(&c.FastReset.RootDesktop, "guest-root-desktop", false, "the --guest-url guests run their desktop as root (a container): without it a fast reset refuses a guest whose desktop user is root")
	fs.StringVar(&c.Grade.OSWorldDir, "osworld", "", "OSWorld checkout: task files and the evaluators the grader runs")
	choiceVar(fs, &f.grader, "grader", "auto", []string{"auto", grade.PreferBridge.String(), grade.PreferNative.String(), grade.NativeOnly.String()},
		"grader `mode`, where metrics run (auto: OSWorld's Python with --osworld, else native-only; native: Go where implemented, Python for the rest)")
	fs.StringVar(&c.Grade.Python, "python", grade.DefaultPython, "Python with the packages OSWorld's evaluators import")
	intVar(fs, &c.Grade.Workers, "grade-workers", 0, 0, 64, "Python processes running OSWorld's evaluators, shared by all desktops (0: one per CPU, at least 2 and at most 8)")
	fs.BoolVar(&c.NoFastReset, "no-fast-reset", false, "load the VM snapshot before every attempt (the baseline); otherwise each desktop chooses per task between it and a fast reset, by measured cost, where the domain allows")
	fs.BoolVar(&c.Golden.Off, "no-golden", false, "set every attempt up from a reset (the baseline); otherwise a VM desktop takes each task's set-up state once (a snapshot, at most --golden-max per desktop) and starts the task's later attempts from it, except for tasks whose setup depends on the clock or the network")
	fs.Func("golden-refuse", "a task `id` that never gets a golden state (its setup depends on the clock or the network in a way its steps do not show); repeat the flag", func(s string) error {
		c.Golden.Refuse = append(c.Golden.Refuse, s)
		return nil
	})
	fs.BoolVar(&c.Golden.Fork, "golden-fork", false, "start a task's later attempts in clones of its golden state (a QEMU mapping the state's memory copy-on-write, in a fraction of a second) instead of loading the state into the desktop's VM; on this machine, and on remote hosts through their host agent (see --host-agent); hosts without one load in place")
	fs.StringVar(&c.VM.HostAgent, "host-agent", "", "the legato `program` on remote hosts that --golden-fork starts over SSH to fork there (legato rl host-agent; default legato on the SSH user's PATH)")
	fs.StringVar(&c.VM.ForkDir, "fork-dir", "", "where --golden-fork keeps the states' memory, device state and disk layers, and the clones' files (default "+vm.DefaultForkDir+"; tmpfs or hugetlbfs)")
	fs.StringVar(&c.VM.BootCache, "boot-cache", "", "a `dir`ectory on this machine keeping a VM's clean state after its boot: later VMs of the same machine, image, QEMU and clean-state settings, on any host, start from it in seconds instead of booting, in this run and later ones (an entry goes when it fails to load, when its image is gone from this machine, or after 30 days unused; remove the directory to drop them all). Empty: every VM boots")
	intVar(fs, &c.Golden.Max, "golden-max", osworld.DefaultGoldenMax, 1, 1000, "golden task states a desktop keeps (each holds the guest's memory in its overlay); the least recently used goes first")
	fs.Func("fast-reset-restore", "a guest `dir`ectory a fast reset brings back to its clean contents, besides /home/user and "+
		strings.Join(osworld.DefaultRestoreDirs(), ", ")+"; repeat the flag", func(s string) error {
		c.FastReset.Restore = appendToDefault(c.FastReset.Restore, osworld.DefaultRestoreDirs, s)
		return nil
	})
	fs.Func("fast-reset-check", "a guest `path` where a change since the clean state makes the desktop load its snapshot rather than trust a fast reset, besides "+
		strings.Join(osworld.DefaultCheckDirs(), ", ")+"; repeat the flag", func(s string) error {
		c.FastReset.Check = appendToDefault(c.FastReset.Check, osworld.DefaultCheckDirs, s)
		return nil
	})
	fs.BoolVar(&c.NoExecutor, "no-executor", false, "run every action as its own python -c program in the guest, as OSWorld does (a baseline); otherwise each reset starts an executor in the guest that imports pyautogui once, runs the attempt's actions and tells when the screen settled after each")
	fs.BoolVar(&c.Ready.NoDamage, "ready-compare-screenshots", false, "the ready signal compares screenshots even where the guest watches its own screen (a baseline: two screenshots per settled wait instead of one)")
	fs.StringVar(&c.CacheDir, "cache-dir", "", "cache of task files and cloud files (default: legato/osworld in the user cache directory)")
}

// appendToDefault appends v to list, which starts as defaults() when the
// flag was not given before.
func appendToDefault(list []string, defaults func() []string, v string) []string {
	if list == nil {
		list = defaults()
	}
	return append(list, v)
}

// Config returns the backend configuration the flags describe, checked.
// Every error is a usage error: it comes from the command line.
func (f *osworldFlags) Config(logger *slog.Logger) (osworld.Config, error) {
	cfg := f.cfg
	cfg.ClientPassword = os.Getenv(osworld.PasswordEnv)
	cfg.Logger = logger
	cfg.VM.Logger = logger
	switch f.grader {
	case "", "auto":
		if cfg.Grade.OSWorldDir == "" {
			cfg.Grade.Mode = grade.NativeOnly
		}
	default:
		m, err := grade.ParseMode(f.grader)
		if err != nil {
			return osworld.Config{}, usageErrorf("--grader: %w (or auto)", err)
		}
		if m != grade.NativeOnly && cfg.Grade.OSWorldDir == "" {
			return osworld.Config{}, usageErrorf("--grader %s runs OSWorld's Python evaluators: give the checkout with --osworld, or use --grader native-only", f.grader)
		}
		cfg.Grade.Mode = m
	}
	if cfg.FastReset.Dedicated && len(cfg.Guests) == 0 {
		return osworld.Config{}, usageErrorf("--guest-dedicated speaks of --guest-url guests; VMs started here are dedicated already")
	}
	if cfg.FastReset.RootDesktop && len(cfg.Guests) == 0 {
		return osworld.Config{}, usageErrorf("--guest-root-desktop speaks of --guest-url guests; a VM started here is reset whoever its desktop user is")
	}
	if err := checkVMPlace(cfg.VM, cfg.HostsFrom); err != nil {
		return osworld.Config{}, err
	}
	if f.image != "" {
		if len(cfg.Guests) > 0 {
			return osworld.Config{}, usageErrorf("--image and --guest-url: choose VMs started here or guests that already run")
		}
		if err := imageFlag(f.image, &cfg.VM); err != nil {
			return osworld.Config{}, usage(err)
		}
	}
	if err := cfg.Validate(); err != nil {
		return osworld.Config{}, usage(err)
	}
	return cfg, nil
}

// checkVMPlace refuses --host with --hosts-from: the hosts come one way.
func checkVMPlace(c vm.Config, from *hostdns.Source) error {
	if from != nil && len(c.Hosts) > 0 {
		return usageErrorf("--host and --hosts-from %s: give the hosts one way (a host that is also in the DNS name would be taken twice)", from)
	}
	return nil
}

// Pool returns the desktop pool the flags describe.
func (f *osworldFlags) Pool(ctx context.Context, logger *slog.Logger) (*osworld.Pool, error) {
	cfg, err := f.Config(logger)
	if err != nil {
		return nil, err
	}
	return osworld.NewPool(ctx, cfg)
}

// imageFlag fills the VM's image from --image: a qcow2 file, or a directory
// of legato's test guest with its kernel, initrd and command line, which
// --kernel, --initrd and --cmdline override.
func imageFlag(image string, c *vm.Config) error {
	st, err := os.Stat(image)
	if err != nil {
		return fmt.Errorf("--image: %w", err)
	}
	if !st.IsDir() {
		c.BaseImage = image
		return nil
	}
	c.BaseImage = filepath.Join(image, "base.qcow2")
	if _, err := os.Stat(c.BaseImage); err != nil {
		return fmt.Errorf("--image %s: a directory needs base.qcow2 (built by desktop/osworld/testdata/image/build.sh): %w", image, err)
	}
	if c.Kernel == "" {
		if k := filepath.Join(image, "vmlinux"); exists(k) {
			c.Kernel = k
		}
	}
	if c.Initrd == "" && c.Kernel != "" {
		if i := filepath.Join(image, "initrd.img"); exists(i) {
			c.Initrd = i
		}
	}
	if c.Cmdline == "" && c.Kernel != "" {
		b, err := os.ReadFile(filepath.Join(image, "cmdline"))
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("--image %s: %w", image, err)
		}
		c.Cmdline = strings.TrimSpace(string(b))
	}
	return nil
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
