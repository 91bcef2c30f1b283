package osworld

import (
	"fmt"
	"time"
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

// resetHistory is what a desktop remembers of its resets, for the next
// plan (see resetFacts).
type resetHistory struct {
	// fresh: nothing ran since the VM was made from its clean snapshot.
	fresh bool
	// prev is the attempt since the last reset.
	prev    prevAttempt
	chooser resetChooser
	// warned lists the domains a guest given by URL warned about (it
	// cannot revert what their tasks need).
	warned map[string]bool
}

// resetChooser is what a desktop measured of its resets: the costs
// planReset compares, and the tasks after whose attempt a fast reset fell
// back to the snapshot.
type resetChooser struct {
	fast, loadvm resetCost
	resets       int
	// fellBack maps a task to why the fast reset after its attempt could
	// not undo it.
	fellBack map[string]string
}

// prevAttempt is the task whose attempt ran since the last reset.
type prevAttempt struct {
	id, domain string
}

// secs formats a duration in seconds for a reason.
func secs(d time.Duration) string {
	return fmt.Sprintf("%.2fs", d.Seconds())
}
