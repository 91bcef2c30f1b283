package osworld

import (
	"context"
	"fmt"
	"io"

	"legato/rl/desktop/osworld/vm"
)

// GC removes the VMs of cfg.VM's name prefix that a crashed run left
// behind on each of cfg.VM.Hosts (domains, overlay and console log
// volumes), and writes one line per VM to w. It only needs cfg.VM's Hosts,
// NamePrefix and StoragePool. Run it when no
// run of that prefix is going on: it removes running VMs too.
func GC(ctx context.Context, cfg Config, w io.Writer) error {
	if len(cfg.Guests) > 0 {
		_, err := fmt.Fprintln(w, "guests given by URL: nothing to remove")
		return err
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
