// Package hosttest makes libvirt hosts on this machine for tests, so that
// a batch can spread over several hosts without other machines. Each host
// is a network namespace (reached from here through a veth pair, at an
// address of the 198.18.0.0/15 benchmarking range) and a mount namespace in
// which its own libvirtd and virtlogd run with their own run, state, cache,
// log and config directories, and its own sshd listens on that address
// only. A host is reached with qemu+ssh:// like a real one; its guests'
// forwarded ports are on its own 127.0.0.1, which nothing here can reach
// but through its sshd.
//
// It needs root, iproute2, util-linux (nsenter, unshare), openssh-server
// and the libvirt daemons (.ci/libvirt-up.sh installs them; .ci/run adds
// openssh-server).
//
// With Options.Image, each host is instead a podman container of legato's
// host image (deploy/kubernetes, built by its build-local.sh) in the
// host's network namespace, as a pod of the DaemonSet runs in its own: the
// image's entrypoint starts the daemons and stops them on SIGTERM. That
// needs iproute2, podman and runc, and the image.
package hosttest

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"
)

// Options configure a Fleet. Zero fields take the defaults.
type Options struct {
	// Hosts is the number of hosts (default 1, at most 60).
	Hosts int
	// Name starts every namespace, interface and directory name (default
	// "lgh"; at most 8 characters, as interface names are short). Two
	// fleets that exist at once need different names; Start removes what
	// an earlier fleet of the same name left behind.
	Name string
	// Net is the third byte of the hosts' addresses, 198.18.NET.x
	// (default 201).
	Net int
	// Dir holds the hosts' directories (default /var/tmp/legato-hosts).
	// QEMU reads its disks from there, so it must be open to other users.
	Dir string
	// TLS makes every libvirtd listen for TLS on its host's address too
	// (port 16514), with certificates of a CA the fleet makes; clients
	// use Fleet.PKIDir (Host.TLSURI).
	TLS bool
	// Image, when set, makes each host a container of this image (legato's
	// host image, deploy/kubernetes) instead of daemons from this machine's
	// filesystem; see container.go. Not with TLS.
	Image string
	// ImageEnv is the containers' environment besides NODE_NAME: the
	// entrypoint's variables (LEGATO_DESKTOP_CPUS=2, ...).
	ImageEnv []string
	// Logf receives progress lines (default: none).
	Logf func(format string, args ...any)
}

// Fleet is a set of hosts, and the SSH key and known_hosts file to reach
// them with.
type Fleet struct {
	Hosts []*Host
	// KeyFile logs in as root on every host; KnownHosts lists their keys.
	KeyFile, KnownHosts string
	// PKIDir holds the CA certificate and the client certificate and key
	// for the hosts' TLS listeners (Options.TLS), as libvirt's pkipath.
	PKIDir string
	pki    *pki

	opts Options
	dir  string
}

// Host is one namespace host.
type Host struct {
	// Name is the host's network namespace (ip netns), Addr its address.
	Name, Addr string
	// Dir holds its directories.
	Dir   string
	fleet *Fleet
	veth  string
	// holder keeps the mount namespace alive; the daemons run in its
	// namespaces. A container host has none.
	holder *exec.Cmd
	// container is a container host's podman name (Options.Image).
	container string
}

// Start makes a fleet. On error, everything made so far is removed again.
func Start(ctx context.Context, opts Options) (*Fleet, error) {
	if opts.Hosts <= 0 {
		opts.Hosts = 1
	}
	if opts.Name == "" {
		opts.Name = "lgh"
	}
	if opts.Net == 0 {
		opts.Net = 201
	}
	if opts.Dir == "" {
		opts.Dir = "/var/tmp/legato-hosts"
	}
	if opts.Logf == nil {
		opts.Logf = func(string, ...any) {}
	}
	switch {
	case opts.Hosts > 60:
		return nil, fmt.Errorf("hosttest: %d hosts: at most 60", opts.Hosts)
	case len(opts.Name) > 8:
		return nil, fmt.Errorf("hosttest: name %q: at most 8 characters", opts.Name)
	case opts.Net < 0 || opts.Net > 255:
		return nil, fmt.Errorf("hosttest: net %d: want 0-255", opts.Net)
	case opts.Image != "" && opts.TLS:
		return nil, errors.New("hosttest: TLS and Image: a container host listens for SSH only")
	}
	if os.Geteuid() != 0 {
		return nil, errors.New("hosttest: needs root (network namespaces, daemons)")
	}
	progs := []string{"ip", "nsenter", "unshare", "/usr/sbin/sshd", "libvirtd", "virtlogd", "virsh"}
	if opts.Image != "" {
		if err := checkImage(opts.Image); err != nil {
			return nil, err
		}
		progs = []string{"ip"}
	}
	for _, prog := range progs {
		if _, err := exec.LookPath(prog); err != nil {
			return nil, fmt.Errorf("hosttest: %s not found (apt-get install iproute2 util-linux openssh-server libvirt-daemon-system libvirt-clients): %w", prog, err)
		}
	}
	f := &Fleet{opts: opts, dir: filepath.Join(opts.Dir, opts.Name)}
	removeStale(opts, f.dir)
	if err := os.MkdirAll(f.dir, 0o755); err != nil {
		return nil, err
	}
	if err := os.Chmod(opts.Dir, 0o755); err != nil {
		return nil, err
	}
	if err := f.makeClientKey(); err != nil {
		f.Close()
		return nil, err
	}
	if opts.TLS {
		if err := f.makePKI(); err != nil {
			f.Close()
			return nil, err
		}
	}
	var known bytes.Buffer
	for i := 1; i <= opts.Hosts; i++ {
		h, line, err := f.makeHost(ctx, i)
		if h != nil {
			f.Hosts = append(f.Hosts, h)
		}
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("hosttest: host %d: %w", i, err)
		}
		known.WriteString(line)
	}
	if err := os.WriteFile(f.KnownHosts, known.Bytes(), 0o600); err != nil {
		f.Close()
		return nil, err
	}
	for _, h := range f.Hosts {
		if err := h.StartDaemons(ctx); err != nil {
			f.Close()
			return nil, err
		}
	}
	return f, nil
}

func (f *Fleet) makePKI() error {
	p, err := newPKI()
	if err != nil {
		return err
	}
	f.pki = p
	f.PKIDir = filepath.Join(f.dir, "pki")
	if err := p.writeCA(filepath.Join(f.PKIDir, "cacert.pem")); err != nil {
		return err
	}
	return p.issue(2, "legato-client", nil, filepath.Join(f.PKIDir, "clientcert.pem"), filepath.Join(f.PKIDir, "clientkey.pem"))
}

func (f *Fleet) makeClientKey() error {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return err
	}
	block, err := ssh.MarshalPrivateKey(priv, "legato hosttest")
	if err != nil {
		return err
	}
	f.KeyFile = filepath.Join(f.dir, "id_ed25519")
	f.KnownHosts = filepath.Join(f.dir, "known_hosts")
	if err := os.WriteFile(f.KeyFile, pem.EncodeToMemory(block), 0o600); err != nil {
		return err
	}
	pub, err := ssh.NewPublicKey(priv.Public())
	if err != nil {
		return err
	}
	return os.WriteFile(f.KeyFile+".pub", ssh.MarshalAuthorizedKey(pub), 0o644)
}

// makeHost makes host i's namespaces, addresses, directories and sshd
// configuration, and returns its known_hosts line.
func (f *Fleet) makeHost(ctx context.Context, i int) (*Host, string, error) {
	name := f.opts.Name + strconv.Itoa(i)
	base := 4 * i
	h := &Host{
		Name:  name,
		Addr:  fmt.Sprintf("198.18.%d.%d", f.opts.Net, base+2),
		Dir:   filepath.Join(f.dir, name),
		fleet: f,
		veth:  name + "a",
	}
	for _, d := range []string{"run", "lib", "cache", "log", "etc", "ssh"} {
		if err := os.MkdirAll(filepath.Join(h.Dir, d), 0o755); err != nil {
			return nil, "", err
		}
	}
	if err := os.Chmod(h.Dir, 0o755); err != nil {
		return nil, "", err
	}
	// The daemons' own configuration, without the system daemon's
	// domains, networks (its NAT network must never start) or pools.
	confs, _ := filepath.Glob("/etc/libvirt/*.conf")
	for _, c := range confs {
		b, err := os.ReadFile(c)
		if err != nil {
			return nil, "", err
		}
		if err := os.WriteFile(filepath.Join(h.Dir, "etc", filepath.Base(c)), b, 0o644); err != nil {
			return nil, "", err
		}
	}
	cmds := [][]string{
		{"ip", "netns", "add", name},
		{"ip", "link", "add", h.veth, "type", "veth", "peer", "name", name + "b"},
		{"ip", "link", "set", name + "b", "netns", name},
		{"ip", "addr", "add", fmt.Sprintf("198.18.%d.%d/30", f.opts.Net, base+1), "dev", h.veth},
		{"ip", "link", "set", h.veth, "up"},
		{"ip", "-n", name, "addr", "add", h.Addr + "/30", "dev", name + "b"},
		{"ip", "-n", name, "link", "set", name + "b", "up"},
		{"ip", "-n", name, "link", "set", "lo", "up"},
	}
	for _, c := range cmds {
		if out, err := exec.CommandContext(ctx, c[0], c[1:]...).CombinedOutput(); err != nil {
			return h, "", fmt.Errorf("%s: %w: %s", strings.Join(c, " "), err, out)
		}
	}
	if f.opts.Image != "" {
		line, err := f.makeContainerHost(h)
		return h, line, err
	}
	line, err := f.sshdConfig(h)
	if err != nil {
		return h, "", err
	}
	if f.pki != nil {
		if err := f.tlsConfig(h, i); err != nil {
			return h, "", err
		}
	}
	// The holder enters the network namespace and makes the mount
	// namespace, in which the libvirt directories are the host's own.
	binds := ""
	for _, b := range [][2]string{{"run", "/run/libvirt"}, {"lib", "/var/lib/libvirt"}, {"cache", "/var/cache/libvirt"},
		{"log", "/var/log/libvirt"}, {"etc", "/etc/libvirt"}} {
		binds += fmt.Sprintf("mkdir -p %s && mount --bind %s %s && ", b[1], filepath.Join(h.Dir, b[0]), b[1])
	}
	h.holder = exec.Command("nsenter", "--net=/run/netns/"+name, "unshare", "--mount", "--propagation", "private",
		"sh", "-c", binds+"echo ready && exec sleep infinity")
	// The holder dies with this process; the daemons are left to the next
	// Start's clean-up.
	h.holder.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := h.holder.StdoutPipe()
	if err != nil {
		return h, "", err
	}
	if err := h.holder.Start(); err != nil {
		return h, "", err
	}
	buf := make([]byte, 6)
	if _, err := out.Read(buf); err != nil || string(buf) != "ready\n" {
		return h, "", fmt.Errorf("the namespace holder did not come up: %q %v", buf, err)
	}
	return h, line, nil
}

// sshdConfig writes the host's sshd configuration and host key, and
// returns the known_hosts line of the key.
func (f *Fleet) sshdConfig(h *Host) (string, error) {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return "", err
	}
	block, err := ssh.MarshalPrivateKey(priv, h.Name)
	if err != nil {
		return "", err
	}
	key := filepath.Join(h.Dir, "ssh", "host_ed25519_key")
	if err := os.WriteFile(key, pem.EncodeToMemory(block), 0o600); err != nil {
		return "", err
	}
	auth, err := os.ReadFile(f.KeyFile + ".pub")
	if err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(h.Dir, "ssh", "authorized_keys"), auth, 0o600); err != nil {
		return "", err
	}
	conf := fmt.Sprintf(`ListenAddress %s
HostKey %s
PidFile %s
AuthorizedKeysFile %s
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
AllowTcpForwarding yes
AllowStreamLocalForwarding yes
ClientAliveInterval 10
`, h.Addr, key, filepath.Join(h.Dir, "ssh", "sshd.pid"), filepath.Join(h.Dir, "ssh", "authorized_keys"))
	if err := os.WriteFile(filepath.Join(h.Dir, "ssh", "sshd_config"), []byte(conf), 0o644); err != nil {
		return "", err
	}
	pub, err := ssh.NewPublicKey(priv.Public())
	if err != nil {
		return "", err
	}
	return knownhosts.Line([]string{h.Addr}, pub) + "\n", nil
}

// tlsConfig gives the host's libvirtd a TLS listener on its address, with
// a server certificate for it.
func (f *Fleet) tlsConfig(h *Host, i int) error {
	dir := filepath.Join(h.Dir, "pki")
	cert, key, ca := filepath.Join(dir, "servercert.pem"), filepath.Join(dir, "serverkey.pem"), filepath.Join(dir, "cacert.pem")
	if err := f.pki.issue(int64(100+i), h.Name, net.ParseIP(h.Addr), cert, key); err != nil {
		return err
	}
	if err := f.pki.writeCA(ca); err != nil {
		return err
	}
	conf := filepath.Join(h.Dir, "etc", "libvirtd.conf")
	b, err := os.ReadFile(conf)
	if err != nil {
		return err
	}
	b = fmt.Appendf(b, "\n# hosttest: TLS on the host's address\nlisten_tls = 1\nlisten_tcp = 0\nlisten_addr = %q\nkey_file = %q\ncert_file = %q\nca_file = %q\nauth_tls = \"none\"\n",
		h.Addr, key, cert, ca)
	return os.WriteFile(conf, b, 0o644)
}

// TLSURI is the host's libvirt URI over TLS (Options.TLS), with the
// fleet's client certificate; the guests' ports are reached over SSH,
// which needs the fleet's key and known_hosts in vm.SSHConfig.
func (h *Host) TLSURI() string {
	return "qemu+tls://" + h.Addr + "/system?pkipath=" + h.fleet.PKIDir
}

// URI is the host's libvirt URI, with the fleet's key and known_hosts.
func (h *Host) URI() string {
	return "qemu+ssh://root@" + h.Addr + "/system?keyfile=" + h.fleet.KeyFile + "&known_hosts=" + h.fleet.KnownHosts
}

// Exec runs a program in the host's namespaces (e.g. virsh -c
// qemu:///system list) and returns its output.
func (h *Host) Exec(ctx context.Context, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, "podman", append([]string{"exec", h.container}, args...)...)
	if h.container == "" {
		argv := append([]string{"-t", strconv.Itoa(h.holder.Process.Pid), "-m", "-n", "--"}, args...)
		cmd = exec.CommandContext(ctx, "nsenter", argv...)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("%s on %s: %w: %s", strings.Join(args, " "), h.Name, err, out)
	}
	return out, nil
}

// StartDaemons starts the host's virtlogd, libvirtd and sshd, and waits
// until libvirtd answers and sshd accepts connections. A container host's
// container starts (again), and its entrypoint starts them.
func (h *Host) StartDaemons(ctx context.Context) error {
	if h.container != "" {
		return h.startContainer(ctx)
	}
	if err := os.MkdirAll("/run/sshd", 0o755); err != nil { // sshd's privilege separation
		return err
	}
	for _, c := range [][]string{
		{"virtlogd", "-d", "-p", "/run/libvirt/virtlogd.pid"},
		h.libvirtdArgs(),
		{"/usr/sbin/sshd", "-f", filepath.Join(h.Dir, "ssh", "sshd_config"), "-E", filepath.Join(h.Dir, "ssh", "sshd.log")},
	} {
		if _, err := h.Exec(ctx, c...); err != nil {
			return err
		}
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		_, verr := h.Exec(ctx, "virsh", "-q", "-c", "qemu:///system", "version")
		c, serr := net.DialTimeout("tcp", net.JoinHostPort(h.Addr, "22"), time.Second)
		if c != nil {
			c.Close()
		}
		if serr == nil && h.fleet.pki != nil {
			// libvirtd's TLS listener
			c, serr = net.DialTimeout("tcp", net.JoinHostPort(h.Addr, "16514"), time.Second)
			if c != nil {
				c.Close()
			}
		}
		if verr == nil && serr == nil {
			h.fleet.opts.Logf("hosttest: %s up at %s", h.Name, h.Addr)
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("hosttest: %s did not come up: libvirtd: %v; its listeners: %v", h.Name, verr, serr)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func (h *Host) libvirtdArgs() []string {
	args := []string{"libvirtd", "-d", "-p", "/run/libvirt/libvirtd.pid"}
	if h.fleet.pki != nil {
		args = append(args, "--listen")
	}
	return args
}

// Processes returns the processes running in the host's network
// namespace, other than the namespace holder: its daemons, their sessions
// and its QEMUs.
func (h *Host) Processes() ([]int, error) {
	pids, err := nsProcesses("/run/netns/" + h.Name)
	if err != nil {
		return nil, err
	}
	out := pids[:0]
	for _, p := range pids {
		if h.holder == nil || h.holder.Process == nil || p != h.holder.Process.Pid {
			out = append(out, p)
		}
	}
	return out, nil
}

// Kill kills every process of the host at once (its daemons, their
// sessions, its QEMUs), as a host that crashes: connections to it are
// reset. StartDaemons brings it back, with the state its libvirtd kept.
func (h *Host) Kill() error {
	for range 20 {
		pids, err := h.Processes()
		if err != nil {
			return err
		}
		if len(pids) == 0 {
			return nil
		}
		for _, p := range pids {
			syscall.Kill(p, syscall.SIGKILL)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("hosttest: %s: processes survive SIGKILL", h.Name)
}

// Stop stops the host politely, as a drained node: a container host's
// entrypoint gets SIGTERM (it destroys the VMs, then stops its daemons),
// a namespace host's daemons get SIGTERM. StartDaemons starts it again.
func (h *Host) Stop(ctx context.Context) error {
	if h.container != "" {
		return h.stopContainer(ctx)
	}
	h.stopDaemons()
	return nil
}

// stopDaemons stops the daemons politely (libvirtd first), then kills
// whatever is left.
func (h *Host) stopDaemons() {
	if h.container != "" {
		// None when the fleet failed before it ran.
		if exec.Command("podman", "container", "exists", h.container).Run() == nil {
			if err := h.stopContainer(context.Background()); err != nil {
				h.fleet.opts.Logf("%v", err)
			}
		}
		h.Kill()
		return
	}
	for _, pidfile := range []string{filepath.Join(h.Dir, "ssh", "sshd.pid"), filepath.Join(h.Dir, "run", "libvirtd.pid"), filepath.Join(h.Dir, "run", "virtlogd.pid")} {
		b, err := os.ReadFile(pidfile)
		if err != nil {
			continue
		}
		if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && inNetns(pid, "/run/netns/"+h.Name) {
			syscall.Kill(pid, syscall.SIGTERM)
			for range 50 {
				if syscall.Kill(pid, 0) != nil {
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
		}
	}
	h.Kill()
}

// Close stops every host, removes the namespaces, interfaces and
// directories, and reports anything it could not remove.
func (f *Fleet) Close() error {
	var errs []error
	for _, h := range f.Hosts {
		if err := h.close(); err != nil {
			errs = append(errs, err)
		}
	}
	if err := os.RemoveAll(f.dir); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func (h *Host) close() error {
	h.stopDaemons()
	if h.holder != nil && h.holder.Process != nil {
		h.holder.Process.Kill()
		h.holder.Wait()
	}
	var errs []error
	if h.container != "" {
		if err := h.removeContainer(); err != nil {
			errs = append(errs, err)
		}
	}
	if pids, _ := nsProcesses("/run/netns/" + h.Name); len(pids) > 0 {
		errs = append(errs, fmt.Errorf("hosttest: %s: processes %v still run", h.Name, pids))
	}
	if out, err := exec.Command("ip", "netns", "del", h.Name).CombinedOutput(); err != nil {
		errs = append(errs, fmt.Errorf("ip netns del %s: %w: %s", h.Name, err, out))
	}
	// Deleting the namespace deletes the veth pair; a pair whose namespace
	// is gone already goes too.
	exec.Command("ip", "link", "del", h.veth).Run()
	return errors.Join(errs...)
}

// removeStale removes what an earlier fleet of the same name left (a test
// binary that was killed): processes in its namespaces, the namespaces,
// the interfaces and the directories.
func removeStale(opts Options, dir string) {
	removeStaleContainers(opts)
	out, _ := exec.Command("ip", "netns", "list").Output()
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || !strings.HasPrefix(f[0], opts.Name) {
			continue
		}
		if _, err := strconv.Atoi(strings.TrimPrefix(f[0], opts.Name)); err != nil {
			continue
		}
		pids, _ := nsProcesses("/run/netns/" + f[0])
		for _, p := range pids {
			syscall.Kill(p, syscall.SIGKILL)
		}
		time.Sleep(200 * time.Millisecond)
		exec.Command("ip", "netns", "del", f[0]).Run()
		exec.Command("ip", "link", "del", f[0]+"a").Run()
		opts.Logf("hosttest: removed the stale host %s", f[0])
	}
	os.RemoveAll(dir)
}

// nsProcesses returns the processes whose network namespace is the one
// bound at path.
func nsProcesses(path string) ([]int, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		return nil, err
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		var ps syscall.Stat_t
		if syscall.Stat("/proc/"+e.Name()+"/ns/net", &ps) == nil && ps.Ino == st.Ino && ps.Dev == st.Dev {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

func inNetns(pid int, path string) bool {
	pids, _ := nsProcesses(path)
	for _, p := range pids {
		if p == pid {
			return true
		}
	}
	return false
}
