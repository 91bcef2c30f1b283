package schema

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/klauspost/compress/zstd"
)

// golden compares got with testdata/name, or rewrites it with -update.
func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if diff := cmp.Diff(string(want), string(got)); diff != "" {
		t.Errorf("%s (-want +got):\n%s", path, diff)
	}
}

// TestRecordGolden pins the on-disk line of a record with every field set:
// the legato.rollout/v0 names of SPEC §6.
func TestRecordGolden(t *testing.T) {
	dir := t.TempDir()
	r := mustCreate(t, dir)
	rec := fullRecord("3f1c2a9e-0b7d-4c55-9e61-8a0f3d2b7c10")
	rec.Schema = ""
	if err := r.Append(rec); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(dir, RecordsFile))
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Count(got, []byte("\n")) != 1 || !bytes.HasSuffix(got, []byte("\n")) {
		t.Errorf("Append wrote %q, want one line", got)
	}
	golden(t, "record.golden", got)

	back, _ := readAll(t, dir)
	if diff := cmp.Diff([]Record{*fullRecord("3f1c2a9e-0b7d-4c55-9e61-8a0f3d2b7c10")}, back); diff != "" {
		t.Errorf("read back (-want +got):\n%s", diff)
	}
}

// TestMessageGolden pins the stored form of a message: the decompressed
// messages/<sha256> file is the canonical JSON, images as references.
func TestMessageGolden(t *testing.T) {
	dir := t.TempDir()
	r := mustCreate(t, dir)
	msg := Message{Role: "user", Content: []Part{
		TextPart("Screenshot after step 3. <tool_call> & \"quotes\""),
		ImagePart(dataURL(tinyPNG)),
	}}
	hashes, err := r.PutMessages([]Message{msg})
	if err != nil {
		t.Fatal(err)
	}
	compressed, ok := objectsIn(t, filepath.Join(dir, MessagesDir))[hashes[0]]
	if !ok {
		t.Fatalf("message %s is not stored", hashes[0])
	}
	dec, err := zstd.NewReader(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer dec.Close()
	canon, err := dec.DecodeAll(compressed, nil)
	if err != nil {
		t.Fatalf("messages/%s is not one zstd frame: %v", hashes[0], err)
	}
	if sha(canon) != hashes[0] {
		t.Errorf("messages/%s holds content with sha256 %s", hashes[0], sha(canon))
	}
	golden(t, "message.golden", canon)
	stored, err := os.ReadFile(filepath.Join(dir, ImagesDir, sha(tinyPNG)+".png"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(stored, tinyPNG) {
		t.Error("images/<sha256>.png does not hold the PNG bytes")
	}
}
