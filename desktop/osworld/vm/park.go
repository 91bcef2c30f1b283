package vm

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/digitalocean/go-libvirt"
)

// hmpResult turns HMP's answer into an error: HMP says nothing when a
// command worked and reports failures as text.
func hmpResult(command, out string) error {
	if out = strings.TrimSpace(out); out != "" {
		return fmt.Errorf("qemu %s: %w", command, hmpText(out))
	}
	return nil
}

// hmpText is what HMP answered.
type hmpText string

func (t hmpText) Error() string { return string(t) }

// Park pauses the VM and frees its forwarded ports, so that a clone can
// take them (Clone.Forward) and the VM's callers reach the clone at the
// same addresses. Unpark undoes it. The ports stay reserved in this
// process meanwhile: no port picked for another VM or clone is one of
// them. On an error Park undoes what it did, so the VM runs as before.
func (v *VM) Park(ctx context.Context) error {
	return v.onDomain(ctx, "park", func(ctx context.Context, dom libvirt.Domain) error {
		reservePorts(v.ports, true)
		undo := func(err error) error {
			// Also after a stop cut off by ctx, which may have paused the
			// guest all the same; unpark runs on a VM in any state of Park.
			rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), v.cfg.CallTimeout)
			defer rcancel()
			if uerr := v.unpark(rctx, dom); uerr != nil {
				err = errors.Join(err, fmt.Errorf("undo: %w", uerr))
			}
			return v.fail("park", err)
		}
		if err := v.monitorQMP(ctx, dom, "stop", nil, nil); err != nil {
			return undo(err)
		}
		for _, f := range v.ports.forwards(v.cfg) {
			if err := v.removeForward(ctx, dom, f.Host); err != nil {
				return undo(err)
			}
		}
		return nil
	})
}

// removeForward removes the forward of a host port; one that is not there
// is fine.
func (v *VM) removeForward(ctx context.Context, dom libvirt.Domain, port int) error {
	err := v.hmp(ctx, dom, fmt.Sprintf("hostfwd_remove legatonet tcp:127.0.0.1:%d", port))
	var text hmpText
	if errors.As(err, &text) && (strings.HasSuffix(string(text), " removed") || strings.HasSuffix(string(text), " not found")) {
		// hostfwd_remove reports success in words, and a rule it does
		// not have as "not found".
		return nil
	}
	return err
}

// Unpark binds the VM's forwarded ports again and lets it run. The ports
// must be free: the clone that held them closed. It can be called again
// after it failed half way.
func (v *VM) Unpark(ctx context.Context) error {
	return v.onDomain(ctx, "unpark", func(ctx context.Context, dom libvirt.Domain) error {
		return v.fail("unpark", v.unpark(ctx, dom))
	})
}

func (v *VM) unpark(ctx context.Context, dom libvirt.Domain) error {
	for _, f := range v.ports.forwards(v.cfg) {
		// A rule an earlier, failed Unpark added goes first: QEMU would
		// refuse it twice.
		if err := v.removeForward(ctx, dom, f.Host); err != nil {
			return err
		}
		if err := v.hmp(ctx, dom, "hostfwd_add legatonet "+forwardRule(f.Host, f.Guest)); err != nil {
			return err
		}
	}
	if err := v.monitorQMP(ctx, dom, "cont", nil, nil); err != nil {
		return err
	}
	reservePorts(v.ports, false)
	return nil
}

// hmp runs an HMP command in the domain's QEMU through libvirt.
func (v *VM) hmp(ctx context.Context, dom libvirt.Domain, command string) error {
	var out string
	err := v.conn.do(ctx, "monitor", func(lv *libvirt.Libvirt) error {
		var err error
		out, err = lv.QEMUDomainMonitorCommand(dom, command, monitorHMP)
		return err
	})
	if err != nil {
		return err
	}
	return hmpResult(command, out)
}
