package hostagent

import (
	"errors"
	"fmt"
	"time"

	"legato/rl/desktop/osworld/vm"
)

// Version is the protocol's version, which Hello reports: a fleet talks
// only to an agent of its own version.
const Version = 1

// The operations of a Request.
const (
	OpHello    = "hello"    // → Reply.Hello
	OpTemplate = "template" // Domain → Reply.Template
	OpFork     = "fork"     // Template → Reply.Clone
	OpPrestart = "prestart" // Template, N
	OpCheck    = "check"    // Template: its RAM file's content (CheckRAM)
	OpForward  = "forward"  // Clone, Ports: a parked VM's ports to the clone
	OpEnd      = "end"      // Clone
	OpDrop     = "drop"     // Template, with its clones
	OpReserve  = "reserve"  // Ports, On: a parked VM's ports, kept from new clones
	OpSweep    = "sweep"    // → Reply.Swept
	OpCancel   = "cancel"   // Cancel: the id of a request the fleet gave up; no reply
)

// Request is one line from the fleet.
type Request struct {
	ID       uint64        `json:"id"`
	Op       string        `json:"op"`
	Domain   *vm.DomainRef `json:"domain,omitempty"`
	Template string        `json:"template,omitempty"`
	Clone    string        `json:"clone,omitempty"`
	Ports    *Ports        `json:"ports,omitempty"`
	N        int           `json:"n,omitempty"`
	On       bool          `json:"on,omitempty"`
	Cancel   uint64        `json:"cancel,omitempty"`
}

// Reply is one line from the agent: an error (Error, Kind) or the
// operation's result.
type Reply struct {
	ID       uint64        `json:"id"`
	Error    string        `json:"error,omitempty"`
	Kind     string        `json:"kind,omitempty"`
	Hello    *Hello        `json:"hello,omitempty"`
	Template *TemplateInfo `json:"template,omitempty"`
	Clone    *CloneInfo    `json:"clone,omitempty"`
	Swept    []string      `json:"swept,omitempty"`
}

// Hello is what an agent says of itself.
type Hello struct {
	Version int    `json:"version"`
	PID     int    `json:"pid"`
	ForkDir string `json:"fork_dir"`
}

// Ports are a VM's or a clone's ports on the host's 127.0.0.1.
type Ports struct {
	Guest    int `json:"guest"`
	DevTools int `json:"devtools"`
	VLC      int `json:"vlc"`
}

func wirePorts(p vm.Ports) *Ports { return &Ports{Guest: p.Guest, DevTools: p.DevTools, VLC: p.VLC} }

func (p Ports) vm() vm.Ports { return vm.Ports{Guest: p.Guest, DevTools: p.DevTools, VLC: p.VLC} }

func (p Ports) validate() error {
	for _, port := range []int{p.Guest, p.DevTools, p.VLC} {
		if port <= 0 || port > 65535 {
			return fmt.Errorf("ports %+v: each of guest, devtools and vlc must be a TCP port (1-65535)", p)
		}
	}
	return nil
}

// TemplateInfo is a template the agent took.
type TemplateInfo struct {
	Name    string             `json:"name"`
	Timings vm.TemplateTimings `json:"timings"`
}

// CloneInfo is a clone the agent forked.
type CloneInfo struct {
	Name  string `json:"name"`
	Ports Ports  `json:"ports"`
	PID   int    `json:"pid"`
	// Restore and Started are the clone's (vm.Clone): loading the state
	// and resuming, and starting its QEMU; Spare says the QEMU was
	// started ahead (Prestart).
	Restore time.Duration `json:"restore_ns"`
	Started time.Duration `json:"started_ns"`
	Spare   bool          `json:"spare,omitempty"`
}

// The kinds of a Reply's error, which the fleet's side turns back into
// the sentinels callers branch on.
const (
	KindBadRequest   = "bad_request"   // the request is malformed: a fleet's bug
	KindUnknown      = "unknown"       // no template or clone of that name (ended already)
	KindClosed       = "closed"        // vm.ErrClosed: the template closed
	KindBadTemplate  = "bad_template"  // vm.ErrBadTemplate
	KindNotForkable  = "not_forkable"  // vm.ErrNotForkable
	KindSavevmUnsafe = "savevm_unsafe" // vm.ErrSavevmUnsafe
	KindCancelled    = "cancelled"     // the fleet cancelled it, or the agent is ending
)

// ErrUnknown means the agent has no template or clone of the name asked.
var ErrUnknown = errors.New("host agent: no such template or clone")

// ErrBadRequest means the agent refused a malformed request.
var ErrBadRequest = errors.New("host agent: bad request")

// sentinels pair the kinds with the errors they stand for.
var sentinels = []struct {
	kind string
	err  error
}{
	{KindBadRequest, ErrBadRequest},
	{KindUnknown, ErrUnknown},
	{KindClosed, vm.ErrClosed},
	{KindBadTemplate, vm.ErrBadTemplate},
	{KindNotForkable, vm.ErrNotForkable},
	{KindSavevmUnsafe, vm.ErrSavevmUnsafe},
}

// kindOf classifies an agent-side error for its Reply.
func kindOf(err error) string {
	for _, s := range sentinels {
		if errors.Is(err, s.err) {
			return s.kind
		}
	}
	return ""
}

// replyError turns a Reply's error back into an error that wraps the
// sentinel of its kind.
func replyError(r Reply) error {
	if r.Error == "" {
		return nil
	}
	for _, s := range sentinels {
		if s.kind == r.Kind {
			return fmt.Errorf("%w: %s", s.err, r.Error)
		}
	}
	return errors.New(r.Error)
}
