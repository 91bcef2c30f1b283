package vm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/digitalocean/go-libvirt"
	"golang.org/x/sys/unix"
)

// Leftover is a VM of a name prefix that exists on a host: a libvirt
// domain, volumes in the storage pool, or both.
type Leftover struct {
	// Host names the host (Host.Name).
	Host string
	// Name is the domain name (or the name the volumes were made for).
	Name string
	// Domain reports whether libvirt has a domain of that name.
	Domain bool
	// Running reports whether that domain is running.
	Running bool
	// Volumes are the VM's volumes that exist (its overlay).
	Volumes []string
}

// vmNames matches the names Start gives VMs of prefix: the prefix, the
// slot and 8 hex digits. Nothing else is ever swept, so image volumes, or
// another prefix that starts with this one, are safe.
func vmNames(prefix string) *regexp.Regexp {
	return regexp.MustCompile(`^` + regexp.QuoteMeta(prefix) + `[0-9]+-[0-9a-f]{8}$`)
}

// vmOfVolume returns the VM a volume belongs to.
func vmOfVolume(vol string, names *regexp.Regexp) (string, bool) {
	if name, ok := strings.CutSuffix(vol, ".qcow2"); ok && names.MatchString(name) {
		return name, true
	}
	return "", false
}

func checkPrefix(prefix string) error {
	if !namePrefixRE.MatchString(prefix) {
		return fmt.Errorf("name prefix %q: use letters, digits, '-', '_' or '.'", prefix)
	}
	return nil
}

// Leftovers returns every VM of the name prefix on the host: its domains,
// and the volumes named after a VM (an orphan overlay has no domain).
func (h *Host) Leftovers(ctx context.Context, prefix string) ([]Leftover, error) {
	if err := checkPrefix(prefix); err != nil {
		return nil, err
	}
	c := h.connect()
	defer c.close()
	return h.leftovers(ctx, c, prefix)
}

func (h *Host) leftovers(ctx context.Context, c *conn, prefix string) ([]Leftover, error) {
	names := vmNames(prefix)
	byName := map[string]*Leftover{}
	get := func(name string) *Leftover {
		if l, ok := byName[name]; ok {
			return l
		}
		l := &Leftover{Host: h.Name(), Name: name}
		byName[name] = l
		return l
	}
	var doms []libvirt.Domain
	err := c.do(ctx, "list domains", func(lv *libvirt.Libvirt) error {
		var err error
		doms, _, err = lv.ConnectListAllDomains(1, 0)
		return err
	})
	if err != nil {
		return nil, err
	}
	for _, d := range doms {
		if !names.MatchString(d.Name) {
			continue
		}
		l := get(d.Name)
		l.Domain = true
		err := c.do(ctx, "domain state", func(lv *libvirt.Libvirt) error {
			state, _, err := lv.DomainGetState(d, 0)
			l.Running = libvirt.DomainState(state) == libvirt.DomainRunning
			return err
		})
		if err != nil && !isNoDomain(err) {
			return nil, err
		}
	}
	s := h.storage(c)
	p, err := s.pool(ctx)
	switch {
	case errors.Is(err, ErrNoPool):
	case err != nil:
		return nil, err
	default:
		vols, err := s.names(ctx, p)
		if err != nil {
			return nil, err
		}
		for _, v := range vols {
			if name, ok := vmOfVolume(v, names); ok {
				l := get(name)
				l.Volumes = append(l.Volumes, v)
			}
		}
	}
	out := make([]Leftover, 0, len(byName))
	for _, l := range byName {
		slices.Sort(l.Volumes)
		out = append(out, *l)
	}
	slices.SortFunc(out, func(a, b Leftover) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// Sweep removes every VM of the name prefix from the host, except those
// keep names (nil keeps none): it destroys and undefines the domains (with
// their snapshot metadata) and deletes their volumes, orphans included. It
// returns the names of the VMs it removed. Run it when no other VM of this
// prefix is in use: at the start of a batch, it clears what a crashed run
// left behind; when a host that went down comes back, what the batch lost
// there.
func (h *Host) Sweep(ctx context.Context, prefix string, keep func(name string) bool) ([]string, error) {
	if err := checkPrefix(prefix); err != nil {
		return nil, err
	}
	c := h.connect()
	defer c.close()
	left, err := h.leftovers(ctx, c, prefix)
	if err != nil {
		return nil, err
	}
	s := h.storage(c)
	var removed []string
	var errs []error
	for _, l := range left {
		if keep != nil && keep(l.Name) {
			continue
		}
		ok := true
		if l.Domain {
			if err := removeDomain(ctx, c, l.Name); err != nil {
				errs = append(errs, &Error{Op: "sweep", VM: l.Name, Err: err})
				ok = false
			}
		}
		if len(l.Volumes) > 0 {
			if err := removeVolumes(ctx, s, l.Name); err != nil {
				errs = append(errs, &Error{Op: "sweep", VM: l.Name, Err: err})
				ok = false
			}
		}
		if ok {
			removed = append(removed, l.Name)
			h.log.Info("swept leftover vm", "vm", l.Name, "domain", l.Domain, "was_running", l.Running, "volumes", l.Volumes)
		}
	}
	return removed, errors.Join(errs...)
}

// List returns every VM of cfg's name prefix on each of cfg.Hosts. A host
// that cannot be reached is an error naming it; the others are still
// listed. It serves `legato rl gc`.
func List(ctx context.Context, cfg Config) ([]Leftover, error) {
	var out []Leftover
	err := eachHost(cfg, func(h *Host) error {
		left, err := h.Leftovers(ctx, cfg.withDefaults().NamePrefix)
		out = append(out, left...)
		return err
	})
	return out, err
}

// Sweep removes every VM of cfg's name prefix from each of cfg.Hosts (see
// Host.Sweep) and returns the names it removed.
func Sweep(ctx context.Context, cfg Config) ([]string, error) {
	var out []string
	err := eachHost(cfg, func(h *Host) error {
		removed, err := h.Sweep(ctx, cfg.withDefaults().NamePrefix, nil)
		out = append(out, removed...)
		return err
	})
	return out, err
}

// eachHost opens each of cfg's hosts in turn and runs fn on it; errors
// name their host.
func eachHost(cfg Config, fn func(h *Host) error) error {
	cfg = cfg.withDefaults()
	if err := checkPrefix(cfg.NamePrefix); err != nil {
		return err
	}
	if err := checkHostSpecs(cfg.Hosts); err != nil {
		return err
	}
	var errs []error
	for _, spec := range cfg.Hosts {
		h, err := OpenHost(spec, cfg, HostOptions{})
		if err == nil {
			err = fn(h)
			h.Close()
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("host %s: %w", spec.Label(), err))
		}
	}
	return errors.Join(errs...)
}

// ForkLeftover is a template directory a run that ended left behind.
type ForkLeftover struct {
	Dir string
	// Processes are the QEMU pids of its clones still running.
	Processes []int
}

// ForkLeftovers lists the template directories of prefix under dir
// (Config.ForkDir) that no running process holds.
func ForkLeftovers(dir, prefix string) ([]ForkLeftover, error) {
	if err := checkPrefix(prefix); err != nil {
		return nil, err
	}
	// A directory that is not ours is not read, let alone swept.
	if err := checkForkDir(dir); err != nil {
		return nil, err
	}
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []ForkLeftover
	for _, e := range ents {
		name, making := strings.CutPrefix(e.Name(), ".new-")
		if !e.IsDir() || !strings.HasPrefix(name, prefix+forkDirPrefix) {
			continue
		}
		d := filepath.Join(dir, e.Name())
		if making {
			// Being made: locked and renamed within moments. One left
			// for a minute is a run's that died in between.
			if info, err := e.Info(); err != nil || time.Since(info.ModTime()) < time.Minute {
				continue
			}
		}
		if held(d) {
			continue
		}
		out = append(out, ForkLeftover{Dir: d, Processes: cloneProcesses(e.Name())})
	}
	return out, nil
}

// held reports whether a live process holds the template directory's lock.
func held(dir string) bool {
	// Never blocks: a FIFO (or anything but a file) named lock is no lock.
	f, err := openNoFollow(filepath.Join(dir, "lock"), os.O_RDONLY, 0)
	if err != nil {
		return false
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		return true
	}
	unix.Flock(int(f.Fd()), unix.LOCK_UN)
	return false
}

// cloneProcesses finds the running clones of a template by their -name.
func cloneProcesses(template string) []int {
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range ents {
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil {
			continue
		}
		argv := strings.Split(strings.TrimSuffix(string(b), "\x00"), "\x00")
		if n := nameArg(argv); strings.HasPrefix(n, template+"-c") {
			var pid int
			fmt.Sscan(e.Name(), &pid)
			pids = append(pids, pid)
		}
	}
	slices.Sort(pids)
	return pids
}

// SweepForks kills the clones of templates of prefix under dir that no
// running process holds and removes their directories; it returns what
// it removed.
func SweepForks(dir, prefix string) ([]ForkLeftover, error) {
	left, err := ForkLeftovers(dir, prefix)
	if err != nil {
		return nil, err
	}
	var errs []error
	for _, l := range left {
		for _, pid := range l.Processes {
			if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
				errs = append(errs, fmt.Errorf("kill clone %d: %w", pid, err))
			}
		}
		if err := os.RemoveAll(l.Dir); err != nil {
			errs = append(errs, err)
		}
	}
	return left, errors.Join(errs...)
}
