package vm

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/xml"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/digitalocean/go-libvirt"
)

// Snapshots besides the clean one: a desktop takes them of states it wants
// to come back to (a task set up), keeps them in the VM's overlay, and
// loads them in place like the clean one. They go with the overlay and the
// domain's snapshot metadata when the VM is closed or swept.

// snapshotNameRE is what a snapshot name may be: no spaces (HMP's loadvm
// takes the rest of its line), nothing libvirt or XML would mangle.
var snapshotNameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$`)

func checkSnapshotName(name string) error {
	if !snapshotNameRE.MatchString(name) {
		return fmt.Errorf("snapshot name %q: use up to 64 letters, digits, '-', '_' or '.', starting with a letter or digit", name)
	}
	if name == SnapshotName {
		return fmt.Errorf("snapshot name %q: taken by the clean snapshot", name)
	}
	return nil
}

// snapshotXML renders the definition of an internal snapshot with memory.
func snapshotXML(name, description string) (string, error) {
	var b bytes.Buffer
	b.WriteString("<domainsnapshot><name>")
	if err := xml.EscapeText(&b, []byte(name)); err != nil {
		return "", err
	}
	b.WriteString("</name><description>")
	if err := xml.EscapeText(&b, []byte(description)); err != nil {
		return "", err
	}
	b.WriteString("</description></domainsnapshot>")
	return b.String(), nil
}

// snapshotDescription reads the description out of a snapshot's XML.
func snapshotDescription(x string) (string, error) {
	var s struct {
		Description string `xml:"description"`
	}
	if err := xml.Unmarshal([]byte(x), &s); err != nil {
		return "", fmt.Errorf("snapshot xml: %w", err)
	}
	return s.Description, nil
}

// ErrNoSnapshot means the VM has no snapshot of that name.
var ErrNoSnapshot = errors.New("no such snapshot")

// Snapshot takes an internal snapshot (disk and memory, in the overlay) of
// the running domain under name, with description, which Snapshots and
// SnapshotDescription give back. The guest is paused while QEMU writes its
// memory.
func (v *VM) Snapshot(ctx context.Context, name, description string) error {
	if err := checkSnapshotName(name); err != nil {
		return err
	}
	ctx, cancel, err := v.opCtx(ctx)
	if err != nil {
		return err
	}
	defer cancel()
	if err := v.savevmRefused(); err != nil {
		return v.fail("create snapshot "+name, err)
	}
	x, err := snapshotXML(name, description)
	if err != nil {
		return v.fail("create snapshot "+name, err)
	}
	dom, err := v.domain(ctx)
	if err != nil {
		return v.fail("create snapshot "+name, err)
	}
	err = v.conn.do(ctx, "create snapshot", func(lv *libvirt.Libvirt) error {
		_, err := lv.DomainSnapshotCreateXML(dom, x, uint32(libvirt.DomainSnapshotCreateAtomic))
		return err
	})
	return v.fail("create snapshot "+name, err)
}

// SnapshotDescription returns the description snapshot name was taken
// with; an error wrapping ErrNoSnapshot when there is none of that name.
func (v *VM) SnapshotDescription(ctx context.Context, name string) (string, error) {
	return withDomain(ctx, v, "read snapshot "+name, func(ctx context.Context, dom libvirt.Domain) (string, error) {
		var x string
		err := v.conn.do(ctx, "read snapshot", func(lv *libvirt.Libvirt) error {
			snap, err := lv.DomainSnapshotLookupByName(dom, name, 0)
			if err != nil {
				return err
			}
			x, err = lv.DomainSnapshotGetXMLDesc(snap, 0)
			return err
		})
		if isNoSnapshot(err) {
			return "", v.fail("read snapshot "+name, fmt.Errorf("%w: %s", ErrNoSnapshot, name))
		}
		if err != nil {
			return "", v.fail("read snapshot "+name, err)
		}
		d, err := snapshotDescription(x)
		return d, v.fail("read snapshot "+name, err)
	})
}

// Snapshots lists the names of the domain's snapshots, the clean one
// included.
func (v *VM) Snapshots(ctx context.Context) ([]string, error) {
	return withDomain(ctx, v, "list snapshots", func(ctx context.Context, dom libvirt.Domain) ([]string, error) {
		names, err := snapshotNames(ctx, v.conn, dom)
		return names, v.fail("list snapshots", err)
	})
}

func snapshotNames(ctx context.Context, c *conn, dom libvirt.Domain) ([]string, error) {
	var names []string
	err := c.do(ctx, "list snapshots", func(lv *libvirt.Libvirt) error {
		snaps, _, err := lv.DomainListAllSnapshots(dom, -1, 0)
		for _, s := range snaps {
			names = append(names, s.Name)
		}
		return err
	})
	return names, err
}

// DeleteSnapshot deletes snapshot name: its metadata and its data in the
// overlay. A snapshot that does not exist is fine.
func (v *VM) DeleteSnapshot(ctx context.Context, name string) error {
	if err := checkSnapshotName(name); err != nil {
		return err
	}
	return v.onDomain(ctx, "delete snapshot "+name, func(ctx context.Context, dom libvirt.Domain) error {
		err := v.conn.do(ctx, "delete snapshot", func(lv *libvirt.Libvirt) error {
			snap, err := lv.DomainSnapshotLookupByName(dom, name, 0)
			if err != nil {
				return err
			}
			return lv.DomainSnapshotDelete(snap, 0)
		})
		if isNoSnapshot(err) {
			return nil
		}
		return v.fail("delete snapshot "+name, err)
	})
}

// LoadSnapshot loads snapshot name into the running QEMU through its
// monitor (HMP loadvm), as RevertLoadvm does the clean one, then waits
// until the guest answers. It does not fall back to libvirt's revert: the
// caller decides what else to do. After it the guest clock reads the time
// the snapshot was taken.
func (v *VM) LoadSnapshot(ctx context.Context, name string) error {
	if err := checkSnapshotName(name); err != nil {
		return err
	}
	if err := v.savevmRefused(); err != nil {
		return v.fail("load snapshot "+name, err)
	}
	return v.reset(ctx, ResetLoadvm, "load snapshot "+name, func(ctx context.Context) error {
		dom, err := v.domain(ctx)
		if err != nil {
			return err
		}
		err = loadvm(ctx, v.conn, dom, name)
		if err != nil {
			// QEMU leaves the guest paused after a loadvm that failed, and
			// a later loadvm restarts it only if it ran before: resume
			// it, so that the caller's fallback can load another state,
			// also when the caller gave up (a paused guest is no state).
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
			defer cancel()
			rerr := v.conn.resume(rctx, dom)
			if rerr != nil && !isNotRunning(rerr) {
				err = errors.Join(err, rerr)
			}
		}
		return err
	})
}

// loadvm loads snapshot name into the domain's running QEMU.
func loadvm(ctx context.Context, c *conn, dom libvirt.Domain, name string) error {
	var out string
	err := c.do(ctx, "loadvm", func(lv *libvirt.Libvirt) error {
		var err error
		out, err = lv.QEMUDomainMonitorCommand(dom, "loadvm "+name, monitorHMP)
		return err
	})
	if err != nil {
		return err
	}
	// HMP answers a successful loadvm with nothing and reports errors as
	// text.
	if out = strings.TrimSpace(out); out != "" {
		return fmt.Errorf("qemu monitor: %s", out)
	}
	return nil
}

// Identity says what a snapshot of a VM depends on besides the guest's own
// state. QEMU loads a snapshot only into the machine that took it (same
// QEMU, devices, memory, CPUs, boot files) on the same disk underneath:
// a snapshot kept under another Identity must be taken again, never
// loaded.
type Identity struct {
	// QEMU is the version of the QEMU that runs the domain.
	QEMU string
	// Machine is a hash of the domain's definition without its name,
	// ports and overlay: accelerator, CPUs, memory, devices, kernel,
	// initrd and command line. The kernel and initrd are volumes named
	// after their content's hash, so another file is another machine.
	Machine string
	// Image is the base image's volume on the host, named after its
	// content's hash.
	Image string
}

// String gives the identity in one line.
func (i Identity) String() string {
	return "qemu=" + strconv.Quote(i.QEMU) + " machine=" + i.Machine + " image=" + strconv.Quote(i.Image)
}

// Identity returns the VM's Identity.
func (v *VM) Identity(ctx context.Context) (Identity, error) {
	return withDomain(ctx, v, "identity", func(ctx context.Context, dom libvirt.Domain) (Identity, error) {
		// The running QEMU's own word: libvirt's version of the hypervisor is
		// that of the binary on disk, which an upgrade may have replaced
		// since this QEMU started (libvirt's revert starts a new one).
		var ver string
		err := v.conn.do(ctx, "qemu version", func(lv *libvirt.Libvirt) error {
			var err error
			ver, err = lv.QEMUDomainMonitorCommand(dom, "info version", monitorHMP)
			return err
		})
		if err != nil {
			return Identity{}, v.fail("identity", err)
		}
		m, err := machineHash(v.spec())
		if err != nil {
			return Identity{}, v.fail("identity", err)
		}
		return Identity{
			QEMU:    strings.Join(strings.Fields(ver), " "),
			Machine: m,
			Image:   v.images[RoleBase],
		}, nil
	})
}

// machineHash hashes the domain definition with what differs between VMs
// of one configuration (name, ports, overlay) blanked.
func machineHash(s domainSpec) (string, error) {
	s.Name, s.Overlay = "", ""
	s.Forwards = slices.Clone(s.Forwards)
	for i := range s.Forwards {
		s.Forwards[i].Host = 0
	}
	x, err := domainXML(s)
	if err != nil {
		return "", err
	}
	h := sha256.Sum256([]byte(x))
	return hex.EncodeToString(h[:12]), nil
}
