package hosttest

import (
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
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"
	"golang.org/x/sys/unix"
)

// A container host (Options.Image) is the legato host image of
// deploy/kubernetes run by podman in the host's network namespace, as a
// pod runs in its own: the image's entrypoint starts virtlogd, libvirtd
// and sshd, and stops them on SIGTERM. Its Dir/node is the node's
// /var/lib/legato (the storage pool, the sshd host key, host-cap) and
// Dir/keys the Secret's volume with the fleet's key. It is privileged, as
// the DaemonSet's pods are, so this machine's /dev/kvm reaches it when
// there is one.

// containerLabel marks the containers of a fleet (its Name): a clean-up
// removes only containers with the label and a name it gives.
const containerLabel = "legato.hosttest.fleet"

// containerName is the podman name of host's container.
func containerName(host string) string { return "legato-hosttest-" + host }

// makeContainerHost writes what the host's container mounts: the node's
// dir with the sshd host key in it (the entrypoint keeps a key it finds
// there, so known_hosts can hold it before the host starts) and the
// fleet's key as the Secret's authorized_keys. It returns the
// known_hosts line of the host key.
func (f *Fleet) makeContainerHost(h *Host) (string, error) {
	h.container = containerName(h.Name)
	for _, d := range []string{"node/ssh", "keys"} {
		if err := os.MkdirAll(filepath.Join(h.Dir, d), 0o755); err != nil {
			return "", err
		}
	}
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return "", err
	}
	block, err := ssh.MarshalPrivateKey(priv, h.Name)
	if err != nil {
		return "", err
	}
	pub, err := ssh.NewPublicKey(priv.Public())
	if err != nil {
		return "", err
	}
	key := filepath.Join(h.Dir, "node", "ssh", "ssh_host_ed25519_key")
	if err := os.WriteFile(key, pem.EncodeToMemory(block), 0o600); err != nil {
		return "", err
	}
	line := strings.TrimSpace(string(ssh.MarshalAuthorizedKey(pub))) + " legato-host@" + h.Name + "\n"
	if err := os.WriteFile(key+".pub", []byte(line), 0o644); err != nil {
		return "", err
	}
	auth, err := os.ReadFile(f.KeyFile + ".pub")
	if err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(h.Dir, "keys", "authorized_keys"), auth, 0o400); err != nil {
		return "", err
	}
	return knownhosts.Line([]string{h.Addr}, pub) + "\n", nil
}

// HostKey is the public key the host's sshd presents, in authorized_keys
// form (a container host's, as its entrypoint logs it).
func (h *Host) HostKey() (string, error) {
	b, err := os.ReadFile(filepath.Join(h.Dir, "node", "ssh", "ssh_host_ed25519_key.pub"))
	return strings.TrimSpace(string(b)), err
}

// runArgs is podman run's command line for the host's container.
func (h *Host) runArgs() []string {
	args := []string{"run", "--detach", "--name", h.container, "--label", containerLabel + "=" + h.fleet.opts.Name}
	args = append(args, podmanRuntimeArgs()...)
	args = append(args,
		"--network", "ns:/run/netns/"+h.Name,
		// hostname -i answers the host's address, as in a pod.
		"--hostname", h.Name, "--add-host", h.Name+":"+h.Addr,
		"--privileged",
		"--volume", filepath.Join(h.Dir, "node")+":/var/lib/legato",
		"--volume", filepath.Join(h.Dir, "keys")+":/etc/legato/ssh:ro",
		// The DaemonSet's fork-shm volume (a memory-backed emptyDir):
		// fork templates need more than a container's 64 MiB /dev/shm.
		"--mount", "type=tmpfs,destination=/dev/shm",
		"--env", "NODE_NAME="+h.Name)
	for _, e := range h.fleet.opts.ImageEnv {
		args = append(args, "--env", e)
	}
	return append(args, h.fleet.opts.Image)
}

// podmanRuntimeArgs are the flags a container needs to start on this
// machine, as deploy/kubernetes/build-local.sh's RUN_FLAGS (the same
// rule): runc, as crun refuses cgroups that are v1 and v2 at once
// ("hybrid"), and resource limits no higher than this process's hard ones,
// which a machine that withholds CAP_SYS_RESOURCE (a sandbox) cannot raise
// (podman's defaults are higher; its process count is capped at pid_max).
func podmanRuntimeArgs() []string {
	var nofile, nproc unix.Rlimit
	unix.Getrlimit(unix.RLIMIT_NOFILE, &nofile)
	unix.Getrlimit(unix.RLIMIT_NPROC, &nproc)
	pidMax := uint64(1 << 22) // the kernel's largest
	if b, err := os.ReadFile("/proc/sys/kernel/pid_max"); err == nil {
		if n, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64); err == nil {
			pidMax = n
		}
	}
	return runtimeArgs(nofile.Max, nproc.Max, pidMax)
}

// runtimeArgs is podmanRuntimeArgs' rule on given hard limits (an
// unlimited one is the largest value).
func runtimeArgs(nofile, nproc, pidMax uint64) []string {
	nofile = min(nofile, 1<<20) // podman's default
	nproc = min(nproc, pidMax)
	return []string{"--runtime", "runc",
		"--ulimit", fmt.Sprintf("nofile=%d:%d", nofile, nofile),
		"--ulimit", fmt.Sprintf("nproc=%d:%d", nproc, nproc)}
}

// startContainer starts the host's container (runs it the first time)
// and waits until its sshd answers: the entrypoint starts sshd last, once
// libvirtd answers and the storage pool is there.
func (h *Host) startContainer(ctx context.Context) error {
	args := h.runArgs()
	if exec.CommandContext(ctx, "podman", "container", "exists", h.container).Run() == nil {
		args = []string{"start", h.container}
	}
	if out, err := exec.CommandContext(ctx, "podman", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("hosttest: podman %s: %w: %s", strings.Join(args, " "), err, out)
	}
	t0 := time.Now()
	// The entrypoint waits up to 60 s for libvirtd.
	deadline := t0.Add(2 * time.Minute)
	for {
		c, err := net.DialTimeout("tcp", net.JoinHostPort(h.Addr, "22"), time.Second)
		if err == nil {
			c.Close()
			h.fleet.opts.Logf("hosttest: %s up at %s (container %s, %v)", h.Name, h.Addr, h.container, time.Since(t0).Round(time.Millisecond))
			return nil
		}
		state, _ := exec.CommandContext(ctx, "podman", "inspect", "--format", "{{.State.Status}}", h.container).Output()
		if s := strings.TrimSpace(string(state)); s != "running" || time.Now().After(deadline) {
			log, _ := h.Log(ctx)
			return fmt.Errorf("hosttest: %s (container %s, %s) did not come up: sshd: %v; its log:\n%s", h.Name, h.container, s, err, log)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// Log returns what a container host's entrypoint and daemons printed so
// far (podman logs; its start and, after Stop, its stop).
func (h *Host) Log(ctx context.Context) (string, error) {
	if h.container == "" {
		return "", fmt.Errorf("hosttest: %s is a namespace host: its daemons log to %s", h.Name, h.Dir)
	}
	out, err := exec.CommandContext(ctx, "podman", "logs", h.container).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("hosttest: podman logs %s: %w: %s", h.container, err, out)
	}
	return string(out), nil
}

// stopContainer stops the container as Kubernetes stops a pod: SIGTERM to
// its PID 1 (tini, which hands it to the entrypoint: it destroys the VMs,
// then stops its daemons), SIGKILL after the grace period.
func (h *Host) stopContainer(ctx context.Context) error {
	// The DaemonSet's terminationGracePeriodSeconds.
	out, err := exec.CommandContext(ctx, "podman", "stop", "--time", "120", h.container).CombinedOutput()
	if err != nil {
		return fmt.Errorf("hosttest: podman stop %s: %w: %s", h.container, err, out)
	}
	return nil
}

// removeContainer removes the host's container, running or not.
func (h *Host) removeContainer() error {
	out, err := exec.Command("podman", "rm", "--force", "--ignore", h.container).CombinedOutput()
	if err != nil {
		return fmt.Errorf("hosttest: podman rm %s: %w: %s", h.container, err, out)
	}
	return nil
}

// removeStaleContainers removes the containers an earlier fleet of the
// name left: those with its label and a name of its hosts.
func removeStaleContainers(opts Options) {
	if _, err := exec.LookPath("podman"); err != nil {
		return
	}
	out, _ := exec.Command("podman", "ps", "--all", "--filter", "label="+containerLabel+"="+opts.Name, "--format", "{{.Names}}").Output()
	for _, name := range strings.Fields(string(out)) {
		n, ok := strings.CutPrefix(name, containerName(opts.Name))
		if _, err := strconv.Atoi(n); !ok || err != nil {
			continue
		}
		if err := exec.Command("podman", "rm", "--force", "--time", "0", name).Run(); err == nil {
			opts.Logf("hosttest: removed the stale container %s", name)
		}
	}
}

// checkImage checks that podman and runc are here and hold the image.
func checkImage(image string) error {
	for _, prog := range []string{"podman", "runc"} {
		if _, err := exec.LookPath(prog); err != nil {
			return fmt.Errorf("hosttest: %s not found (apt-get install podman runc): %w", prog, err)
		}
	}
	if out, err := exec.Command("podman", "image", "exists", image).CombinedOutput(); err != nil {
		return errors.Join(fmt.Errorf("hosttest: image %s: podman holds none of that name: build it (deploy/kubernetes/build-local.sh)", image),
			fmt.Errorf("%w %s", err, out))
	}
	return nil
}
