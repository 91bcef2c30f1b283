package vm

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// libvirtArgv is the argv libvirt 9.0 ran a Config.Fork test guest with,
// read from /proc.
func libvirtArgv(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("testdata/libvirt-argv.txt")
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSpace(string(b)), "\n")
}

func TestCloneArgs(t *testing.T) {
	argv := libvirtArgv(t)
	spec := cloneSpec{
		Name: "legato-fork-00-c1", Monitor: "/f/c1/qmp.sock", RAM: "/f/ram", Overlay: "/f/c1/disk.qcow2",
		Netdev: "user,id=legatonet,restrict=on,hostfwd=tcp:127.0.0.1:4000-:5000",
	}
	got, err := cloneArgs(argv[1:], spec)
	if err != nil {
		t.Fatal(err)
	}
	opt := func(name string) []string {
		var vals []string
		for i := 0; i+1 < len(got); i++ {
			if got[i] == name {
				vals = append(vals, got[i+1])
			}
		}
		return vals
	}
	if diff := cmp.Diff([]string{"guest=legato-fork-00-c1,debug-threads=on"}, opt("-name")); diff != "" {
		t.Errorf("-name (-want +got):\n%s", diff)
	}
	objects := opt("-object")
	var ram map[string]any
	for _, o := range objects {
		if strings.Contains(o, "masterKey0") {
			t.Errorf("libvirt's master key kept: %s", o)
		}
		if strings.Contains(o, `"pc.ram"`) {
			json.Unmarshal([]byte(o), &ram)
		}
	}
	wantRAM := map[string]any{"qom-type": "memory-backend-file", "id": "pc.ram", "mem-path": "/f/ram", "share": false,
		"x-use-canonical-path-for-ramblock-id": false, "size": float64(1610612736)}
	if diff := cmp.Diff(wantRAM, ram); diff != "" {
		t.Errorf("guest RAM (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"socket,id=charmonitor,path=/f/c1/qmp.sock,server=on,wait=off", "ringbuf,id=legatocon,size=262144"}, opt("-chardev")); diff != "" {
		t.Errorf("-chardev (-want +got):\n%s", diff)
	}
	wantBlock := []string{
		argv[slices.Index(argv, "-blockdev")+1], // the base image's nodes as they were
		argv[slices.Index(argv, "-blockdev")+3],
		`{"auto-read-only":true,"cache":{"direct":false,"no-flush":true},"discard":"unmap","driver":"file","filename":"/f/c1/disk.qcow2","node-name":"libvirt-1-storage"}`,
		`{"cache":{"direct":false,"no-flush":true},"driver":"qcow2","file":"libvirt-1-storage","node-name":"libvirt-1-format","read-only":false}`,
	}
	if diff := cmp.Diff(wantBlock, opt("-blockdev")); diff != "" {
		t.Errorf("-blockdev: the overlay, which names its backing chain itself (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{spec.Netdev}, opt("-netdev")); diff != "" {
		t.Errorf("-netdev (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"defer"}, opt("-incoming")); diff != "" {
		t.Errorf("-incoming (-want +got):\n%s", diff)
	}
	// Everything else is libvirt's, unchanged and in order: the devices
	// must match the state the clone loads.
	for _, keep := range []string{"-machine", "-accel", "-cpu", "-m", "-smp", "-device", "-sandbox", "-kernel", "-append", "-serial", "-mon"} {
		var want []string
		for i := 1; i+1 < len(argv); i++ {
			if argv[i] == keep {
				want = append(want, argv[i+1])
			}
		}
		if diff := cmp.Diff(want, opt(keep)); diff != "" {
			t.Errorf("%s changed (-want +got):\n%s", keep, diff)
		}
	}
	for _, flag := range []string{"-S", "-nodefaults", "-no-user-config", "-no-shutdown"} {
		if !slices.Contains(got, flag) {
			t.Errorf("%s dropped", flag)
		}
	}
}

// TestCloneArgsAnonymousRAM: a kept state's clone (no RAM file) gets
// anonymous RAM under the same id, so the stream's RAM block matches.
func TestCloneArgsAnonymousRAM(t *testing.T) {
	got, err := cloneArgs(libvirtArgv(t)[1:], cloneSpec{Name: "c", Monitor: "/f/qmp.sock", Overlay: "/f/disk.qcow2",
		Netdev: "user,id=legatonet,restrict=on"})
	if err != nil {
		t.Fatal(err)
	}
	var ram map[string]any
	for i := 0; i+1 < len(got); i++ {
		if got[i] == "-object" && strings.Contains(got[i+1], `"pc.ram"`) {
			json.Unmarshal([]byte(got[i+1]), &ram)
		}
	}
	want := map[string]any{"qom-type": "memory-backend-ram", "id": "pc.ram", "x-use-canonical-path-for-ramblock-id": false, "size": float64(1610612736)}
	if diff := cmp.Diff(want, ram); diff != "" {
		t.Errorf("guest RAM (-want +got):\n%s", diff)
	}
}

// TestCloneArgsAfterRevert: libvirt starts a VM it reverted to a snapshot
// with -loadvm, which QEMU refuses next to -incoming ("'incoming' and
// 'loadvm' options are mutually exclusive"): a template taken after a
// revert must still fork.
func TestCloneArgsAfterRevert(t *testing.T) {
	argv := append(libvirtArgv(t)[1:], "-loadvm", "legato-clean")
	got, err := cloneArgs(argv, cloneSpec{Name: "c1", Netdev: "user,id=legatonet"})
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(got, "-loadvm") || slices.Contains(got, "legato-clean") {
		t.Errorf("the clone's argv keeps the revert's -loadvm: %q", got)
	}
	if !slices.Contains(got, "-incoming") {
		t.Errorf("the clone's argv has no -incoming: %q", got)
	}
}

func TestCloneArgsRefusesUnforkable(t *testing.T) {
	argv := libvirtArgv(t)[1:]
	replace := func(old, new string) []string {
		out := slices.Clone(argv)
		for i, a := range out {
			out[i] = strings.ReplaceAll(a, old, new)
		}
		return out
	}
	for name, argv := range map[string][]string{
		"private RAM":    replace(`"memory-backend-memfd","id":"pc.ram","share":true`, `"memory-backend-memfd","id":"pc.ram","share":false`),
		"anonymous RAM":  replace(`"memory-backend-memfd"`, `"memory-backend-ram"`),
		"no user net":    replace("id=legatonet", "id=other"),
		"no monitor":     replace("socket,id=charmonitor", "socket,id=other"),
		"no virtio disk": replace("virtio-blk-pci", "scsi-hd"),
	} {
		if _, err := cloneArgs(argv, cloneSpec{}); !errors.Is(err, ErrNotForkable) {
			t.Errorf("%s: %v, want ErrNotForkable", name, err)
		}
	}
}

func TestNameArg(t *testing.T) {
	if got := nameArg(libvirtArgv(t)); got != "legato-0-1a2b3c4d" {
		t.Errorf("nameArg = %q", got)
	}
	if got := nameArg([]string{"qemu", "-name", "x"}); got != "" {
		t.Errorf("nameArg without guest= = %q", got)
	}
}

// copySparse keeps the content, writes only non-zero pages, and its sum
// is the same as ramFileSum's of the copy; a changed page changes it.
func TestCopySparse(t *testing.T) {
	dir := t.TempDir()
	src, err := os.Create(filepath.Join(dir, "src"))
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	const size = 8 << 20
	if err := src.Truncate(size); err != nil {
		t.Fatal(err)
	}
	data := make([]byte, 3*4096+100)
	rand.Read(data)
	for _, off := range []int64{0, 1 << 20, 5<<20 + 4096, size - int64(len(data))} {
		if _, err := src.WriteAt(data, off); err != nil {
			t.Fatal(err)
		}
	}
	// A written page of zeros is data to SEEK_DATA but not to the copy.
	if _, err := src.WriteAt(make([]byte, 4096), 3<<20); err != nil {
		t.Fatal(err)
	}
	dst, err := os.Create(filepath.Join(dir, "dst"))
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Close()
	n, sum, err := copySparse(dst, src)
	if err != nil {
		t.Fatal(err)
	}
	a, _ := os.ReadFile(src.Name())
	b, _ := os.ReadFile(dst.Name())
	if !bytes.Equal(a, b) {
		t.Fatal("copy differs from the source")
	}
	if n > 4*int64(len(data))+4*4096 {
		t.Errorf("wrote %d bytes for %d of data", n, 4*len(data))
	}
	again, err := ramFileSum(t.Context(), dst)
	if err != nil {
		t.Fatal(err)
	}
	if again != sum {
		t.Error("ramFileSum of the copy differs from copySparse's sum")
	}
	dst.WriteAt([]byte{1}, 7<<20)
	if changed, _ := ramFileSum(t.Context(), dst); changed == sum {
		t.Error("a changed byte kept the sum")
	}
}

// SweepForks removes the template directories of its prefix that no
// process holds, and nothing else: not one held (flock'd) by a live run,
// not another prefix's, not one being made (hidden name).
func TestSweepForks(t *testing.T) {
	dir := t.TempDir()
	mk := func(name string, lock bool) string {
		t.Helper()
		d := filepath.Join(dir, name)
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if lock {
			f, err := lockDir(d)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { f.Close() })
		} else if err := os.WriteFile(filepath.Join(d, "lock"), []byte("1\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(d, "ram"), []byte("x"), 0o600)
		return d
	}
	dead := mk("legato-fork-00000001", false)
	live := mk("legato-fork-00000002", true)
	other := mk("legatox-fork-00000003", false)
	making := mk(".new-legato-fork-00000004", false)
	left, err := ForkLeftovers(dir, "legato-")
	if err != nil {
		t.Fatal(err)
	}
	if len(left) != 1 || left[0].Dir != dead || len(left[0].Processes) != 0 {
		t.Fatalf("leftovers %+v, want only %s", left, dead)
	}
	if _, err := SweepForks(dir, "legato-"); err != nil {
		t.Fatal(err)
	}
	for d, want := range map[string]bool{dead: false, live: true, other: true, making: true} {
		if _, err := os.Stat(d); (err == nil) != want {
			t.Errorf("%s exists %v after the sweep, want %v", filepath.Base(d), err == nil, want)
		}
	}
	if _, err := ForkLeftovers(dir, "../x"); err == nil {
		t.Error("a prefix with a path in it is refused")
	}
	if left, err := ForkLeftovers(filepath.Join(dir, "none"), "legato-"); err != nil || len(left) != 0 {
		t.Errorf("a fork dir that does not exist: %v, %v; want nothing", left, err)
	}
}
