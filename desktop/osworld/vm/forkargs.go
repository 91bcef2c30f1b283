package vm

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// A fork clone runs the very QEMU command line libvirt ran the template's
// VM with, so its devices match the device state it loads; only what must
// differ is rewritten (cloneArgs). The template keeps libvirt's argv as it
// read it from /proc.

// qemuProcess finds the QEMU process libvirt runs domain name in on this
// machine: its pid, argv, and the user it runs as.
type qemuProcess struct {
	pid      int
	argv     []string
	uid, gid int
	groups   []uint32
}

// findQEMU scans /proc for the process whose -name is guest=name.
func findQEMU(name string) (qemuProcess, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return qemuProcess{}, err
	}
	want := "guest=" + name + ","
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil || !strings.Contains(string(b), want) {
			continue
		}
		argv := strings.Split(strings.TrimSuffix(string(b), "\x00"), "\x00")
		if nameArg(argv) != name {
			continue
		}
		p := qemuProcess{pid: pid, argv: argv}
		if p.uid, p.gid, p.groups, err = procIDs(pid); err != nil {
			return qemuProcess{}, err
		}
		return p, nil
	}
	return qemuProcess{}, fmt.Errorf("no QEMU process of domain %s on this machine", name)
}

// nameArg returns the guest name of a QEMU argv's -name, or "".
func nameArg(argv []string) string {
	for i := 0; i+1 < len(argv); i++ {
		if argv[i] == "-name" {
			for _, kv := range strings.Split(argv[i+1], ",") {
				if v, ok := strings.CutPrefix(kv, "guest="); ok {
					return v
				}
			}
		}
	}
	return ""
}

// procIDs reads a process's real uid and gid and its supplementary
// groups.
func procIDs(pid int) (uid, gid int, groups []uint32, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, nil, err
	}
	uid, gid = -1, -1
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 1 {
			continue
		}
		switch f[0] {
		case "Uid:", "Gid:":
			if len(f) < 2 {
				return 0, 0, nil, fmt.Errorf("process %d: %q", pid, line)
			}
			n, err := strconv.Atoi(f[1])
			if err != nil {
				return 0, 0, nil, err
			}
			if f[0] == "Uid:" {
				uid = n
			} else {
				gid = n
			}
		case "Groups:":
			for _, g := range f[1:] {
				n, err := strconv.ParseUint(g, 10, 32)
				if err != nil {
					return 0, 0, nil, err
				}
				groups = append(groups, uint32(n))
			}
		}
	}
	if uid < 0 || gid < 0 {
		return 0, 0, nil, fmt.Errorf("process %d: no Uid/Gid in its status", pid)
	}
	return uid, gid, groups, nil
}

// cloneSpec is what differs between a clone's command line and its
// template VM's.
type cloneSpec struct {
	Name    string // the clone's -name guest=
	Monitor string // path of the clone's QMP socket
	// RAM is the template's RAM file, mapped copy-on-write; "" gives the
	// clone anonymous RAM of its own (a kept state's stream fills it all).
	RAM     string
	Overlay string // the clone's qcow2 overlay on the template's disk
	// Netdev is the clone's -netdev value for the NIC libvirt's argv gave
	// (QEMU user networking, its host forwards).
	Netdev string
}

// errNotForkable means libvirt's command line lacks something a clone
// needs (shared guest RAM, the disk, the monitor): the VM was not started
// for forking, or a libvirt of another shape started it.
var errNotForkable = errors.New("not forkable")

// cloneArgs rewrites the template VM's argv (without argv[0]) for a clone:
// its name; libvirt's monitor fd becomes a socket of the clone's; guest
// RAM, shared memfd in the template, becomes the template's RAM file
// mapped privately (share=off: the clone's writes stay its own); the
// disk's top file becomes the clone's overlay, which names its own
// backing chain; the NIC gets the clone's forwards; libvirt's master key
// (it holds no secret this VM uses) and a -loadvm go; -incoming defer
// waits for the device state.
func cloneArgs(argv []string, s cloneSpec) ([]string, error) {
	var out []string
	var seen struct{ name, ram, monitor, disk, netdev bool }
	topFormat, err := diskFormatNode(argv)
	if err != nil {
		return nil, err
	}
	topFile := ""
	for i := 0; i+1 < len(argv); i += 2 {
		if argv[i] == "-blockdev" {
			var m map[string]any
			if json.Unmarshal([]byte(argv[i+1]), &m) == nil && m["node-name"] == topFormat {
				topFile, _ = m["file"].(string)
			}
		}
	}
	for i := 0; i < len(argv); i++ {
		opt := argv[i]
		if !strings.HasPrefix(opt, "-") || i+1 >= len(argv) || optTakesNoValue(opt) {
			out = append(out, opt)
			continue
		}
		val := argv[i+1]
		i++
		switch opt {
		case "-loadvm":
			// libvirt starts a VM it reverted to a snapshot with -loadvm;
			// a clone gets its state from -incoming, which QEMU refuses
			// alongside it.
			continue
		case "-name":
			seen.name = true
			val = "guest=" + s.Name + ",debug-threads=on"
		case "-object":
			var m map[string]any
			if json.Unmarshal([]byte(val), &m) != nil {
				break
			}
			switch m["qom-type"] {
			case "secret":
				if m["id"] == "masterKey0" {
					continue
				}
			case "memory-backend-memfd", "memory-backend-file", "memory-backend-ram":
				if m["share"] != true || m["qom-type"] == "memory-backend-ram" {
					return nil, fmt.Errorf("%w: guest RAM is not shared (%s): start the VM with Config.Fork", errNotForkable, val)
				}
				seen.ram = true
				delete(m, "hugetlb")
				delete(m, "hugetlbsize")
				delete(m, "seal")
				if s.RAM == "" {
					// Anonymous: a page the stream says is zero stays
					// the kernel's zero page (a private map of a tmpfs
					// file would fill the file as QEMU reads it).
					m["qom-type"] = "memory-backend-ram"
					delete(m, "share")
				} else {
					m["qom-type"] = "memory-backend-file"
					m["mem-path"] = s.RAM
					m["share"] = false
				}
				b, err := json.Marshal(m)
				if err != nil {
					return nil, err
				}
				val = string(b)
			}
		case "-chardev":
			if strings.HasPrefix(val, "socket,id=charmonitor,") {
				seen.monitor = true
				val = "socket,id=charmonitor,path=" + s.Monitor + ",server=on,wait=off"
			}
		case "-blockdev":
			var m map[string]any
			if json.Unmarshal([]byte(val), &m) != nil {
				break
			}
			switch m["node-name"] {
			case topFile:
				seen.disk = true
				m["filename"] = s.Overlay
			case topFormat:
				// The overlay's header names its backing chain (the
				// template's disk, then the base image).
				delete(m, "backing")
			default:
				// Other nodes (the base image's, firmware, a second
				// disk) stay as libvirt gave them: read-only or the
				// device state would not match without them.
				out = append(out, opt, val)
				continue
			}
			b, err := json.Marshal(m)
			if err != nil {
				return nil, err
			}
			val = string(b)
		case "-netdev":
			if strings.Contains(val, "id=legatonet") {
				seen.netdev = true
				val = s.Netdev
			}
		}
		out = append(out, opt, val)
	}
	switch {
	case !seen.name:
		return nil, fmt.Errorf("%w: no -name", errNotForkable)
	case !seen.ram:
		return nil, fmt.Errorf("%w: no guest RAM backend", errNotForkable)
	case !seen.monitor:
		return nil, fmt.Errorf("%w: no libvirt monitor", errNotForkable)
	case !seen.disk:
		return nil, fmt.Errorf("%w: no disk file node %q", errNotForkable, topFile)
	case !seen.netdev:
		return nil, fmt.Errorf("%w: no legato user network", errNotForkable)
	}
	return append(out, "-incoming", "defer"), nil
}

// diskFormatNode returns the node name of the block device the guest's
// virtio disk uses: the top of its backing chain.
func diskFormatNode(argv []string) (string, error) {
	for i := 0; i+1 < len(argv); i++ {
		if argv[i] != "-device" {
			continue
		}
		var m map[string]any
		if json.Unmarshal([]byte(argv[i+1]), &m) != nil {
			continue
		}
		if m["driver"] == "virtio-blk-pci" {
			if node, ok := m["drive"].(string); ok {
				return node, nil
			}
		}
	}
	return "", fmt.Errorf("%w: no virtio disk", errNotForkable)
}

// optTakesNoValue lists the QEMU options of libvirt's argv that stand
// alone.
func optTakesNoValue(opt string) bool {
	switch opt {
	case "-S", "-no-user-config", "-nodefaults", "-no-shutdown", "-no-reboot", "-nographic", "-enable-kvm", "-no-hpet", "-no-acpi":
		return true
	}
	return false
}
