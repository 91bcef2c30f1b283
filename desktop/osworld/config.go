package osworld

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"legato/rl/desktop"
	"legato/rl/desktop/osworld/grade"
	"legato/rl/desktop/osworld/guest"
	"legato/rl/desktop/osworld/hostdns"
	"legato/rl/desktop/osworld/setup"
	"legato/rl/desktop/osworld/vm"
)

// PasswordEnv is the environment variable the command line reads the guest
// user's password from (Config.ClientPassword); it is never a flag, so it
// stays out of argv.
const PasswordEnv = "LEGATO_GUEST_PASSWORD"

// Defaults for the zero values of Config.
const (
	DefaultHome        = "/home/user"
	DefaultBaselineDir = "/var/lib/legato/home-baseline"
	// DefaultBootTimeout bounds the wait for a desktop's guest server to
	// answer: after a VM boots or reverts, and when a guest given by URL
	// is attached.
	DefaultBootTimeout = vm.DefaultBootTimeout
	// DefaultPrepareTimeout bounds the preparation of a freshly booted VM
	// before its clean snapshot: the /home/user baseline copy and a first
	// settled screen.
	DefaultPrepareTimeout = 3 * time.Minute
)

// Defaults of ReadyConfig.
const (
	// DefaultGuestReadyInterval is the guest's window, longer than
	// desktop.DefaultReadyInterval (300 ms, between two screenshots of any
	// desktop): each look at an OSWorld guest is a round trip to it, a
	// probe that measures its CPU load and redrawn area over the whole
	// interval, then a screenshot; a short window would mean more round
	// trips and a load taken over too few scheduler ticks to say much.
	DefaultGuestReadyInterval = 500 * time.Millisecond
	// DefaultExecutorReadyInterval is the quiet interval where the
	// executor watches the screen inside the guest: a look there is no
	// round trip and the load is measured from the kernel's counters
	// over the whole interval, so the guest window's reasons do not hold,
	// and the interval is the least time every step waits (on KVM, most of
	// a step besides the model).
	DefaultExecutorReadyInterval = desktop.DefaultReadyInterval
	DefaultReadyStable           = 2
	DefaultReadyMaxLoad          = 0.25
	// DefaultReadyMaxDamage is an 8×8 square: a blinking text caret (2×20)
	// is below it, a typed character above.
	DefaultReadyMaxDamage = 64
	DefaultAfterResetMax  = 30 * time.Second
	DefaultBeforeEvalMax  = 10 * time.Second
	// DefaultAfterLaunchMax is OSWorld's runner's sleep after a reset: the
	// wait for a launched program's window never costs more than it.
	DefaultAfterLaunchMax = setup.DefaultWindowWait
)

// DefaultRevertDomains are the OSWorld domains whose tasks always get a
// snapshot revert, before their attempt and before the attempt after them.
// Their tasks change state that lives in the memory of the desktop's
// long-running programs (GNOME settings through gsettings and dconf, the
// session's D-Bus services, network and time settings, installed
// packages): processes of the clean state that a fast reset keeps, so no
// file restore undoes them, and its checks cannot see them all.
func DefaultRevertDomains() []string { return []string{"os", "multi_apps"} }

// DefaultRestoreDirs are the guest directories a fast reset restores
// besides the home: where any program, the task's included, may write.
func DefaultRestoreDirs() []string { return []string{"/tmp", "/var/tmp", "/dev/shm"} }

// DefaultCheckDirs are the guest paths in which any change since the clean
// state makes a fast reset fall back to a revert: system configuration,
// software installed by hand, root's and the services' files, and dpkg's
// status file (any package installed or removed rewrites it; its
// directory holds tens of thousands of files on a desktop image). Only
// root changes them, so an attempt that did used sudo.
func DefaultCheckDirs() []string {
	return []string{"/etc", "/usr/local", "/opt", "/srv", "/root", "/boot", "/var/spool", "/var/mail", "/var/lib/dpkg/status"}
}

// DefaultSkipPaths are the guest paths the clean-state record does not scan
// for entries the guest user may change: pseudo filesystems, the session's
// runtime directory (its programs' sockets, changing all the time), and
// large system trees that only root writes (scanning them takes minutes
// under software emulation). A fast reset does not restore them; it checks
// them only where they lie in a Check directory (/usr/local).
func DefaultSkipPaths() []string {
	return []string{"/proc", "/sys", "/dev", "/run/user", "/usr", "/bin", "/sbin", "/lib", "/lib32",
		"/lib64", "/libx32", "/snap", "/var/lib/snapd", "/var/cache", "/var/log", "/var/lib/apt"}
}

// DefaultStateDir is where the guest keeps its clean-state record.
const DefaultStateDir = "/var/lib/legato/clean"

// FastResetConfig says what a fast reset restores and what it checks. It
// ends every process of the desktop's session and user and closes every
// window that was not there at the clean state, restores Home and Restore,
// and verifies the result; a VM desktop reverts its snapshot when anything
// is left (see Desktop.Reset). The desktop's session is what the clean
// state's record finds: processes whose environment names the guest
// server's X display, those in the Unix session or systemd login session of
// the guest server, the X server or the window manager, and what any of
// them started; never another login's, whoever owns it.
type FastResetConfig struct {
	// Restore lists the guest directories brought back to their clean
	// contents besides Home; nil means DefaultRestoreDirs().
	Restore []string
	// Check lists guest directories (or files) in which a change since the
	// clean state makes the desktop revert instead; nil means
	// DefaultCheckDirs().
	Check []string
	// Skip lists guest paths that are not scanned for what the guest user
	// may change (everything else is, once, when the clean state is
	// recorded); Check directories inside them are checked all the same.
	// nil means DefaultSkipPaths().
	Skip []string
	// Shared says the guest shares its machine with other programs (a
	// guest server on a developer's desktop, legato's host tests): a fast
	// reset then ends only the processes of the guest server's X display
	// (and what they started) and checks nothing outside Home and Restore.
	Shared bool
	// Dedicated says the guests given by URL (Config.Guests) run nothing
	// but the desktop, as a VM or a container of their own does. Without
	// it a fast reset refuses a guest that looks shared with other work
	// (processes of other users, more than one X server, root's processes
	// started outside the desktop's session). Either way it ends only the
	// processes of the desktop's session that are its user's or that its
	// user's started, never other users', the system's or another
	// session's. VMs this process boots are dedicated.
	Dedicated bool
	// RootDesktop says the guests given by URL run their desktop as root
	// (a container): a fast reset refuses a guest whose desktop user (the
	// owner of Home) is root otherwise, since the system's own processes
	// are then the desktop user's too and only the session tells them
	// apart.
	RootDesktop bool
	// StateDir is where the guest keeps the clean-state record and the
	// copies of Restore (default /var/lib/legato/clean).
	StateDir string
}

// DefaultGoldenMax is GoldenConfig.Max's default.
const DefaultGoldenMax = 4

// GoldenConfig says how VM desktops use golden task states: the first time
// a desktop runs a task, it sets the task up once from the clean state,
// waits until the screen settled and takes a snapshot of that state (RAM,
// devices, disk); every later attempt of the task on that desktop loads
// it in place instead of resetting and running the setup again, so all of
// them start from the same state. Tasks without setup steps, and tasks
// whose setup depends on the wall clock or the network, reset as without
// golden states.
type GoldenConfig struct {
	// Off resets and sets up every attempt as without golden states.
	Off bool
	// Max is the number of golden states a desktop keeps (each holds the
	// guest's memory in the VM's overlay); the least recently used one is
	// deleted when another is taken (default DefaultGoldenMax). With Fork
	// it also bounds the pool's fork templates.
	Max int
	// Refuse lists task IDs that never get a golden state: their setup
	// depends on the wall clock or the network in ways legato cannot see
	// in its steps.
	Refuse []string
	// Fork starts every later attempt of a task in a clone of its golden
	// state instead of loading the state in place: a QEMU process that
	// maps the state's guest RAM copy-on-write from a file and loads its
	// device state (see vm.Template), while the desktop's VM waits paused.
	// The pool's desktops on one host share one template per task. VMs on
	// this machine fork when legato runs as root; VMs on a remote host
	// through its host agent (vm.Config.HostAgent, package hostagent),
	// and a task's later attempts go to desktops on the host that holds
	// its template. The others, and a fork that fails, load in place. The VMs then run on shared-memory guest RAM
	// (vm.Config.Fork), and each desktop keeps its VM, paused, for other
	// tasks: a clone and the pool's templates (RAM on tmpfs) come on top.
	Fork bool
}

// Config says how to run OSWorld desktops: libvirt VMs started here (VM),
// or guests that already run elsewhere (Guests). The zero value of each
// field means its documented default; one of VM.BaseImage and Guests is
// required.
type Config struct {
	// VM runs one libvirt VM per desktop on VM.BaseImage. Its Ready and
	// BootTimeout fields are the desktop's own (BootTimeout below); leave
	// them zero.
	VM vm.Config
	// HostsFrom, when set, is where VM mode's hosts come from instead of
	// VM.Hosts (which must be empty): the records of a DNS name, resolved
	// again every HostsFrom.Every during the batch. A host that joins is
	// prepared in the background, then takes desktops; one that leaves
	// takes no new desktop, and its desktops ask to be replaced once their
	// attempt is over (Desktop.Retiring).
	HostsFrom *hostdns.Source
	// Guests are OSWorld guests that already run (under Docker, on another
	// host): desktop slot i uses Guests[i], so a batch has at most
	// len(Guests) desktops. They have no snapshot: every reset is a fast
	// reset, even for the domains in RevertDomains (a warning says so).
	Guests []GuestAddr

	// NoFastReset reverts the VM snapshot before every attempt, the
	// baseline OSWorld's own runner measures against (--no-fast-reset).
	// The zero value fast-resets every domain not in RevertDomains.
	NoFastReset bool
	// RevertDomains are the domains whose tasks always get a snapshot
	// revert, and so does the attempt after one of them; nil means
	// DefaultRevertDomains().
	RevertDomains []string
	// FastReset says what a fast reset restores and checks.
	FastReset FastResetConfig
	// Golden says how VM desktops keep each task's set-up state (see
	// GoldenConfig).
	Golden GoldenConfig
	// NoExecutor runs every action as a program of its own, `python -c
	// "import pyautogui; …"` through the guest's /execute, as OSWorld
	// does, and probes the guest for the ready signal (a baseline;
	// --no-executor). By default each reset starts an executor in the
	// guest that imports pyautogui once, runs the attempt's actions and
	// tells when the screen settled after one (see executor.go).
	NoExecutor bool
	// Home is the guest user's home directory, restored by a fast reset
	// (default /home/user).
	Home string
	// BaselineDir is where the guest keeps the clean copy of Home (default
	// /var/lib/legato/home-baseline). It is made before the VM's clean
	// snapshot, or when a guest given by URL is first attached if it has
	// none yet.
	BaselineDir string

	// Ready configures the ready signal after a reset, after actions and
	// before grading.
	Ready ReadyConfig
	// Grade says how tasks are graded.
	Grade GradeConfig

	// CacheDir keeps the task files setup steps download, the cloud files
	// graders fetch and the OSWorld checkout's compiled evaluators
	// (pycache), shared by every desktop and kept across runs (default:
	// DefaultCacheDir()).
	CacheDir string
	// EndStates is where desktops keep attempts' end states
	// (desktop.EndStateKeeper) and bring them back to grade them again:
	// a directory on disk per state, the guest's whole RAM in QEMU's
	// migration stream (zstd) and its disk's changes as a qcow2 layer. It
	// needs what Golden.Fork needs: root and VMs on this machine. Empty
	// means desktops keep none.
	EndStates string
	// ClientPassword is the guest user's password, for the {CLIENT_PASSWORD}
	// placeholder of setup steps and for sudo (default "password", as in
	// OSWorld's images). It never appears in logs or errors.
	ClientPassword string
	// GuestTimeouts bound each kind of call to a guest server; zero fields
	// take the guest package's defaults.
	GuestTimeouts guest.Timeouts
	// BootTimeout bounds the wait for a desktop's guest server to answer,
	// whichever way the desktop comes: after a VM's boot or revert, and
	// when a guest given by URL is attached, so a dead guest fails its
	// desktop in that time (default DefaultBootTimeout).
	BootTimeout time.Duration
	// PrepareTimeout bounds the preparation of a freshly booted VM before
	// its snapshot (default 3m).
	PrepareTimeout time.Duration

	// NoImageUpload makes a host that lacks the image files (VM.BaseImage,
	// Kernel, Initrd) an error instead of uploading them to it when the
	// pool starts (`legato rl hosts sync` uploads them ahead).
	NoImageUpload bool
	// HostWait bounds how long a new desktop waits for a host with a free
	// slot while every host is full or down (default 10m); then its
	// creation fails.
	HostWait time.Duration
	// HostRetryMax caps the backoff between tries of a host that stopped
	// answering (default 1m; the first try is after 1s, each failed one
	// doubles the wait).
	HostRetryMax time.Duration
	// Logger receives the desktops' lifecycle and warnings (default:
	// discard).
	Logger *slog.Logger
}

// GuestAddr locates an OSWorld guest that runs elsewhere: its guest server
// and, when the tasks need them, its Chrome DevTools and VLC ports on the
// same host.
type GuestAddr struct {
	// URL is the guest server's base URL, such as http://127.0.0.1:5000.
	URL string
	// DevToolsPort is the host port of the guest's Chrome DevTools (9222
	// inside the guest); 0 means none, and tasks with chrome_* setup steps
	// are refused.
	DevToolsPort int
	// VLCPort is the host port of VLC's HTTP interface (8080 inside the
	// guest); 0 means none.
	VLCPort int
}

// ParseGuestAddr parses the value of --guest-url:
// URL[,devtools=PORT][,vlc=PORT].
func ParseGuestAddr(s string) (GuestAddr, error) {
	parts := strings.Split(s, ",")
	a := GuestAddr{URL: strings.TrimSpace(parts[0])}
	for _, p := range parts[1:] {
		k, v, ok := strings.Cut(strings.TrimSpace(p), "=")
		port, err := strconv.Atoi(v)
		if !ok || err != nil || port <= 0 || port > 65535 {
			return GuestAddr{}, fmt.Errorf("guest %q: %q: want devtools=PORT or vlc=PORT", s, p)
		}
		switch k {
		case "devtools":
			a.DevToolsPort = port
		case "vlc":
			a.VLCPort = port
		default:
			return GuestAddr{}, fmt.Errorf("guest %q: unknown option %q: want devtools=PORT or vlc=PORT", s, k)
		}
	}
	if err := a.validate(); err != nil {
		return GuestAddr{}, err
	}
	return a, nil
}

// String returns the address in ParseGuestAddr's form.
func (a GuestAddr) String() string {
	s := a.URL
	if a.DevToolsPort != 0 {
		s += ",devtools=" + strconv.Itoa(a.DevToolsPort)
	}
	if a.VLCPort != 0 {
		s += ",vlc=" + strconv.Itoa(a.VLCPort)
	}
	return s
}

func (a GuestAddr) validate() error {
	u, err := url.Parse(a.URL)
	if err != nil {
		return fmt.Errorf("guest url %q: %w: want http://HOST:PORT, the guest server's root", a.URL, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Hostname() == "" || u.User != nil ||
		(u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" {
		return fmt.Errorf("guest url %q: want http://HOST:PORT, the guest server's root", a.URL)
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return fmt.Errorf("guest url %q: port %q: want 1-65535", a.URL, p)
		}
	}
	for _, p := range []struct {
		name string
		port int
	}{{"devtools", a.DevToolsPort}, {"vlc", a.VLCPort}} {
		if p.port < 0 || p.port > 65535 {
			return fmt.Errorf("guest %q: %s port %d: want 1-65535, or 0 for none", a.URL, p.name, p.port)
		}
	}
	return nil
}

// host returns the host of the guest URL, where its other ports are.
func (a GuestAddr) host() string {
	u, err := url.Parse(a.URL)
	if err != nil {
		return ""
	}
	return u.Hostname()
}

// serverPort returns the port of the guest URL.
func (a GuestAddr) serverPort() int {
	u, err := url.Parse(a.URL)
	if err != nil {
		return 0
	}
	if p := u.Port(); p != "" {
		n, _ := strconv.Atoi(p)
		return n
	}
	if u.Scheme == "https" {
		return 443
	}
	return 80
}

func (a GuestAddr) devToolsEndpoint() string {
	if a.DevToolsPort == 0 {
		return ""
	}
	return "http://" + net.JoinHostPort(a.host(), strconv.Itoa(a.DevToolsPort))
}

// ReadyConfig configures the ready signal: the desktop is ready when, over
// an Interval, the guest's CPUs were at most MaxLoad busy and at most
// MaxDamage pixels of its screen were redrawn (then one screenshot shows
// it), or, where the guest cannot watch its screen, when Stable
// consecutive screenshots with idle Intervals between them are identical;
// or when the wait's bound passed. (desktop.WithFixedWaits replaces it by fixed sleeps, for
// baselines.)
type ReadyConfig struct {
	// Interval is the time between two looks at the screen, during which
	// the guest's load is measured (default 500ms).
	Interval time.Duration
	// ExecutorInterval is the time the screen must stay quiet, and the
	// guest idle, where the action executor watches the screen inside the
	// guest (default 300ms, or Interval where only that is set).
	ExecutorInterval time.Duration
	// Stable is the number of identical screenshots in a row that mean the
	// screen settled (default 2).
	Stable int
	// MaxLoad is the busy share of the guest's CPUs (0 to 1, over all of
	// them) at or below which the guest counts as idle (default 0.25);
	// 1 turns the load check off.
	MaxLoad float64
	// MaxDamage is the screen area in pixels that may be redrawn during an
	// Interval of a settled screen, where the guest watches its screen
	// (default 64).
	MaxDamage int64
	// NoDamage compares Stable screenshots even where the guest could
	// watch its screen (a baseline; two screenshots per wait instead of
	// one).
	NoDamage bool
	// AfterResetMax bounds WaitAfterReset (default 30s; OSWorld slept 60s).
	AfterResetMax time.Duration
	// BeforeEvalMax bounds WaitBeforeEval (default 10s; OSWorld slept
	// 20s).
	BeforeEvalMax time.Duration
	// AfterLaunchMax bounds the wait after a setup step that starts a
	// program (launch, open, an execute that leaves one running in the
	// background) for the program's window to map, before the settle
	// after the setup and a golden state (default 60s, OSWorld's sleep
	// after a reset). A program that maps none by then is warned about,
	// and the setup goes on; see package setup.
	AfterLaunchMax time.Duration
}

// GradeConfig says how desktops grade tasks; see package grade.
type GradeConfig struct {
	// OSWorldDir is the root of an OSWorld checkout whose evaluators the
	// grader runs (and from which upload_file steps read relative paths).
	// Empty grades with the native getters and metrics only.
	OSWorldDir string
	// Python runs OSWorld's evaluators (default python3).
	Python string
	// Mode chooses between OSWorld's Python and the native code (default
	// grade.PreferBridge, which is native-only without OSWorldDir).
	Mode grade.Mode
	// Timeout bounds each metric with its getters (default
	// grade.DefaultTimeout).
	Timeout time.Duration
	// Workers is the number of Python processes running OSWorld's
	// evaluators for all the desktops (default grade.DefaultWorkers(), from
	// the CPUs).
	Workers int
}

// DefaultCacheDir is Config.CacheDir's default: legato/osworld in the
// user's cache directory. The checkout's compiled evaluators are kept in
// its pycache.
func DefaultCacheDir() string {
	if dir, err := os.UserCacheDir(); err == nil {
		return filepath.Join(dir, "legato", "osworld")
	}
	return filepath.Join(os.TempDir(), "legato-osworld-cache")
}

// vmMode reports whether the desktops are VMs started here.
func (c Config) vmMode() bool { return len(c.Guests) == 0 }

// Slots returns how many desktops the configuration can run at once: the
// number of guests given by URL, or the sum of the hosts' caps, or 0 for no
// limit (a host without a cap, or hosts from DNS, which come and go).
func (c Config) Slots() int {
	if !c.vmMode() {
		return len(c.Guests)
	}
	if c.HostsFrom != nil {
		return 0
	}
	n := 0
	for _, h := range c.VM.Hosts {
		if h.Desktops == 0 {
			return 0
		}
		n += h.Desktops
	}
	return n
}

// withDefaults returns c with its zero fields set to their defaults.
func (c Config) withDefaults() Config {
	if c.RevertDomains == nil {
		c.RevertDomains = DefaultRevertDomains()
	}
	if c.FastReset.Restore == nil {
		c.FastReset.Restore = DefaultRestoreDirs()
	}
	if c.FastReset.Check == nil {
		c.FastReset.Check = DefaultCheckDirs()
	}
	if c.FastReset.Skip == nil {
		c.FastReset.Skip = DefaultSkipPaths()
	}
	if c.FastReset.StateDir == "" {
		c.FastReset.StateDir = DefaultStateDir
	}
	if c.Home == "" {
		c.Home = DefaultHome
	}
	if c.BaselineDir == "" {
		c.BaselineDir = DefaultBaselineDir
	}
	if c.CacheDir == "" {
		c.CacheDir = DefaultCacheDir()
	}
	if c.ClientPassword == "" {
		c.ClientPassword = setup.DefaultClientPassword
	}
	if c.BootTimeout <= 0 {
		c.BootTimeout = DefaultBootTimeout
	}
	if c.PrepareTimeout <= 0 {
		c.PrepareTimeout = DefaultPrepareTimeout
	}
	if c.HostWait <= 0 {
		c.HostWait = DefaultHostWait
	}
	if c.HostRetryMax <= 0 {
		c.HostRetryMax = DefaultHostRetryMax
	}
	if c.vmMode() && len(c.VM.Hosts) == 0 && c.HostsFrom == nil {
		c.VM.Hosts = []vm.HostSpec{{URI: vm.DefaultURI}}
	}
	if c.VM.ForkDir == "" {
		c.VM.ForkDir = vm.DefaultForkDir
	}
	if c.VM.NamePrefix == "" {
		c.VM.NamePrefix = vm.DefaultNamePrefix
	}
	if c.Golden.Max <= 0 {
		c.Golden.Max = DefaultGoldenMax
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.VM.Logger == nil {
		c.VM.Logger = c.Logger
	}
	c.Ready = c.Ready.withDefaults()
	return c
}

func (r ReadyConfig) withDefaults() ReadyConfig {
	if r.ExecutorInterval <= 0 {
		r.ExecutorInterval = r.Interval
		if r.Interval <= 0 {
			r.ExecutorInterval = DefaultExecutorReadyInterval
		}
	}
	if r.Interval <= 0 {
		r.Interval = DefaultGuestReadyInterval
	}
	if r.Stable <= 1 {
		r.Stable = DefaultReadyStable
	}
	if r.MaxLoad <= 0 {
		r.MaxLoad = DefaultReadyMaxLoad
	}
	if r.MaxDamage <= 0 {
		r.MaxDamage = DefaultReadyMaxDamage
	}
	if r.AfterResetMax <= 0 {
		r.AfterResetMax = DefaultAfterResetMax
	}
	if r.BeforeEvalMax <= 0 {
		r.BeforeEvalMax = DefaultBeforeEvalMax
	}
	if r.AfterLaunchMax <= 0 {
		r.AfterLaunchMax = DefaultAfterLaunchMax
	}
	return r
}

// Validate reports what is wrong with the configuration, with zero fields
// taken as their defaults; each error names the field and what to do. In VM
// mode it also checks the VM's files (vm.Config.Validate).
func (c Config) Validate() error {
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	switch {
	case len(c.Guests) == 0 && c.VM.BaseImage == "":
		add("no desktops: give a VM base image (VM.BaseImage, --image) or guests that already run (Guests, --guest-url)")
	case len(c.Guests) > 0 && c.VM.BaseImage != "":
		add("both a VM base image (%s) and %d guest URLs: choose VMs started here or guests that already run", c.VM.BaseImage, len(c.Guests))
	case len(c.Guests) == 0:
		if c.VM.Ready != nil {
			add("VM.Ready: leave it nil; the desktop probes its guest itself")
		}
		if c.VM.BootTimeout != 0 {
			add("VM.BootTimeout %v: leave it zero and set BootTimeout, which bounds VMs and guests given by URL alike", c.VM.BootTimeout)
		}
		if err := c.VM.Validate(); err != nil {
			errs = append(errs, err)
		}
	}
	if c.HostsFrom != nil {
		switch {
		case len(c.Guests) > 0:
			add("HostsFrom (--hosts-from) names libvirt hosts, and Guests (--guest-url) guests that already run: choose one")
		case len(c.VM.Hosts) > 0:
			add("HostsFrom (--hosts-from) and VM.Hosts (--host): give the hosts one way")
		}
		if err := c.HostsFrom.Validate(); err != nil {
			add("HostsFrom (--hosts-from): %w", err)
		}
	}
	seen := map[string]bool{}
	for i, g := range c.Guests {
		if err := g.validate(); err != nil {
			add("Guests[%d]: %w", i, err)
			continue
		}
		key := strings.TrimSuffix(g.URL, "/")
		if seen[key] {
			add("Guests[%d]: %s given twice: each desktop needs a guest of its own", i, g.URL)
		}
		seen[key] = true
	}
	for _, p := range []struct{ name, v string }{{"Home", c.Home}, {"BaselineDir", c.BaselineDir}, {"FastReset.StateDir", c.FastReset.StateDir}} {
		if p.v != "" && !guestPath(p.v) {
			add("%s %q: want an absolute, clean guest path other than /", p.name, p.v)
		}
	}
	home, base, state := c.Home, c.BaselineDir, c.FastReset.StateDir
	if home == "" {
		home = DefaultHome
	}
	if base == "" {
		base = DefaultBaselineDir
	}
	if state == "" {
		state = DefaultStateDir
	}
	if within(base, home) || within(home, base) {
		add("BaselineDir %q and Home %q overlap: keep the baseline outside the home it restores", base, home)
	}
	for _, l := range []struct {
		name  string
		paths []string
	}{{"FastReset.Restore (--fast-reset-restore)", c.FastReset.Restore}, {"FastReset.Check (--fast-reset-check)", c.FastReset.Check}, {"FastReset.Skip", c.FastReset.Skip}} {
		for _, p := range l.paths {
			if !guestPath(p) {
				add("%s: %q: want an absolute, clean guest path other than /", l.name, p)
			}
		}
	}
	for _, p := range c.FastReset.Restore {
		for _, o := range []struct{ name, v string }{{"Home", home}, {"BaselineDir", base}, {"FastReset.StateDir", state}} {
			if within(p, o.v) || within(o.v, p) {
				add("FastReset.Restore (--fast-reset-restore): %q overlaps %s %q: restore directories apart from it", p, o.name, o.v)
			}
		}
	}
	errs = append(errs, c.Ready.validate()...)
	if c.Grade.OSWorldDir != "" {
		if st, err := os.Stat(c.Grade.OSWorldDir); err != nil || !st.IsDir() {
			add("Grade.OSWorldDir %q: not a directory: give the root of an OSWorld checkout", c.Grade.OSWorldDir)
		}
	}
	if c.Golden.Max < 0 {
		add("Golden.Max (--golden-max) %d: want the number of golden states a desktop keeps, 1 or more (0 means %d)", c.Golden.Max, DefaultGoldenMax)
	}
	if c.Golden.Fork && c.Golden.Off {
		add("Golden.Fork (--golden-fork) forks golden states, which Golden.Off (--no-golden) turns off: drop one of them")
	}
	if c.Golden.Fork && !c.vmMode() {
		add("Golden.Fork (--golden-fork) forks VMs this process starts; guests given by URL cannot fork: drop it or run VMs")
	}
	if c.EndStates != "" && !c.vmMode() {
		add("EndStates (--keep-end-states): guests given by URL cannot keep end states (a kept state is a VM's RAM and disk): drop it or run VMs")
	}
	for _, id := range c.Golden.Refuse {
		if strings.TrimSpace(id) == "" {
			add("Golden.Refuse: an empty task ID: name the tasks that never get a golden state")
		}
	}
	if c.Grade.Timeout < 0 {
		add("Grade.Timeout %v: want ≥ 0", c.Grade.Timeout)
	}
	if c.Grade.Workers < 0 {
		add("Grade.Workers %d: want 1 or more Python processes (0 means %d, from the CPUs)", c.Grade.Workers, grade.DefaultWorkers())
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"BootTimeout", c.BootTimeout}, {"PrepareTimeout", c.PrepareTimeout}, {"HostWait", c.HostWait}, {"HostRetryMax", c.HostRetryMax}} {
		if d.v < 0 {
			add("%s %v: want ≥ 0 (0 means the default)", d.name, d.v)
		}
	}
	return errors.Join(errs...)
}

func (r ReadyConfig) validate() []error {
	var errs []error
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"Ready.Interval", r.Interval}, {"Ready.ExecutorInterval", r.ExecutorInterval}, {"Ready.AfterResetMax", r.AfterResetMax},
		{"Ready.BeforeEvalMax", r.BeforeEvalMax}, {"Ready.AfterLaunchMax", r.AfterLaunchMax},
	} {
		if d.v < 0 {
			errs = append(errs, fmt.Errorf("%s %v: want ≥ 0 (0 means the default)", d.name, d.v))
		}
	}
	if r.Stable < 0 {
		errs = append(errs, fmt.Errorf("Ready.Stable %d: want ≥ 2 identical screenshots (0 means the default)", r.Stable))
	}
	if r.MaxDamage < 0 {
		errs = append(errs, fmt.Errorf("Ready.MaxDamage %d: want ≥ 0 pixels (0 means the default)", r.MaxDamage))
	}
	if r.MaxLoad < 0 || r.MaxLoad > 1 {
		errs = append(errs, fmt.Errorf("Ready.MaxLoad %g: want a share of the CPUs in (0, 1] (0 means the default)", r.MaxLoad))
	}
	return errs
}

// within reports whether guest path p is dir or inside it.
func within(p, dir string) bool {
	return p == dir || strings.HasPrefix(p, strings.TrimSuffix(dir, "/")+"/")
}

// toolCacheDir is the guest directory where the guest keeps the compiled
// guest tool: next to the clean-state record, /var/lib/legato/py by
// default.
func (c Config) toolCacheDir() string {
	return path.Join(path.Dir(c.FastReset.StateDir), "py")
}

// helperDir is the guest directory of the guest tool's helper, named after
// the tool's version; "" on a guest that shares its machine, where no
// helper is left running.
func (c Config) helperDir() string {
	if c.FastReset.Shared {
		return ""
	}
	return path.Join(path.Dir(c.FastReset.StateDir), "helper-"+strings.TrimPrefix(guestToolModule, "legato_guest_"))
}

// guestPath reports whether p is an absolute, clean guest path other than
// /.
func guestPath(p string) bool {
	return path.IsAbs(p) && path.Clean(p) == p && p != "/"
}

// revertDomain reports whether tasks of domain always need a revert.
func (c Config) revertDomain(domain string) bool {
	return slices.Contains(c.RevertDomains, domain)
}
