package vm

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
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
