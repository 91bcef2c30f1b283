package vm

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"text/template"
)

// domainSpec is everything the domain XML depends on.
type domainSpec struct {
	Name      string
	Accel     Accel
	VCPUs     int
	MemoryMiB int
	Overlay   string
	Kernel    string
	Initrd    string
	Cmdline   string
	// SharedRAM backs guest RAM with shared memory (Config.Fork).
	SharedRAM bool
	// Forwards maps host ports on 127.0.0.1 to guest ports.
	Forwards []forward
}

type forward struct{ Host, Guest int }

// The serial console's ring buffer in QEMU: its chardev id and size.
const (
	consoleID   = "legatocon"
	consoleSize = 256 << 10
)

// ConsoleID and ConsoleSize are the console ring buffer's, for the
// template.
func (domainSpec) ConsoleID() string { return consoleID }
func (domainSpec) ConsoleSize() int  { return consoleSize }

// NetdevArg is QEMU's -netdev value: user-mode networking that lets the
// guest reach nothing (restrict=on) with each forward bound to 127.0.0.1.
func (s domainSpec) NetdevArg() string {
	var b bytes.Buffer
	b.WriteString("user,id=legatonet,restrict=on")
	for _, f := range s.Forwards {
		fmt.Fprintf(&b, ",hostfwd=tcp:127.0.0.1:%d-:%d", f.Host, f.Guest)
	}
	return b.String()
}

// Why the choices below:
//   - type='qemu' is TCG; type='kvm' gets host-passthrough, the fastest CPU
//     model, which is safe because these domains never migrate.
//   - cache='unsafe': the overlay is thrown away with the VM, so flushing it
//     to disk buys nothing and costs on every guest fsync.
//   - no <interface>: libvirt's networks and bridges are never used; the NIC
//     is QEMU user-net, given in <qemu:commandline> (libvirt 9.0 has no
//     other way to set restrict=on and hostfwd). It sits at a fixed PCI
//     slot on the 'pc' machine's bus.
//   - the serial port writes into a ring buffer in QEMU (a chardev libvirt
//     9.0 cannot express, hence <qemu:commandline>), read through libvirt's
//     monitor passthrough for the error when a guest does not come up: a
//     console file on the host could only be read with a volume download,
//     a libvirt stream, which go-libvirt can deadlock on (its issue 241).
//   - shared memfd RAM (Config.Fork) lets a template copy guest RAM out of
//     the running QEMU and have QEMU's migration leave it out
//     (x-ignore-shared); memfd, not a file, so that libvirt keeps choosing
//     where and nothing is written back to a disk.
//   - disk boot (OSWorld's images) gets a VGA adapter for the guest's X
//     server; the direct-boot test guest draws with Xvfb and needs none.
var domainTemplate = template.Must(template.New("domain").Funcs(template.FuncMap{"x": xmlText}).Parse(
	`<domain type='{{if eq .Accel "kvm"}}kvm{{else}}qemu{{end}}' xmlns:qemu='http://libvirt.org/schemas/domain/qemu/1.0'>
  <name>{{x .Name}}</name>
  <memory unit='MiB'>{{.MemoryMiB}}</memory>
  <vcpu>{{.VCPUs}}</vcpu>
{{- if .SharedRAM}}
  <memoryBacking><source type='memfd'/><access mode='shared'/></memoryBacking>
{{- end}}
  <os>
    <type arch='x86_64' machine='pc'>hvm</type>
{{- if .Kernel}}
    <kernel>{{x .Kernel}}</kernel>
{{- if .Initrd}}
    <initrd>{{x .Initrd}}</initrd>
{{- end}}
{{- if .Cmdline}}
    <cmdline>{{x .Cmdline}}</cmdline>
{{- end}}
{{- else}}
    <boot dev='hd'/>
{{- end}}
  </os>
  <features><acpi/></features>
{{- if eq .Accel "kvm"}}
  <cpu mode='host-passthrough' check='none' migratable='off'/>
{{- end}}
  <clock offset='utc'/>
  <on_poweroff>destroy</on_poweroff>
  <on_reboot>restart</on_reboot>
  <on_crash>destroy</on_crash>
  <devices>
    <disk type='file' device='disk'>
      <driver name='qemu' type='qcow2' cache='unsafe'/>
      <source file='{{x .Overlay}}'/>
      <target dev='vda' bus='virtio'/>
    </disk>
{{- if not .Kernel}}
    <video><model type='vga'/></video>
{{- end}}
    <rng model='virtio'><backend model='random'>/dev/urandom</backend></rng>
    <controller type='usb' model='none'/>
    <memballoon model='none'/>
  </devices>
  <qemu:commandline>
    <qemu:arg value='-netdev'/>
    <qemu:arg value='{{x .NetdevArg}}'/>
    <qemu:arg value='-device'/>
    <qemu:arg value='virtio-net-pci,netdev=legatonet,bus=pci.0,addr=0x10'/>
    <qemu:arg value='-chardev'/>
    <qemu:arg value='ringbuf,id={{.ConsoleID}},size={{.ConsoleSize}}'/>
    <qemu:arg value='-serial'/>
    <qemu:arg value='chardev:{{.ConsoleID}}'/>
  </qemu:commandline>
</domain>
`))

// domainXML renders the libvirt domain definition.
func domainXML(s domainSpec) (string, error) {
	var b bytes.Buffer
	if err := domainTemplate.Execute(&b, s); err != nil {
		return "", fmt.Errorf("render domain xml: %w", err)
	}
	return b.String(), nil
}

// xmlText escapes s for an XML attribute or text node.
func xmlText(s string) (string, error) {
	var b bytes.Buffer
	if err := xml.EscapeText(&b, []byte(s)); err != nil {
		return "", err
	}
	return b.String(), nil
}
