package osworld

import (
	"bytes"
	"crypto/rand"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"legato/rl/desktop"
)

// TestEndStateDir: only an osworld end state's name maps to a directory,
// inside Config.EndStates; a desktop without a VM or a directory keeps
// none.
func TestEndStateDir(t *testing.T) {
	root := t.TempDir()
	d := &Desktop{cfg: Config{EndStates: root}}
	good := endStatePrefix + strings.Repeat("0a", 16)
	if dir, err := d.endStateDir(good); err != nil || dir != filepath.Join(root, good) {
		t.Errorf("endStateDir(%q) = %q, %v", good, dir, err)
	}
	for _, ref := range []string{"", "..", "../x", endStatePrefix, endStatePrefix + "zz", endStatePrefix + strings.Repeat("0a", 15),
		endStatePrefix + strings.Repeat("0a", 16) + "/..", "fake-end-" + strings.Repeat("0a", 16), endStatePrefix + "../" + strings.Repeat("0", 29)} {
		if dir, err := d.endStateDir(ref); err == nil {
			t.Errorf("endStateDir(%q) = %q, want an error", ref, dir)
		}
	}
	if err := (&Desktop{cfg: Config{EndStates: root}}).canKeep(); !errors.Is(err, desktop.ErrUnsupported) {
		t.Errorf("a desktop without a VM: canKeep = %v, want ErrUnsupported", err)
	}
	if _, err := (&Desktop{}).endStateDir(good); !errors.Is(err, desktop.ErrUnsupported) {
		t.Errorf("no Config.EndStates: %v, want ErrUnsupported", err)
	}
}

// TestGradeEndStateRefusesSymlink: a kept end state's directory replaced
// by a symlink is refused, naming it, before anything in it is opened (it
// was taken for the state).
func TestGradeEndStateRefusesSymlink(t *testing.T) {
	root := t.TempDir()
	ref := endStatePrefix + strings.Repeat("0a", 16)
	dir := filepath.Join(root, ref)
	if err := os.Symlink(t.TempDir(), dir); err != nil {
		t.Fatal(err)
	}
	d := &Desktop{cfg: Config{EndStates: root}, closeCtx: t.Context()}
	if _, err := d.GradeEndState(t.Context(), ref, desktop.Task{ID: "t"}, desktop.Action{}); err == nil || !strings.Contains(err.Error(), dir+" is a symlink") {
		t.Errorf("GradeEndState of a symlink: %v; want it refused, saying %s is a symlink", err, dir)
	}
}

// TestValidateEndStates: guests given by URL cannot keep end states.
func TestValidateEndStates(t *testing.T) {
	cfg := Config{Guests: []GuestAddr{{URL: "http://127.0.0.1:5000"}}, EndStates: t.TempDir()}
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "EndStates") {
		t.Errorf("Validate = %v, want an error about EndStates", err)
	}
	cfg.EndStates = ""
	if err := cfg.Validate(); err != nil {
		t.Errorf("without EndStates: %v", err)
	}
}

// TestGCEndStates: gc removes an end state left half-written (its writer's
// lock free), keeps and counts the whole ones.
func TestGCEndStates(t *testing.T) {
	dir := t.TempDir()
	half := filepath.Join(dir, ".new-"+endStatePrefix+strings.Repeat("1", 32))
	whole := filepath.Join(dir, endStatePrefix+strings.Repeat("2", 32))
	for _, d := range []string{half, whole} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(half, "lock"), []byte("123\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// Random: a compressing file system takes it whole too.
	if err := os.WriteFile(filepath.Join(whole, "state.zst"), randomBytes(t, 3<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := GCEndStates(dir, &out); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(half); err == nil {
		t.Errorf("%s still exists", half)
	}
	if _, err := os.Stat(whole); err != nil {
		t.Errorf("the whole end state went: %v", err)
	}
	for _, want := range []string{"removed half-written end state " + half, ": 1 kept end states, 3 MiB on disk"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("gc said %q; want %q in it", out.String(), want)
		}
	}
}

func randomBytes(t *testing.T, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}
