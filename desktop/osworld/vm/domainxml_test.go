package vm

import (
	"encoding/xml"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

func TestDomainXMLGolden(t *testing.T) {
	fwd := []forward{{Host: 40001, Guest: 5000}, {Host: 40002, Guest: 9222}, {Host: 40003, Guest: 8080}}
	tests := []struct {
		golden string
		spec   domainSpec
	}{
		{"direct-boot-tcg.xml", domainSpec{
			Name: "legato-0-0a1b2c3d", Accel: AccelTCG, VCPUs: 2, MemoryMiB: 1536,
			Overlay: "/var/tmp/legato/legato-0-0a1b2c3d.qcow2",
			Kernel:  "/var/tmp/legato-guest/vmlinux", Initrd: "/var/tmp/legato-guest/initrd.img",
			Cmdline: "root=/dev/vda rw console=ttyS0 init=/sbin/legato-init", Forwards: fwd,
		}},
		{"disk-boot-kvm.xml", domainSpec{
			Name: "legato-3-ffffffff", Accel: AccelKVM, VCPUs: 4, MemoryMiB: 4096,
			Overlay:  "/var/tmp/legato/legato-3-ffffffff.qcow2",
			Forwards: fwd,
		}},
		// Paths are data: XML metacharacters in them must not change the document.
		{"escaped-paths.xml", domainSpec{
			Name: "legato-1-00000000", Accel: AccelTCG, VCPUs: 1, MemoryMiB: 512,
			Overlay: "/var/tmp/a&b/<x>'.qcow2",
			Kernel:  "/k", Cmdline: "quiet a='1' b=\"2\"", Forwards: fwd,
		}},
	}
	for _, tt := range tests {
		t.Run(tt.golden, func(t *testing.T) {
			got, err := domainXML(tt.spec)
			if err != nil {
				t.Fatal(err)
			}
			// Whatever the golden says, the document must parse and keep
			// the values.
			var doc struct {
				Type    string `xml:"type,attr"`
				Name    string `xml:"name"`
				Kernel  string `xml:"os>kernel"`
				Cmdline string `xml:"os>cmdline"`
				Disk    struct {
					Source struct {
						File string `xml:"file,attr"`
					} `xml:"source"`
				} `xml:"devices>disk"`
				Args []struct {
					Value string `xml:"value,attr"`
				} `xml:"commandline>arg"`
			}
			if err := xml.Unmarshal([]byte(got), &doc); err != nil {
				t.Fatalf("domain xml does not parse: %v\n%s", err, got)
			}
			wantType := map[Accel]string{AccelKVM: "kvm", AccelTCG: "qemu"}[tt.spec.Accel]
			if doc.Type != wantType || doc.Name != tt.spec.Name || doc.Kernel != tt.spec.Kernel ||
				doc.Cmdline != tt.spec.Cmdline || doc.Disk.Source.File != tt.spec.Overlay {
				t.Errorf("parsed back %+v, want type %q and the spec's name, kernel, cmdline, overlay", doc, wantType)
			}
			if len(doc.Args) != 8 || doc.Args[1].Value != "user,id=legatonet,restrict=on,hostfwd=tcp:127.0.0.1:40001-:5000,hostfwd=tcp:127.0.0.1:40002-:9222,hostfwd=tcp:127.0.0.1:40003-:8080" {
				t.Errorf("qemu args %+v: want restricted user-net with the three forwards on 127.0.0.1", doc.Args)
			}
			if len(doc.Args) == 8 && (doc.Args[5].Value != "ringbuf,id=legatocon,size=262144" || doc.Args[7].Value != "chardev:legatocon") {
				t.Errorf("qemu args %+v: want the serial console in a ring buffer", doc.Args)
			}
			if strings.Contains(got, "<interface") {
				t.Error("domain xml has an <interface>: libvirt networks and bridges are never used")
			}
			path := filepath.Join("testdata", tt.golden)
			if *update {
				if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run with -update to create it)", err)
			}
			if diff := cmp.Diff(string(want), got); diff != "" {
				t.Errorf("domain xml (-want +got):\n%s", diff)
			}
		})
	}
}
