package vm

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/digitalocean/go-libvirt"
)

// HostReport is how a host stands for `legato rl hosts`: whether it
// answers, what it has room for, whether it holds the image files, and the
// VMs of a name prefix on it.
type HostReport struct {
	Name string `json:"name"`
	URI  string `json:"uri"`
	// Desktops is the host's cap (HostSpec.Desktops; 0: none).
	Desktops int `json:"desktops"`
	// Up: libvirtd answered. Err says why not.
	Up  bool   `json:"up"`
	Err string `json:"error,omitempty"`
	// Libvirt is the daemon's version; CPUs and MemoryMiB the machine's.
	Libvirt   string `json:"libvirt,omitempty"`
	CPUs      int    `json:"cpus,omitempty"`
	MemoryMiB uint64 `json:"memory_mib,omitempty"`
	// Images says, per image file, whether the host holds it.
	Images []ImageState `json:"images,omitempty"`
	// VMs are the VMs of the prefix on the host now.
	VMs []Leftover `json:"vms,omitempty"`
}

// Ready reports whether the host can take desktops: it answers and holds
// every image file.
func (r HostReport) Ready() bool {
	if !r.Up {
		return false
	}
	for _, s := range r.Images {
		if !s.Matches {
			return false
		}
	}
	return true
}

// Inspect reports how the host stands. A host that does not answer is a
// report with Up false, not an error.
func (h *Host) Inspect(ctx context.Context, prefix string) HostReport {
	r := HostReport{Name: h.Name(), URI: h.spec.URI, Desktops: h.spec.Desktops}
	fail := func(err error) HostReport {
		r.Err = err.Error()
		return r
	}
	c := h.connect()
	defer c.close()
	var (
		version uint64
		memKiB  uint64
		cpus    int32
	)
	err := c.do(ctx, "node info", func(lv *libvirt.Libvirt) error {
		var err error
		if version, err = lv.ConnectGetLibVersion(); err != nil {
			return err
		}
		_, memKiB, cpus, _, _, _, _, _, err = lv.NodeGetInfo()
		return err
	})
	if err != nil {
		return fail(err)
	}
	r.Up = true
	r.Libvirt = fmt.Sprintf("%d.%d.%d", version/1000000, version/1000%1000, version%1000)
	r.CPUs, r.MemoryMiB = int(cpus), memKiB/1024
	if r.Images, err = h.CheckImages(ctx); err != nil {
		return fail(err)
	}
	if r.VMs, err = h.leftovers(ctx, c, prefix); err != nil {
		return fail(err)
	}
	return r
}

// WriteHostReports writes reports as a table.
func WriteHostReports(w io.Writer, reports []HostReport) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "HOST\tSTATE\tDESKTOPS\tCPUS\tMEMORY\tLIBVIRT\tIMAGE\tVMS")
	for _, r := range reports {
		cap := "no cap"
		if r.Desktops > 0 {
			cap = fmt.Sprint(r.Desktops)
		}
		if !r.Up {
			fmt.Fprintf(tw, "%s\tdown\t%s\t-\t-\t-\t-\t-\n", r.Name, cap)
			continue
		}
		var imgs []string
		for _, s := range r.Images {
			state := "ok"
			switch {
			case !s.Present:
				state = "missing"
			case !s.Matches:
				state = "differs"
			}
			imgs = append(imgs, s.File.Role+" "+state)
		}
		state := "ready"
		if !r.Ready() {
			state = "no image"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%.1f GiB\t%s\t%s\t%d\n", r.Name, state, cap, r.CPUs, float64(r.MemoryMiB)/1024, r.Libvirt, strings.Join(imgs, ", "), len(r.VMs))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, r := range reports {
		if !r.Up {
			if _, err := fmt.Fprintf(w, "%s: %s\n", r.Name, r.Err); err != nil {
				return err
			}
			continue
		}
		for _, s := range r.Images {
			if !s.Matches {
				if _, err := fmt.Fprintf(w, "%s: %s %s (%s): %s; `legato rl hosts sync` uploads it\n", r.Name, s.File.Role, s.File.Path, s.Volume, s.Why); err != nil {
					return err
				}
			}
		}
	}
	return nil
}
