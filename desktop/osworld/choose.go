package osworld

import (
	"fmt"
	"time"
)

// Reset kinds, as ResetReport.Kind and the attempt report name them.
const (
	// ResetNone: the desktop had just been made from its clean snapshot,
	// so there was nothing to undo.
	ResetNone = "none"
	// ResetFast ended the attempt's processes and windows, restored the
	// home and the restored directories, and found nothing else changed.
	ResetFast = "fast"
	// ResetLoadvm loaded the VM's clean snapshot into its running QEMU.
	ResetLoadvm = "loadvm"
	// ResetRevert reverted the VM's clean snapshot through libvirt (a new
	// QEMU), because loadvm failed.
	ResetRevert = "revert"
	// ResetFastThenLoadvm and ResetFastThenRevert: the fast reset could
	// not bring the guest back (ResetReport.Why says what was left), so
	// the snapshot was restored instead.
	ResetFastThenLoadvm = "fast+loadvm"
	ResetFastThenRevert = "fast+revert"
	// ResetFastIncomplete: a guest given by URL, which has no snapshot to
	// fall back to, was fast-reset, but something of the earlier attempt
	// is left (ResetReport.Why says what); a warning says so too.
	ResetFastIncomplete = "fast-incomplete"
)

// refreshAfter is how many resets a desktop runs with one kind before it
// measures the other kind again: the costs drift with the tasks' mix.
const refreshAfter = 20

// costEWMA weighs the newest measurement of a reset's cost.
const costEWMA = 0.3

// resetCost is the running estimate of one kind of reset's cost on a
// desktop.
type resetCost struct {
	mean time.Duration
	n    int
	// at is the reset count when it was last measured.
	at int
}

func (c *resetCost) add(d time.Duration, at int) {
	if c.n == 0 {
		c.mean = d
	} else {
		c.mean = time.Duration(costEWMA*float64(d) + (1-costEWMA)*float64(c.mean))
	}
	c.n++
	c.at = at
}

// resetChooser decides how a desktop resets for each task: a snapshot
// revert where a fast reset cannot be trusted (the domain's rule, an
// earlier fallback after the same task), otherwise whichever of fast reset
// and loadvm measured cheaper on this desktop.
type resetChooser struct {
	fast, loadvm resetCost
	resets       int
	// fellBack maps a task to why the fast reset after its attempt could
	// not undo it.
	fellBack map[string]string
}

// choice is a reset to run and why.
type choice struct {
	kind, why string
}

// prevAttempt is the task whose attempt ran since the last reset.
type prevAttempt struct {
	id, domain string
}

// choose picks the reset before task on a desktop that can revert (a VM);
// prev is the attempt since the last reset, if any.
func (c *resetChooser) choose(cfg Config, task, prev prevAttempt) choice {
	switch {
	case cfg.NoFastReset:
		return choice{ResetLoadvm, "NoFastReset (--no-fast-reset): every attempt starts from the snapshot"}
	case cfg.revertDomain(task.domain):
		return choice{ResetLoadvm, fmt.Sprintf("tasks of domain %s change state a fast reset cannot undo (RevertDomains)", task.domain)}
	case prev.id != "" && cfg.revertDomain(prev.domain):
		return choice{ResetLoadvm, fmt.Sprintf("the attempt before ran task %s of domain %s, which changes state a fast reset cannot undo (RevertDomains)", prev.id, prev.domain)}
	}
	if why, ok := c.fellBack[prev.id]; ok && prev.id != "" {
		return choice{ResetLoadvm, fmt.Sprintf("the fast reset after task %s fell back to the snapshot before (%s)", prev.id, clip(why))}
	}
	f, l := c.fast, c.loadvm
	switch {
	case f.n == 0:
		return choice{ResetFast, "fast reset not measured on this desktop yet"}
	case l.n == 0:
		return choice{ResetLoadvm, fmt.Sprintf("loadvm not measured on this desktop yet (fast reset: %s)", secs(f.mean))}
	}
	cheap, other, cheapName, otherName := ResetFast, ResetLoadvm, "fast", "loadvm"
	cm, om, oat := f.mean, l.mean, l.at
	if l.mean < f.mean {
		cheap, other, cheapName, otherName = ResetLoadvm, ResetFast, "loadvm", "fast"
		cm, om, oat = l.mean, f.mean, f.at
	}
	if c.resets-oat >= refreshAfter {
		return choice{other, fmt.Sprintf("measuring %s again (%s, %d resets ago; %s: %s)", otherName, secs(om), c.resets-oat, cheapName, secs(cm))}
	}
	return choice{cheap, fmt.Sprintf("cheaper here: %s %s vs %s %s (measured)", cheapName, secs(cm), otherName, secs(om))}
}

// done records a reset that ran: its kind, how long it took to the clean
// state, and, for a fast reset that fell back, why (after the attempt of
// prev).
func (c *resetChooser) done(kind string, took time.Duration, prev prevAttempt, fellBack string) {
	c.resets++
	switch kind {
	case ResetFast:
		c.fast.add(took, c.resets)
	case ResetLoadvm, ResetRevert:
		// A loadvm that failed over to libvirt's revert: choosing loadvm
		// cost that.
		c.loadvm.add(took, c.resets)
	case ResetFastThenLoadvm, ResetFastThenRevert:
		// Choosing the fast reset cost both.
		c.fast.add(took, c.resets)
		if prev.id != "" {
			if c.fellBack == nil {
				c.fellBack = map[string]string{}
			}
			c.fellBack[prev.id] = fellBack
		}
	}
}

// secs formats a duration in seconds for a reason.
func secs(d time.Duration) string {
	return fmt.Sprintf("%.2fs", d.Seconds())
}
