package schema

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sync/errgroup"
)

// Helpers that read and damage a content directory (messages/, tokens/)
// by the documented layout, packed or loose, without the package's reader.

// packedEntry is one entry of a pack: where its data starts, and the data.
type packedEntry struct {
	pack string
	off  int64
	data []byte
}

// packEntries parses the packs of dir, in the order they were written, and
// returns their whole entries by hash, in order.
func packEntries(t testing.TB, dir string) map[string][]packedEntry {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var packs []string
	for _, e := range entries {
		if n, ok := strings.CutPrefix(e.Name(), "pack-"); ok {
			if _, err := strconv.Atoi(n); err == nil {
				packs = append(packs, e.Name())
			}
		}
	}
	slices.SortFunc(packs, func(a, b string) int {
		x, _ := strconv.Atoi(a[5:])
		y, _ := strconv.Atoi(b[5:])
		return x - y
	})
	out := map[string][]packedEntry{}
	for _, p := range packs {
		b, err := os.ReadFile(filepath.Join(dir, p))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(string(b), "LGPACK1\n") {
			t.Fatalf("%s starts %q, not the pack magic", p, b[:min(8, len(b))])
		}
		off := 8
		for off+36 <= len(b) {
			n := int(binary.LittleEndian.Uint32(b[off+32:]))
			if off+36+n > len(b) {
				break // cut short
			}
			h := hex.EncodeToString(b[off : off+32])
			out[h] = append(out[h], packedEntry{p, int64(off + 36), b[off+36 : off+36+n]})
			off += 36 + n
		}
	}
	return out
}

// entryCount is how many entries the packs of dir hold.
func entryCount(t testing.TB, dir string) int {
	t.Helper()
	n := 0
	for _, es := range packEntries(t, dir) {
		n += len(es)
	}
	return n
}

// objectsIn returns the objects stored in dir by hash: the data of the
// last pack entry holding each, or of its loose file.
func objectsIn(t testing.TB, dir string) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	for h, es := range packEntries(t, dir) {
		out[h] = es[len(es)-1].data
	}
	for _, name := range names(t, dir) {
		if len(name) == 64 {
			b, err := os.ReadFile(filepath.Join(dir, name))
			if err != nil {
				t.Fatal(err)
			}
			out[name] = b
		}
	}
	return out
}

// objectHashes are the hashes of the objects stored in dir, sorted.
func objectHashes(t testing.TB, dir string) []string {
	t.Helper()
	var hs []string
	for h := range objectsIn(t, dir) {
		hs = append(hs, h)
	}
	slices.Sort(hs)
	return hs
}

// objectFile names the file in dir that holds object hash: its pack, or
// its loose file.
func objectFile(t testing.TB, dir, hash string) string {
	t.Helper()
	if es := packEntries(t, dir)[hash]; len(es) > 0 {
		return es[len(es)-1].pack
	}
	return hash
}

// rewriteObject makes data the stored form of object hash: a loose file
// is overwritten, a packed object gets a later entry in the last pack
// (which readers take over the earlier ones).
func rewriteObject(t testing.TB, dir, hash string, data []byte) {
	t.Helper()
	es := packEntries(t, dir)[hash]
	if len(es) == 0 {
		if err := os.WriteFile(filepath.Join(dir, hash), data, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	sum, err := hex.DecodeString(hash)
	if err != nil {
		t.Fatal(err)
	}
	entry := binary.LittleEndian.AppendUint32(sum, uint32(len(data)))
	appendTo(t, filepath.Join(dir, es[len(es)-1].pack), append(entry, data...))
}

// removeObject takes object hash out of dir: its loose file is removed,
// its pack entries get another hash.
func removeObject(t testing.TB, dir, hash string) {
	t.Helper()
	es := packEntries(t, dir)[hash]
	if len(es) == 0 {
		if err := os.Remove(filepath.Join(dir, hash)); err != nil {
			t.Fatal(err)
		}
		return
	}
	for _, e := range es {
		f, err := os.OpenFile(filepath.Join(dir, e.pack), os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteAt(make([]byte, 32), e.off-36); err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
}

// damageObject flips the last byte of object hash's stored data, in place.
func damageObject(t testing.TB, dir, hash string) {
	t.Helper()
	path, off := filepath.Join(dir, hash), int64(-1)
	var data []byte
	if es := packEntries(t, dir)[hash]; len(es) > 0 {
		e := es[len(es)-1]
		path, off, data = filepath.Join(dir, e.pack), e.off, e.data
	} else {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		off, data = 0, b
	}
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt([]byte{data[len(data)-1] ^ 0xff}, off+int64(len(data))-1); err != nil {
		t.Fatal(err)
	}
}

func appendTo(t testing.TB, path string, b []byte) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write(b); err != nil {
		t.Fatal(err)
	}
}

// TestPacksHoldSmallObjects: a run's messages and token chunks go into one
// pack per kind, each once, and load back; images stay files.
func TestPacksHoldSmallObjects(t *testing.T) {
	dir := t.TempDir()
	r := mustCreate(t, dir)
	var hashes []string
	for i := range 50 {
		hs, err := r.PutMessages([]Message{{Role: "user", Content: []Part{TextPart("step " + strconv.Itoa(i))}}})
		if err != nil {
			t.Fatal(err)
		}
		hashes = append(hashes, hs...)
	}
	if _, err := r.PutMessages([]Message{{Role: "user", Content: []Part{TextPart("step 7")}}}); err != nil {
		t.Fatal(err)
	}
	chunks, err := r.PutTokenIDs(promptIDs(2*TokenChunk+3, 6))
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if got := names(t, filepath.Join(dir, MessagesDir)); !slices.Equal(got, []string{"pack-1"}) {
		t.Errorf("messages/ holds %v, want one pack", got)
	}
	if got := names(t, filepath.Join(dir, TokensDir)); !slices.Equal(got, []string{"pack-1"}) {
		t.Errorf("tokens/ holds %v, want one pack", got)
	}
	entries := packEntries(t, filepath.Join(dir, MessagesDir))
	if len(entries) != 50 {
		t.Errorf("%d messages packed, want 50", len(entries))
	}
	for h, es := range entries {
		if len(es) != 1 {
			t.Errorf("message %s packed %d times", h, len(es))
		}
	}
	if diff := cmp.Diff(sorted(slices.Clone(chunks)), objectHashes(t, filepath.Join(dir, TokensDir))); diff != "" {
		t.Errorf("token chunks (-want +got):\n%s", diff)
	}
	s, err := OpenMessageStore(dir, StoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	msgs, err := s.Messages(hashes, LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := msgs[7].Content[0].Text; got != "step 7" {
		t.Errorf("message 7 loads as %q", got)
	}
}

// TestPackCutShort: a crash mid-append leaves a pack's last entry cut
// short; the objects before it load, and the next Run appends to a pack of
// its own.
func TestPackCutShort(t *testing.T) {
	dir := t.TempDir()
	r := mustCreate(t, dir)
	first, err := r.PutMessages([]Message{{Role: "system", Content: []Part{TextPart("kept")}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	// The header of an entry whose data never made it.
	appendTo(t, filepath.Join(dir, MessagesDir, "pack-1"), append(make([]byte, 32), 0xff, 0, 0, 0, '{'))
	r = mustCreate(t, dir)
	second, err := r.PutMessages([]Message{{Role: "user", Content: []Part{TextPart("after the crash")}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if got := names(t, filepath.Join(dir, MessagesDir)); !slices.Equal(got, []string{"pack-1", "pack-2"}) {
		t.Errorf("messages/ holds %v, want the cut pack and a new one", got)
	}
	for _, h := range append(first, second...) {
		if _, err := LoadRequest(dir, Step{Request: []string{h}}, LoadOptions{}); err != nil {
			t.Errorf("message %s: %v", h, err)
		}
	}
}

// TestPackReadWhileWriting: a store opened before a message was put finds
// it once put (a service reads its run while collecting).
func TestPackReadWhileWriting(t *testing.T) {
	dir := t.TempDir()
	r := mustCreate(t, dir)
	defer r.Close()
	s, err := OpenMessageStore(dir, StoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for i := range 3 {
		hs, err := r.PutMessages([]Message{{Role: "user", Content: []Part{TextPart("live " + strconv.Itoa(i))}}})
		if err != nil {
			t.Fatal(err)
		}
		m, err := s.Message(hs[0])
		if err != nil || m.Content[0].Text != "live "+strconv.Itoa(i) {
			t.Fatalf("message put after the store opened: %+v, %v", m, err)
		}
	}
	if _, err := s.Message(strings.Repeat("0", 64)); !errors.Is(err, ErrNotFound) {
		t.Errorf("a message never put: %v, want ErrNotFound", err)
	}
}

// TestPackLengthPastEnd: an entry whose length runs past the end of its
// pack (a damaged length, here the largest there is) is not indexed: its
// object is not found, rather than read past the end or allocated.
func TestPackLengthPastEnd(t *testing.T) {
	dir := t.TempDir()
	r := mustCreate(t, dir)
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	pack := filepath.Join(dir, MessagesDir, "pack-1")
	if err := os.WriteFile(pack, append([]byte("LGPACK1\n"), append(make([]byte, 32), 0xff, 0xff, 0xff, 0xff)...), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadRequest(dir, Step{Request: []string{strings.Repeat("0", 64)}}, LoadOptions{}); !errors.Is(err, ErrNotFound) {
		t.Errorf("load from a pack with a huge entry length: %v, want ErrNotFound", err)
	}
}

// TestPackNotAPack: a file named like a pack that is not one is an error
// naming it, not a silent miss.
func TestPackNotAPack(t *testing.T) {
	dir := t.TempDir()
	r := mustCreate(t, dir)
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, MessagesDir, "pack-1"), []byte("hello, world\n"))
	_, err := LoadRequest(dir, Step{Request: []string{strings.Repeat("0", 64)}}, LoadOptions{})
	if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "pack-1") {
		t.Errorf("load beside a file that is not a pack: %v, want ErrCorrupt naming it", err)
	}
}

// TestPackRemovedUnderRun: a pack taken away while the run appends to it
// fails the next commit, instead of records referring to objects that
// went with it.
func TestPackRemovedUnderRun(t *testing.T) {
	dir := t.TempDir()
	r := mustCreate(t, dir)
	defer r.Close()
	hashes, err := r.PutMessages([]Message{{Role: "user", Content: []Part{TextPart("gone")}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(dir, MessagesDir)); err != nil {
		t.Fatal(err)
	}
	rec := fullRecord("a")
	rec.Steps = rec.Steps[:1]
	rec.Steps[0].Request = hashes
	if err := r.Append(rec); err == nil || !strings.Contains(err.Error(), "removed") {
		t.Errorf("Append after the pack was removed: %v, want an error saying so", err)
	}
	if _, st := readAll(t, dir); st.Lines != 0 {
		t.Errorf("%d records written", st.Lines)
	}
}

// TestPackWindows: objects read through windows of their packs load as
// put, whatever the order and however many goroutines read: objects
// larger than a window, objects a window cuts, two packs, and objects
// appended after the store read a window ending at the pack's end then.
func TestPackWindows(t *testing.T) {
	dir := t.TempDir()
	rng := rand.New(rand.NewPCG(3, 4))
	bytesSrc := rand.NewChaCha8([32]byte{5})
	text := func() string {
		n := 10 + rng.IntN(24<<10)
		if rng.IntN(50) == 0 {
			n = 3*packWindowBytes + rng.IntN(packWindowBytes) // more than a window packed
		}
		b := make([]byte, n/2+1)
		bytesSrc.Read(b)
		return hex.EncodeToString(b) // zstd packs it to about half
	}
	want := map[string]string{}
	put := func(r *Run, n int) []string {
		var hs []string
		for range n {
			s := text()
			h, err := r.PutMessages([]Message{{Role: "user", Content: []Part{TextPart(s)}}})
			if err != nil {
				t.Fatal(err)
			}
			want[h[0]] = s
			hs = append(hs, h[0])
		}
		return hs
	}
	r := mustCreate(t, dir)
	hashes := put(r, 150)
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	r = mustCreate(t, dir)
	defer r.Close()
	hashes = append(hashes, put(r, 60)...)
	large := 0
	for _, es := range packEntries(t, filepath.Join(dir, MessagesDir)) {
		if len(es[0].data) > packWindowBytes {
			large++
		}
	}
	if large == 0 {
		t.Fatal("no object packed is larger than a window: the test does not test that")
	}
	s, err := OpenMessageStore(dir, StoreOptions{MessageCacheBytes: 1}) // windows without decoded messages
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	check := func(hs []string) error {
		for _, h := range hs {
			m, err := s.Message(h)
			if err != nil {
				return fmt.Errorf("message %s: %w", h, err)
			}
			if got := m.Content[0].Text; got != want[h] {
				return fmt.Errorf("message %s loads as %d bytes, put as %d", h, len(got), len(want[h]))
			}
		}
		return nil
	}
	var g errgroup.Group
	for i := range 3 {
		order := slices.Clone(hashes)
		if i > 0 { // one reader in the order written, two in others
			rand.New(rand.NewPCG(uint64(i), 0)).Shuffle(len(order), func(a, b int) { order[a], order[b] = order[b], order[a] })
		}
		g.Go(func() error { return check(order) })
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	if err := check(put(r, 20)); err != nil {
		t.Fatalf("after the store read to the pack's end: %v", err)
	}
	if err := check(hashes); err != nil {
		t.Fatal(err)
	}
}
