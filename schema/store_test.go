package schema

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func sha(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func TestPutMessagesRoundTrip(t *testing.T) {
	shotA, shotB := screenshot(64, 36, 1), screenshot(64, 36, 2)
	msgs := []Message{
		{Role: "system", Content: []Part{TextPart("You are an agent. <tool_call> & friends")}},
		{Role: "user", Content: []Part{TextPart("Do it."), ImagePart(dataURL(shotA))}},
		{Role: "assistant", Content: []Part{TextPart("ok")}},
		{Role: "user", Content: []Part{ImagePart(dataURL(shotB)), ImagePart(dataURL(shotA))}},
		{Role: "user", Content: []Part{ImagePart("https://example.com/a.png")}},
		{Role: "user", Content: []Part{}},
		{Role: "user"},
		{Role: "user", Content: []Part{TextPart("héllo\u2028\t\"quoted\"")}},
	}
	orig := cloneMessages(msgs)
	dir := t.TempDir()
	r := mustCreate(t, dir)
	hashes, err := r.PutMessages(msgs)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(orig, msgs); diff != "" {
		t.Errorf("PutMessages changed its input (-want +got):\n%s", diff)
	}

	got, err := LoadRequest(dir, Step{Request: hashes}, LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(msgs, got); diff != "" {
		t.Errorf("LoadRequest with data URLs (-want +got):\n%s", diff)
	}

	refs, err := LoadRequest(dir, Step{Request: hashes}, LoadOptions{KeepImageRefs: true})
	if err != nil {
		t.Fatal(err)
	}
	want := cloneMessages(msgs)
	want[1].Content[1].ImageURL.URL = ImageScheme + sha(shotA)
	want[3].Content[0].ImageURL.URL = ImageScheme + sha(shotB)
	want[3].Content[1].ImageURL.URL = ImageScheme + sha(shotA)
	if diff := cmp.Diff(want, refs); diff != "" {
		t.Errorf("LoadRequest with references (-want +got):\n%s", diff)
	}

	// The hash is the documented one: sha256 of json.Marshal with references.
	for i, m := range want {
		b, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		if hashes[i] != sha(b) {
			t.Errorf("hash of message %d = %s, want sha256 of its canonical JSON %s", i, hashes[i], sha(b))
		}
	}
	// MessageJSON gives that canonical JSON, until the store is closed.
	store, err := OpenMessageStore(dir, StoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i, m := range want {
		b, _ := json.Marshal(m)
		for range 2 { // read, then cached
			if got, err := store.MessageJSON(hashes[i]); err != nil || string(got) != string(b) {
				t.Errorf("MessageJSON(message %d) = %s, %v; want %s", i, got, err, b)
			}
		}
	}
	if _, err := store.MessageJSON("not a hash"); err == nil {
		t.Error("MessageJSON of a malformed hash: no error")
	}
	store.Close()
	if _, err := store.MessageJSON(hashes[0]); !errors.Is(err, ErrClosed) {
		t.Errorf("MessageJSON after Close = %v, want ErrClosed", err)
	}
	// Each distinct object once.
	if diff := cmp.Diff(sorted([]string{sha(shotA) + ".png", sha(shotB) + ".png"}), sorted(names(t, filepath.Join(dir, ImagesDir)))); diff != "" {
		t.Errorf("images/ (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(sorted(slices.Compact(sorted(hashes))), objectHashes(t, filepath.Join(dir, MessagesDir))); diff != "" {
		t.Errorf("messages/ (-want +got):\n%s", diff)
	}
}

func TestPutMessagesIsIdempotent(t *testing.T) {
	msgs := []Message{
		{Role: "system", Content: []Part{TextPart("sys")}},
		{Role: "user", Content: []Part{ImagePart(dataURL(screenshot(32, 18, 3)))}},
	}
	dir := t.TempDir()
	r := mustCreate(t, dir)
	first, err := r.PutMessages(msgs)
	if err != nil {
		t.Fatal(err)
	}
	// The same prompt again, a new Run on the same directory (resume), and
	// a run elsewhere all give the same hashes.
	again, err := r.PutMessages(msgs)
	if err != nil {
		t.Fatal(err)
	}
	r.Close()
	resumed, err := mustCreate(t, dir).PutMessages(msgs)
	if err != nil {
		t.Fatal(err)
	}
	other, err := mustCreate(t, t.TempDir()).PutMessages(msgs)
	if err != nil {
		t.Fatal(err)
	}
	for name, got := range map[string][]string{"again": again, "resumed": resumed, "other run": other} {
		if diff := cmp.Diff(first, got); diff != "" {
			t.Errorf("%s: hashes (-want +got):\n%s", name, diff)
		}
	}
	if n := len(objectHashes(t, filepath.Join(dir, MessagesDir))); n != 2 {
		t.Errorf("messages/ holds %d objects, want 2", n)
	}
}

func TestPutMessagesReplacesEmptyObject(t *testing.T) {
	msgs := []Message{{Role: "user", Content: []Part{TextPart("hi"), ImagePart(dataURL(tinyPNG))}}}
	dir := t.TempDir()
	r := mustCreate(t, dir)
	hashes, err := r.PutMessages(msgs)
	if err != nil {
		t.Fatal(err)
	}
	r.Close()
	// An empty file under an object's name is not a stored object.
	for _, p := range []string{filepath.Join(dir, MessagesDir, hashes[0]), filepath.Join(dir, ImagesDir, sha(tinyPNG)+".png")} {
		if err := os.WriteFile(p, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := mustCreate(t, dir).PutMessages(msgs); err != nil {
		t.Fatal(err)
	}
	got, err := LoadRequest(dir, Step{Request: hashes}, LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(msgs, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

func TestPutMessagesAcceptsStoredRefs(t *testing.T) {
	dir := t.TempDir()
	r := mustCreate(t, dir)
	msgs := []Message{{Role: "user", Content: []Part{ImagePart(dataURL(tinyPNG))}}}
	hashes, err := r.PutMessages(msgs)
	if err != nil {
		t.Fatal(err)
	}
	refs, err := LoadRequest(dir, Step{Request: hashes}, LoadOptions{KeepImageRefs: true})
	if err != nil {
		t.Fatal(err)
	}
	r.Close()
	// A fresh Run knows nothing in memory: the reference is checked on disk.
	again, err := mustCreate(t, dir).PutMessages(refs)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(hashes, again); diff != "" {
		t.Errorf("hashes of the loaded messages (-want +got):\n%s", diff)
	}
}

func TestPutMessagesBadImages(t *testing.T) {
	b64 := base64.StdEncoding.EncodeToString
	tests := []struct {
		name    string
		url     string
		wantErr error
		wantMsg string
	}{
		{"jpeg", "data:image/jpeg;base64," + b64([]byte("\xff\xd8\xff")), ErrBadImage, "image/jpeg data URL: the store keeps PNG only"},
		{"no media type", "data:;base64,AAAA", ErrBadImage, "no media type"},
		{"not base64", "data:image/png," + string(tinyPNG), ErrBadImage, "not base64"},
		{"bad base64", "data:image/png;base64,!!!!", ErrBadImage, "illegal base64"},
		{"no comma", "data:image/png;base64", ErrBadImage, "without a comma"},
		{"not a PNG", "data:image/png;base64," + b64([]byte("GIF89a...")), ErrBadImage, "not a PNG"},
		{"missing ref", ImageScheme + strings.Repeat("0", 64), ErrNotFound, "must name an image of this run"},
		{"malformed ref", ImageScheme + "../../etc/passwd", ErrBadHash, "malformed hash"},
		{"uppercase ref", ImageScheme + strings.Repeat("A", 64), ErrBadHash, "malformed hash"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := mustCreate(t, t.TempDir())
			msgs := []Message{
				{Role: "system", Content: []Part{TextPart("ok")}},
				{Role: "user", Content: []Part{TextPart("look"), ImagePart(tt.url)}},
			}
			_, err := r.PutMessages(msgs)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("PutMessages: %v, want %v", err, tt.wantErr)
			}
			for _, s := range []string{"message 1", "part 1", tt.wantMsg} {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not contain %q", err, s)
				}
			}
			var oe *ObjectError
			if !errors.As(err, &oe) || oe.Kind != "image" || oe.Op != "put" {
				t.Errorf("error %v is not an *ObjectError for put image", err)
			}
		})
	}
}

func TestPutMessagesConcurrent(t *testing.T) {
	dir := t.TempDir()
	r := mustCreate(t, dir)
	shots := []string{dataURL(screenshot(48, 27, 10)), dataURL(screenshot(48, 27, 11))}
	replies := []string{reply(0), reply(1)}
	const workers = 8
	results := make([][]string, workers)
	errs := make([]error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			// Every worker stores the same two-step history at once, as
			// siblings of a group do with their shared prefix.
			for k := range 2 {
				results[w], errs[w] = r.PutMessages(prompt(shots, replies, k, 20))
				if errs[w] != nil {
					return
				}
			}
		})
	}
	wg.Wait()
	for w := range workers {
		if errs[w] != nil {
			t.Fatal(errs[w])
		}
		if diff := cmp.Diff(results[0], results[w]); diff != "" {
			t.Errorf("worker %d hashes (-want +got):\n%s", w, diff)
		}
	}
	got, err := LoadRequest(dir, Step{Request: results[0]}, LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(prompt(shots, replies, 1, 20), got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	for _, d := range []string{MessagesDir, ImagesDir} {
		for _, name := range names(t, filepath.Join(dir, d)) {
			if strings.HasPrefix(name, tempPrefix) {
				t.Errorf("temp file %s left in %s", name, d)
			}
		}
	}
}

// TestStorageGrowsLinearly checks SPEC §6: each step adds its new
// screenshot and two small messages, whatever the length of the history.
func TestStorageGrowsLinearly(t *testing.T) {
	const steps, imageMax = 15, 20
	dir := t.TempDir()
	r := mustCreate(t, dir)
	var shots, replies []string
	var pngs [][]byte
	var inline, prev int64
	for k := range steps {
		p := screenshot(96, 54, uint64(100+k))
		pngs = append(pngs, p)
		shots = append(shots, dataURL(p))
		replies = append(replies, reply(k))
		msgs := prompt(shots, replies, k, imageMax)
		if _, err := r.PutMessages(msgs); err != nil {
			t.Fatal(err)
		}
		b, err := json.Marshal(msgs)
		if err != nil {
			t.Fatal(err)
		}
		inline += int64(len(b))
		now := storeBytes(t, dir)
		// New this step: the screenshot, its user message and the previous
		// reply (and the system and instruction messages at step 0).
		if grew, limit := now-prev, int64(len(p))+4096; grew > limit {
			t.Errorf("step %d grew the store by %d bytes, want at most the new screenshot + 4 KiB = %d", k, grew, limit)
		}
		prev = now
	}
	if prev >= inline {
		t.Errorf("content store %d bytes, inline prompts %d bytes: want the store smaller", prev, inline)
	}
	t.Logf("%d steps of %dx%d screenshots: content store %d bytes, inline prompts %d bytes (%.1fx)", steps, 96, 54, prev, inline, float64(inline)/float64(prev))
}

func cloneMessages(msgs []Message) []Message {
	out := make([]Message, len(msgs))
	for i, m := range msgs {
		out[i] = cloneMessage(m)
	}
	return out
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

// TestParseHash: a hash is 64 lower-case hex digits, nothing else.
func TestParseHash(t *testing.T) {
	sum := sha256.Sum256([]byte("chunk"))
	good := hex.EncodeToString(sum[:])
	if got, err := parseHash(good); err != nil || got != sum {
		t.Errorf("parseHash(%s) = %x, %v; want %x", good, got, err, sum)
	}
	for _, bad := range []string{"", good[:63], good + "0", strings.ToUpper(good), good[:10] + "g" + good[11:],
		good[:63] + "/", "../" + good[3:], good[:20] + "A" + good[21:]} {
		if _, err := parseHash(bad); !errors.Is(err, ErrBadHash) {
			t.Errorf("parseHash(%q) = %v, want ErrBadHash", bad, err)
		}
	}
}

// TestImageHead: an image's first bytes and its size, read without the
// rest; fewer bytes from a shorter file; a missing image is ErrNotFound
// and a name that is no hash ErrBadHash.
func TestImageHead(t *testing.T) {
	dir := t.TempDir()
	r := mustCreate(t, dir)
	if _, err := r.PutMessages([]Message{{Role: "user", Content: []Part{ImagePart(dataURL(tinyPNG))}}}); err != nil {
		t.Fatal(err)
	}
	r.Close()
	s, err := OpenMessageStore(dir, StoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	head := make([]byte, 16)
	n, size, err := s.ImageHead(sha(tinyPNG), head)
	if err != nil || n != 16 || size != int64(len(tinyPNG)) || !bytes.Equal(head, tinyPNG[:16]) {
		t.Errorf("ImageHead = %d, %d, %v (%q); want 16, %d and the PNG's first bytes", n, size, err, head, len(tinyPNG))
	}
	long := make([]byte, len(tinyPNG)+10)
	if n, _, err := s.ImageHead(sha(tinyPNG), long); err != nil || n != len(tinyPNG) || !bytes.Equal(long[:n], tinyPNG) {
		t.Errorf("ImageHead of more than the file = %d, %v; want its %d bytes", n, err, len(tinyPNG))
	}
	if _, _, err := s.ImageHead(sha([]byte("never stored")), head); !errors.Is(err, ErrNotFound) {
		t.Errorf("ImageHead of a missing image: %v; want ErrNotFound", err)
	}
	if _, _, err := s.ImageHead("../../etc/passwd", head); !errors.Is(err, ErrBadHash) {
		t.Errorf("ImageHead of a path: %v; want ErrBadHash", err)
	}
}
