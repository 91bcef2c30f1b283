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
