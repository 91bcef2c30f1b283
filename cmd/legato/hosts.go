package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"legato/rl/desktop/osworld/hostdns"
	"legato/rl/desktop/osworld/vm"
)

// hostsCommand is `legato rl hosts [sync]`: it lists the libvirt hosts of a
// batch, with their capacity, whether they hold the image and whether they
// answer; `sync` uploads the image files to the hosts that lack them.
type hostsCommand struct {
	vm vm.Config
	// from is --hosts-from: the hosts are resolved once.
	from   *hostdns.Source
	image  string
	asJSON bool
	prune  bool
}

func (c *hostsCommand) flagSet(stderr io.Writer) *flag.FlagSet {
	fs := newFlagSet("legato rl hosts", stderr)
	registerVMPlace(fs, &c.vm, &c.from)
	fs.StringVar(&c.image, "image", "", "VM base image, as collect takes it: a qcow2 file, or a directory built by desktop/osworld/testdata/image/build.sh (with vmlinux, initrd.img)")
	fs.StringVar(&c.vm.Kernel, "kernel", "", "kernel booted directly (set by --image DIR)")
	fs.StringVar(&c.vm.Initrd, "initrd", "", "initrd for --kernel")
	fs.BoolVar(&c.asJSON, "json", false, "write the list as JSON")
	fs.BoolVar(&c.prune, "prune", false, "with sync: also delete the volumes of other images (an image rebuilt, an older one) that no domain and no overlay on the host uses")
	setUsage(fs, `Usage: legato rl hosts [sync] --image IMAGE [--host URI[,desktops=N]... | --hosts-from dns:NAME[,...]] [flags]

Lists the libvirt hosts a batch would spread its desktops over (with
--hosts-from, those its DNS name resolves to now): whether each answers,
its cap and size, whether it holds the image files (a volume of the
storage pool per file, named after its content and checked by hash), and the
VMs of the prefix on it. With sync, it first uploads the image files to every
host that lacks them or holds them differently, through libvirt's volume
upload (creating the storage pool where missing); --prune then deletes the
volumes of other images that nothing on a host uses. Exit status: 0 when every
host answers and holds the image, 1 otherwise, 2 for a bad command line.

`)
	return fs
}

// Run parses args, syncs if asked, and lists the hosts.
func (c *hostsCommand) Run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := c.flagSet(stderr)
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	doSync := false
	switch {
	case len(pos) == 1 && pos[0] == "sync":
		doSync = true
	case len(pos) > 0:
		return usageErrorf("unexpected arguments %q; the only one is sync", pos)
	}
	if c.prune && !doSync {
		return usageErrorf("--prune goes with sync: legato rl hosts sync --prune")
	}
	if c.image == "" {
		return usageErrorf("--image: give the image the VMs boot from, as collect takes it")
	}
	if err := checkVMPlace(c.vm, c.from); err != nil {
		return err
	}
	if err := imageFlag(c.image, &c.vm); err != nil {
		return usage(err)
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	if doSync {
		log = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	c.vm.Logger = log
	if err := c.vm.Validate(); err != nil {
		return usage(err)
	}
	files, err := vm.ImageFiles(ctx, c.vm)
	if err != nil {
		return err
	}
	cfg := c.vm
	if c.from != nil {
		if cfg.Hosts, err = hostdns.Lookup(ctx, *c.from); err != nil {
			return err
		}
	}
	if len(cfg.Hosts) == 0 {
		cfg.Hosts = []vm.HostSpec{{URI: vm.DefaultURI}}
	}
	reports := make([]vm.HostReport, len(cfg.Hosts))
	syncErrs := make([]error, len(cfg.Hosts))
	var wg sync.WaitGroup
	for i, spec := range cfg.Hosts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h, err := vm.OpenHost(spec, cfg, vm.HostOptions{Images: files})
			if err != nil {
				syncErrs[i] = err
				reports[i] = vm.HostReport{Name: spec.Label(), URI: spec.URI, Desktops: spec.Desktops, Err: err.Error()}
				return
			}
			defer h.Close()
			if doSync {
				syncErrs[i] = syncHost(ctx, h, log)
			}
			if c.prune && syncErrs[i] == nil {
				pruned, err := h.PruneImages(ctx)
				if len(pruned) > 0 {
					log.Info("deleted the volumes of other images", "host", h.Name(), "volumes", pruned)
				}
				syncErrs[i] = err
			}
			reports[i] = h.Inspect(ctx, cfg.NamePrefix)
		}()
	}
	wg.Wait()
	if c.asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		err = enc.Encode(reports)
	} else {
		err = vm.WriteHostReports(stdout, reports)
	}
	if err != nil {
		return err
	}
	var errs []error
	for i, r := range reports {
		switch {
		case syncErrs[i] != nil:
			errs = append(errs, fmt.Errorf("host %s: %w", r.Name, syncErrs[i]))
		case !r.Ready():
			errs = append(errs, fmt.Errorf("host %s is not ready", r.Name))
		}
	}
	return errors.Join(errs...)
}

// syncHost uploads the image files the host lacks, logging the progress
// every few seconds.
func syncHost(ctx context.Context, h *vm.Host, log *slog.Logger) error {
	var last time.Time
	_, err := h.SyncImages(ctx, func(f vm.ImageFile, sent int64) {
		if time.Since(last) < 5*time.Second && sent < f.Size {
			return
		}
		last = time.Now()
		log.Info("uploading", "host", h.Name(), "file", f.Role, "sent_mb", sent>>20, "of_mb", f.Size>>20)
	})
	return err
}
