package vm

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// ImageFiles hashes each file once: the sum is kept by path, size and
// modification time, and a changed file is hashed again.
func TestImageFilesHashOnce(t *testing.T) {
	dir := t.TempDir()
	base := filepath.Join(dir, "base.qcow2")
	kernel := filepath.Join(dir, "vmlinux")
	write := func(p, s string) {
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(base, "base v1")
	write(kernel, "kernel")
	sum := func(s string) string { h := sha256.Sum256([]byte(s)); return hex.EncodeToString(h[:]) }
	cache := filepath.Join(dir, "cache", "sums.json")
	cfg := Config{BaseImage: base, Kernel: kernel, HashCache: cache}

	files, err := ImageFiles(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != 2 || files[0].Role != RoleBase || files[0].SHA256 != sum("base v1") || files[0].Size != 7 ||
		files[1].Role != RoleKernel || files[1].SHA256 != sum("kernel") {
		t.Fatalf("ImageFiles = %+v", files)
	}

	// A cached sum is used as it is, so a wrong one proves the cache was
	// read.
	b, err := os.ReadFile(cache)
	if err != nil {
		t.Fatal(err)
	}
	fake := []byte(string(b))
	for i := range len(fake) - 64 {
		if string(fake[i:i+64]) == sum("base v1") {
			copy(fake[i:], sum("cached"))
		}
	}
	if err := os.WriteFile(cache, fake, 0o644); err != nil {
		t.Fatal(err)
	}
	files, err = ImageFiles(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if files[0].SHA256 != sum("cached") {
		t.Errorf("second ImageFiles hashed the base image again (%s); want the cached sum", files[0].SHA256)
	}

	// A changed file is hashed again.
	write(base, "base v2")
	later := time.Now().Add(time.Minute)
	if err := os.Chtimes(base, later, later); err != nil {
		t.Fatal(err)
	}
	files, err = ImageFiles(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if files[0].SHA256 != sum("base v2") {
		t.Errorf("after a change: sum %s, want the new content's", files[0].SHA256)
	}

	if _, err := ImageFiles(t.Context(), Config{BaseImage: filepath.Join(dir, "gone"), HashCache: "-"}); err == nil {
		t.Error("ImageFiles of a missing file: want an error")
	}
}

// The paths a prune must keep are found in domain and volume definitions
// as libvirt writes them.
func TestUsedPathRE(t *testing.T) {
	domain := `<domain type='qemu'>
  <os>
    <type arch='x86_64' machine='pc-i440fx-7.2'>hvm</type>
    <kernel>/var/lib/libvirt/images/legato/legato-kernel-e073b7cd71a8c375</kernel>
    <initrd>/var/lib/libvirt/images/legato/legato-initrd-9eef86c7442e2db7</initrd>
  </os>
  <devices>
    <disk type='file' device='disk'>
      <source file='/var/lib/libvirt/images/legato/legato-0-0000abcd.qcow2' index='1'/>
      <backingStore type='file' index='2'>
        <format type='qcow2'/>
        <source file='/var/lib/libvirt/images/legato/legato-base-681592909de47247.qcow2'/>
      </backingStore>
    </disk>
  </devices>
</domain>`
	volume := `<volume type='file'>
  <name>legato-0-0000abcd.qcow2</name>
  <backingStore>
    <path>/var/lib/libvirt/images/legato/a&amp;b-legato-base-0000000000000000.qcow2</path>
    <format type='qcow2'/>
  </backingStore>
</volume>`
	var got []string
	for _, x := range []string{domain, volume} {
		for _, m := range usedPathRE.FindAllStringSubmatch(x, -1) {
			for _, g := range m[1:] {
				if g != "" {
					got = append(got, g)
				}
			}
		}
	}
	want := []string{
		"/var/lib/libvirt/images/legato/legato-kernel-e073b7cd71a8c375",
		"/var/lib/libvirt/images/legato/legato-initrd-9eef86c7442e2db7",
		"/var/lib/libvirt/images/legato/legato-0-0000abcd.qcow2",
		"/var/lib/libvirt/images/legato/legato-base-681592909de47247.qcow2",
		"/var/lib/libvirt/images/legato/a&amp;b-legato-base-0000000000000000.qcow2",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("paths found:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	for _, tt := range []struct {
		name string
		ok   bool
	}{
		{"legato-base-0123456789abcdef.qcow2", true},
		{"legato-base-0123456789abcdef.qcow2.sha256-" + strings.Repeat("ab", 32), true},
		{"legato-kernel-0123456789abcdef", true},
		{"legato-initrd-0123456789abcdef.sha256-" + strings.Repeat("ab", 32), true},
		{"legato-0-0123abcd.qcow2", false},
		{"legato-base-xyz.qcow2", false},
		{"my-image.qcow2", false},
	} {
		if got := imageVolumeRE.MatchString(tt.name); got != tt.ok {
			t.Errorf("imageVolumeRE(%q) = %v, want %v", tt.name, got, tt.ok)
		}
	}
}
