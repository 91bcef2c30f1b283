//go:build integration

package vm

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestIntegrationKeep keeps a running VM's whole state on disk, and then a
// clone's, and brings each back: the clone of a kept state has its file,
// its process and its boot, and nothing written after the keep.
func TestIntegrationKeep(t *testing.T) {
	if os.Getenv(crashChildEnv) != "" {
		t.Skip("crash child")
	}
	cfg := testConfig(t, "legato-itkeep-")
	cfg.Fork = true
	cfg.ForkDir = "/dev/shm/legato-itkeep"
	cfg.BootCache = itBootCache(t)
	t.Cleanup(func() { os.Remove(cfg.ForkDir) })
	sweepFirst(t, cfg)
	ctx := t.Context()
	v, err := Start(ctx, cfg, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	g := newGuest(t, v)
	g.dirty(ctx)
	want := g.state(ctx)

	kept := t.TempDir()
	first := filepath.Join(kept, "first")
	st, err := v.Keep(ctx, first)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("kept the VM: paused %v (stream %v, %d MiB before zstd; disk %v), %d MiB on disk",
		st.Paused, st.Stream, st.StreamBytes>>20, st.Disk, st.Bytes>>20)
	if st.StreamBytes < 16<<20 {
		t.Errorf("the kept stream is %d bytes: the guest RAM is not in it", st.StreamBytes)
	}
	if _, err := v.Keep(ctx, first); err == nil {
		t.Error("Keep wrote over a kept state")
	}
	// The VM runs on, and what it does next is not in the kept state.
	if got := g.state(ctx); got != want {
		t.Fatalf("VM after Keep: %+v, want %+v", got, want)
	}
	g.sh(ctx, "echo later > /home/user/after-keep && sync")

	tmpl, err := v.LoadKept(ctx, first)
	if err != nil {
		t.Fatal(err)
	}
	defer tmpl.Close()
	c, err := tmpl.Fork(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cg := cloneGuest(t, c)
	cg.waitAnswer(ctx)
	if got := cg.state(ctx); got != want {
		t.Errorf("clone of the kept VM: %+v, want %+v", got, want)
	}
	// The clone's RAM is its own, anonymous: the template holds only the
	// disk layer on tmpfs, not a file the RAM fills.
	onTmpfs, err := DiskUsage(tmpl.Dir())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the kept state's template takes %d MiB of %s", onTmpfs>>20, cfg.ForkDir)
	if ram := int64(cfg.MemoryMiB) << 20; onTmpfs > ram/4 {
		t.Errorf("the kept state's template takes %d MiB of tmpfs; the guest has %d MiB of RAM", onTmpfs>>20, ram>>20)
	}
	if out, rc, _ := cg.try(ctx, "cat /home/user/after-keep"); rc == 0 {
		t.Errorf("the clone of the kept state reads a file written after the keep: %q", out)
	}

	// A clone keeps its own state the same way.
	cg.sh(ctx, "echo clone > /home/user/in-clone && sync")
	second := filepath.Join(kept, "second")
	if st, err = c.Keep(ctx, second); err != nil {
		t.Fatal(err)
	}
	t.Logf("kept the clone: paused %v, %d MiB on disk", st.Paused, st.Bytes>>20)
	if got := cg.sh(ctx, "cat /home/user/in-clone"); got != "clone" {
		t.Errorf("the clone after Keep reads %q", got)
	}
	tmpl2, err := v.LoadKept(ctx, second)
	if err != nil {
		t.Fatal(err)
	}
	defer tmpl2.Close()
	c2, err := tmpl2.Fork(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cg2 := cloneGuest(t, c2)
	cg2.waitAnswer(ctx)
	if got := cg2.sh(ctx, "cat /home/user/in-clone /home/user/legato-dirty"); got != "clone\ndirty" {
		t.Errorf("clone of the kept clone reads %q", got)
	}
	if got := cg2.state(ctx); got.BootID != want.BootID || !got.DirtyProc {
		t.Errorf("clone of the kept clone: %+v, want the boot and process of %+v", got, want)
	}

	// A template of a kept state goes with its clones; the kept state
	// stays until it is deleted.
	pid := c2.PID()
	dir := tmpl2.Dir()
	if err := tmpl2.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); err == nil {
		t.Errorf("%s still exists after the template closed", dir)
	}
	if processAlive(pid) {
		t.Errorf("clone %d runs after its template closed", pid)
	}
	if _, err := os.Stat(filepath.Join(second, keptManifest)); err != nil {
		t.Errorf("the kept state went with its template: %v", err)
	}
	// A stream that is not the one kept (another state's) gives no clone.
	swapped, err := os.ReadFile(filepath.Join(second, keptStream))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(first, keptStream), swapped, 0o600); err != nil {
		t.Fatal(err)
	}
	tmpl3, err := v.LoadKept(ctx, first)
	if err != nil {
		t.Fatal(err)
	}
	defer tmpl3.Close()
	if c3, err := tmpl3.Fork(ctx); err == nil || !strings.Contains(err.Error(), "the manifest says") {
		t.Errorf("Fork of a kept state whose stream was swapped: %v, want the hash's error", err)
		if c3 != nil {
			c3.Close()
		}
	}
	// A state kept by another build of QEMU at the same path (one upgraded
	// in place), or over another base image, is refused by name.
	m := filepath.Join(first, keptManifest)
	b, err := os.ReadFile(m)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		edit func(*keptManifestV)
		want string
	}{
		{func(m *keptManifestV) { m.QEMU.MTime = m.QEMU.MTime.Add(-time.Hour) }, "another build of"},
		{func(m *keptManifestV) { m.QEMU.Size++ }, "another build of"},
		{func(m *keptManifestV) { m.Base = "/nonexistent/legato-base-0000000000000000.qcow2" }, "written over the base image"},
	} {
		if err := os.WriteFile(m, editManifest(t, b, tt.edit), 0o600); err != nil {
			t.Fatal(err)
		}
		if tmpl, err := v.LoadKept(ctx, first); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("LoadKept of an edited manifest: %v, want an error saying %q", err, tt.want)
			if tmpl != nil {
				tmpl.Close()
			}
		}
	}
}

// processAlive says whether pid names a process (a zombie counts).
func processAlive(pid int) bool { return syscall.Kill(pid, 0) == nil }

// editManifest is a kept state's manifest changed by edit.
func editManifest(t *testing.T, manifest []byte, edit func(*keptManifestV)) []byte {
	t.Helper()
	var m keptManifestV
	if err := json.Unmarshal(manifest, &m); err != nil {
		t.Fatal(err)
	}
	edit(&m)
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
