package osworld

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"legato/rl/desktop/osworld/hostdns"
	"legato/rl/desktop/osworld/vm"
	"legato/rl/desktop/osworld/vm/hostagent"
)

// GC removes the VMs of cfg.VM's name prefix that a crashed run left
// behind on each of cfg.VM.Hosts (or the hosts cfg.HostsFrom resolves to
// now: domains, overlay and console log volumes), and writes one line per
// VM to w. It only needs cfg.VM's Hosts, NamePrefix and StoragePool, or
// HostsFrom. Run it when no run of that prefix is going on: it removes
// running VMs too.
func GC(ctx context.Context, cfg Config, w io.Writer) error {
	if len(cfg.Guests) > 0 {
		_, err := fmt.Fprintln(w, "guests given by URL: nothing to remove")
		return err
	}
	if cfg.HostsFrom != nil {
		hosts, err := hostdns.Lookup(ctx, *cfg.HostsFrom)
		if err != nil {
			return err
		}
		cfg.VM.Hosts = hosts
	}
	if err := gcForks(cfg.VM, w); err != nil {
		return err
	}
	if err := gcRemoteForks(ctx, cfg.VM, w); err != nil {
		return err
	}
	left, err := vm.List(ctx, cfg.VM)
	if err != nil && len(left) == 0 {
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
		what := "volumes only"
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
		if _, werr := fmt.Fprintf(w, "%s %s on %s (%s; %d volumes)\n", verb, l.Name, l.Host, what, len(l.Volumes)); werr != nil {
			return werr
		}
	}
	if err != nil {
		return fmt.Errorf("remove leftover VMs: %w", err)
	}
	return nil
}

// gcForks removes the fork templates (and kills the clones) of the prefix
// that no running process holds, on this machine.
func gcForks(cfg vm.Config, w io.Writer) error {
	dir, prefix := cfg.ForkDir, cfg.NamePrefix
	if dir == "" {
		dir = vm.DefaultForkDir
	}
	if prefix == "" {
		prefix = vm.DefaultNamePrefix
	}
	removed, err := vm.SweepForks(dir, prefix)
	for _, l := range removed {
		if _, werr := fmt.Fprintf(w, "removed fork template %s (%d clone processes killed)\n", l.Dir, len(l.Processes)); werr != nil {
			return werr
		}
	}
	if err != nil {
		return fmt.Errorf("remove leftover fork templates: %w", err)
	}
	return nil
}

// gcRemoteForks has the host agent of each remote host remove the fork
// templates (and kill the clones) a killed agent left there. A host
// without an agent has none of them: it says so and is skipped.
func gcRemoteForks(ctx context.Context, cfg vm.Config, w io.Writer) error {
	var errs []error
	for _, spec := range cfg.Hosts {
		h, err := vm.OpenHost(spec, cfg, vm.HostOptions{})
		if err != nil {
			return err
		}
		if h.Remote() {
			errs = append(errs, gcHostForks(ctx, h, cfg, w))
		}
		h.Close()
	}
	return errors.Join(errs...)
}

// gcHostForks sweeps one remote host's fork directory through its agent.
func gcHostForks(ctx context.Context, h *vm.Host, cfg vm.Config, w io.Writer) error {
	agent, _, err := hostagent.Dial(ctx, h, hostagent.Command(cfg.HostAgent, cfg.ForkDir, cfg.NamePrefix), cfg.Logger)
	if err != nil {
		_, werr := fmt.Fprintf(w, "no host agent on %s, fork templates there not swept (--golden-fork forks there only with one): %v\n", h.Name(), err)
		return werr
	}
	swept, err := agent.Sweep(ctx)
	err = errors.Join(err, agent.Close(agentCloseTimeout))
	for _, dir := range swept {
		if _, werr := fmt.Fprintf(w, "removed fork template %s on %s\n", dir, h.Name()); werr != nil {
			return werr
		}
	}
	if err != nil {
		return fmt.Errorf("remove leftover fork templates on %s: %w", h.Name(), err)
	}
	return nil
}

// GCEndStates removes from dir, a run's directory of kept end states, the
// ones a killed batch left half-written, and writes what it removed and
// what the whole ones take to w.
func GCEndStates(dir string, w io.Writer) error {
	removed, err := vm.SweepKept(dir)
	for _, r := range removed {
		if _, werr := fmt.Fprintf(w, "removed half-written end state %s\n", r); werr != nil {
			return werr
		}
	}
	if err != nil {
		return fmt.Errorf("remove half-written end states: %w", err)
	}
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		_, err = fmt.Fprintf(w, "%s: no kept end states\n", dir)
		return err
	}
	if err != nil {
		return err
	}
	n, bytes := 0, int64(0)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".") {
			continue
		}
		b, err := vm.DiskUsage(filepath.Join(dir, e.Name()))
		if err != nil {
			return err
		}
		n, bytes = n+1, bytes+b
	}
	_, err = fmt.Fprintf(w, "%s: %d kept end states, %d MiB on disk\n", dir, n, bytes>>20)
	return err
}
