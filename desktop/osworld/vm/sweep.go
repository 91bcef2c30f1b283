package vm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/digitalocean/go-libvirt"
)

// Leftover is a VM of this configuration's name prefix that exists on the
// host: a libvirt domain, files in the overlay directory, or both.
type Leftover struct {
	// Name is the domain name (or the name the files were made for).
	Name string
	// Domain reports whether libvirt has a domain of that name.
	Domain bool
	// Running reports whether that domain is running.
	Running bool
	// Files are the VM's overlay and console log, if they exist.
	Files []string
}

// List returns every VM with cfg's name prefix: its domains, and files in
// cfg.OverlayDir named after a VM (an orphan overlay has no domain). It
// serves `legato rl gc`.
func List(ctx context.Context, cfg Config) ([]Leftover, error) {
	cfg = cfg.withDefaults()
	if !namePrefixRE.MatchString(cfg.NamePrefix) {
		return nil, fmt.Errorf("name prefix %q: use letters, digits, '-', '_' or '.'", cfg.NamePrefix)
	}
	c, err := newConn(cfg.URI, cfg.CallTimeout)
	if err != nil {
		return nil, err
	}
	defer c.close()
	return list(ctx, c, cfg)
}

func list(ctx context.Context, c *conn, cfg Config) ([]Leftover, error) {
	byName := map[string]*Leftover{}
	get := func(name string) *Leftover {
		if l, ok := byName[name]; ok {
			return l
		}
		l := &Leftover{Name: name}
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
		if !strings.HasPrefix(d.Name, cfg.NamePrefix) {
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
	entries, err := os.ReadDir(cfg.OverlayDir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("list overlay dir: %w", err)
	}
	for _, e := range entries {
		name, ok := vmFileName(e.Name(), cfg.NamePrefix)
		if !ok {
			continue
		}
		l := get(name)
		l.Files = append(l.Files, filepath.Join(cfg.OverlayDir, e.Name()))
	}
	out := make([]Leftover, 0, len(byName))
	for _, l := range byName {
		slices.Sort(l.Files)
		out = append(out, *l)
	}
	slices.SortFunc(out, func(a, b Leftover) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// vmFileName returns the VM a file in the overlay directory belongs to.
func vmFileName(file, prefix string) (string, bool) {
	if !strings.HasPrefix(file, prefix) {
		return "", false
	}
	for _, ext := range []string{".qcow2", ".console.log"} {
		if name, ok := strings.CutSuffix(file, ext); ok && len(name) > len(prefix) {
			return name, true
		}
	}
	return "", false
}

// Sweep removes every VM with cfg's name prefix: it destroys and undefines
// the domains (with their snapshot metadata) and deletes their overlays and
// console logs, orphan files included. It returns the names of the VMs it
// removed. Run it when no VM of this prefix is in use: at the start of a
// collect run, it clears what a crashed run left behind.
func Sweep(ctx context.Context, cfg Config) ([]string, error) {
	cfg = cfg.withDefaults()
	if !namePrefixRE.MatchString(cfg.NamePrefix) {
		return nil, fmt.Errorf("name prefix %q: use letters, digits, '-', '_' or '.'", cfg.NamePrefix)
	}
	c, err := newConn(cfg.URI, cfg.CallTimeout)
	if err != nil {
		return nil, err
	}
	defer c.close()
	left, err := list(ctx, c, cfg)
	if err != nil {
		return nil, err
	}
	var removed []string
	var errs []error
	for _, l := range left {
		ok := true
		if l.Domain {
			if err := removeDomain(ctx, c, l.Name); err != nil {
				errs = append(errs, &Error{Op: "sweep", VM: l.Name, Err: err})
				ok = false
			}
		}
		for _, f := range l.Files {
			if err := os.Remove(f); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, &Error{Op: "sweep", VM: l.Name, Err: err})
				ok = false
			}
		}
		if ok {
			removed = append(removed, l.Name)
			cfg.Logger.Info("swept leftover vm", "vm", l.Name, "domain", l.Domain, "was_running", l.Running, "files", l.Files)
		}
	}
	return removed, errors.Join(errs...)
}
