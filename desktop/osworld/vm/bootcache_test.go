package vm

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestBootManifestKey(t *testing.T) {
	base := bootManifest{Machine: "m", Image: "/pool/base-abc.qcow2", QEMU: 7002000, Caller: "c"}
	same := base
	same.Taken, same.Bytes = time.Now(), 42
	if base.key() != same.key() {
		t.Errorf("time and size changed the key")
	}
	for name, m := range map[string]bootManifest{
		"machine": {Machine: "m2", Image: base.Image, QEMU: base.QEMU, Caller: base.Caller},
		"image":   {Machine: base.Machine, Image: "/pool/base-def.qcow2", QEMU: base.QEMU, Caller: base.Caller},
		"qemu":    {Machine: base.Machine, Image: base.Image, QEMU: 8000000, Caller: base.Caller},
		"caller":  {Machine: base.Machine, Image: base.Image, QEMU: base.QEMU, Caller: "c2"},
	} {
		if m.key() == base.key() {
			t.Errorf("another %s, same key", name)
		}
	}
}

func TestFillBootEntry(t *testing.T) {
	root := filepath.Join(t.TempDir(), "cache")
	overlay := filepath.Join(t.TempDir(), "overlay.qcow2")
	data := bytes.Repeat([]byte("qcow2 with the clean snapshot "), 1<<12)
	if err := os.WriteFile(overlay, data, 0o600); err != nil {
		t.Fatal(err)
	}
	m := bootManifest{Machine: "m", Image: overlay, QEMU: 7002000}
	dir := filepath.Join(root, m.key())
	n, err := fillBootEntry(dir, m, func(dst string) error { return copyFileOver(overlay, dst) })
	if err != nil || n != int64(len(data)) {
		t.Fatalf("fill: %d bytes, %v; want %d", n, err, len(data))
	}
	if got, err := os.ReadFile(filepath.Join(dir, bootCacheOverlay)); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("entry overlay: %d bytes, %v; want the overlay's %d", len(got), err, len(data))
	}
	var got bootManifest
	b, err := os.ReadFile(filepath.Join(dir, bootCacheManifest))
	if err == nil {
		err = json.Unmarshal(b, &got)
	}
	if err != nil || got.key() != m.key() || got.Bytes != int64(len(data)) || got.Taken.IsZero() {
		t.Errorf("manifest %+v, %v; want the key's fields, %d bytes and a time", got, err, len(data))
	}
	// A second fill of the same entry (another process's VM) keeps the
	// first and leaves nothing half-written.
	if err := os.WriteFile(overlay, []byte("another"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := fillBootEntry(dir, m, func(dst string) error { return copyFileOver(overlay, dst) }); err != nil {
		t.Fatalf("second fill: %v", err)
	}
	if got, _ := os.ReadFile(filepath.Join(dir, bootCacheOverlay)); !bytes.Equal(got, data) {
		t.Errorf("the second fill replaced the entry")
	}
	if des, _ := os.ReadDir(root); len(des) != 1 {
		t.Errorf("cache holds %d directories, want the entry only", len(des))
	}
}

func TestPruneBootCache(t *testing.T) {
	root := t.TempDir()
	image := filepath.Join(t.TempDir(), "base.qcow2")
	if err := os.WriteFile(image, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	entry := func(name, image string, local bool) string {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(p, 0o700); err != nil {
			t.Fatal(err)
		}
		b, _ := json.Marshal(bootManifest{Machine: "m", Image: image, Local: local})
		if err := os.WriteFile(filepath.Join(p, bootCacheManifest), b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	key := func(c string) string { return strings.Repeat(c, 32) }
	missing := filepath.Join(root, "no-such-image.qcow2")
	kept := entry(key("a"), image, true)
	gone := entry(key("b"), missing, true)
	// A remote host's image cannot be looked for here.
	remote := entry(key("e"), missing, false)
	unused := entry(key("f"), image, true)
	fresh := entry(key("c")+bootTmpInfix+"0badcafe", image, true)
	stale := entry(key("d")+bootTmpInfix+"0badcafe", image, true)
	// Not the cache's: the user's own, whatever they hold.
	users := entry("photos", missing, true)
	usersTmp := entry("build"+bootTmpInfix+"0badcafe", image, true)
	old := time.Now().Add(-2 * time.Hour)
	for _, p := range []string{stale, usersTmp} {
		if err := os.Chtimes(p, old, old); err != nil {
			t.Fatal(err)
		}
	}
	long := time.Now().Add(-bootUnusedMax - time.Hour)
	if err := os.Chtimes(filepath.Join(unused, bootCacheManifest), long, long); err != nil {
		t.Fatal(err)
	}
	pruneBootCache(root)
	for p, want := range map[string]bool{kept: true, gone: false, remote: true, unused: false, fresh: true, stale: false, users: true, usersTmp: true} {
		_, err := os.Stat(p)
		if have := err == nil; have != want {
			t.Errorf("%s: there %v, want %v", filepath.Base(p), have, want)
		}
	}
}

// TestBootFlight: the first VM to want an entry fills it, the others wait
// for it to end, filled or not; then the next one to want it may fill it.
func TestBootFlight(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "entry")
	f, first := joinBootFlight(dir)
	if !first {
		t.Fatal("the first VM to want the entry does not fill it")
	}
	g, first := joinBootFlight(dir)
	if first || g != f {
		t.Fatal("a second VM fills the entry too, instead of waiting")
	}
	select {
	case <-g.done:
		t.Fatal("the flight ended before its VM ended it")
	default:
	}
	endBootFlight(dir, f)
	select {
	case <-g.done:
	default:
		t.Fatal("a waiting VM was not let go")
	}
	h, first := joinBootFlight(dir)
	if !first || h == f {
		t.Fatal("after the flight, the next VM does not fill the entry")
	}
	endBootFlight(dir, h)
}

func TestRestoring(t *testing.T) {
	if Restoring(context.Background()) {
		t.Error("a plain ctx says restoring")
	}
	if !Restoring(context.WithValue(context.Background(), restoringKey{}, true)) {
		t.Error("the restore's ctx does not say restoring")
	}
}
