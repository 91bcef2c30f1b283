package schema

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// storedPrompt stores a small prompt and returns the run directory, the
// hashes and the messages.
func storedPrompt(t *testing.T) (string, []string, []Message) {
	t.Helper()
	dir := t.TempDir()
	r := mustCreate(t, dir)
	msgs := []Message{
		{Role: "system", Content: []Part{TextPart("sys")}},
		{Role: "user", Content: []Part{TextPart("look"), ImagePart(dataURL(tinyPNG))}},
	}
	hashes, err := r.PutMessages(msgs)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	return dir, hashes, msgs
}

func TestLoadRequestErrors(t *testing.T) {
	tests := []struct {
		name    string
		damage  func(t *testing.T, dir string, hashes []string) []string
		wantErr error
		wantMsg string
	}{
		{
			name:    "malformed hash",
			damage:  func(_ *testing.T, _ string, h []string) []string { return []string{h[0], "../summary.json"} },
			wantErr: ErrBadHash,
			wantMsg: "message 1",
		},
		{
			name:    "missing message",
			damage:  func(_ *testing.T, _ string, h []string) []string { return []string{strings.Repeat("0", 64)} },
			wantErr: ErrNotFound,
			wantMsg: "load message 0000",
		},
		{
			name: "message swapped for another",
			damage: func(t *testing.T, dir string, h []string) []string {
				other := objectsIn(t, filepath.Join(dir, MessagesDir))[h[1]]
				rewriteObject(t, filepath.Join(dir, MessagesDir), h[0], other)
				return h
			},
			wantErr: ErrCorrupt,
			wantMsg: "does not match its hash",
		},
		{
			name: "message not zstd",
			damage: func(t *testing.T, dir string, h []string) []string {
				rewriteObject(t, filepath.Join(dir, MessagesDir), h[0], []byte(`{"role":"system"}`))
				return h
			},
			wantErr: ErrCorrupt,
			wantMsg: "zstd",
		},
		{
			name: "image changed",
			damage: func(t *testing.T, dir string, h []string) []string {
				writeFile(t, filepath.Join(dir, ImagesDir, sha(tinyPNG)+".png"), append(tinyPNG[:len(tinyPNG):len(tinyPNG)], 0))
				return h
			},
			wantErr: ErrCorrupt,
			wantMsg: "load image " + sha(tinyPNG),
		},
		{
			name: "image missing",
			damage: func(t *testing.T, dir string, h []string) []string {
				if err := os.Remove(filepath.Join(dir, ImagesDir, sha(tinyPNG)+".png")); err != nil {
					t.Fatal(err)
				}
				return h
			},
			wantErr: ErrNotFound,
			wantMsg: "message 1",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir, hashes, _ := storedPrompt(t)
			req := tt.damage(t, dir, hashes)
			_, err := LoadRequest(dir, Step{Request: req}, LoadOptions{})
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("LoadRequest: %v, want %v", err, tt.wantErr)
			}
			if !strings.Contains(err.Error(), tt.wantMsg) {
				t.Errorf("error %q does not contain %q", err, tt.wantMsg)
			}
			if strings.HasPrefix(tt.name, "image") {
				return // MessageJSON loads no image
			}
			s, err := OpenMessageStore(dir, StoreOptions{})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			for _, h := range req {
				if _, err = s.MessageJSON(h); err != nil {
					break
				}
			}
			if !errors.Is(err, tt.wantErr) {
				t.Errorf("MessageJSON: %v, want %v", err, tt.wantErr)
			}
		})
	}
}

func TestLoadRequestMissingRun(t *testing.T) {
	if _, err := LoadRequest(filepath.Join(t.TempDir(), "nope"), Step{}, LoadOptions{}); err == nil {
		t.Error("LoadRequest of a missing run succeeded")
	}
}

func TestMessageStoreCaches(t *testing.T) {
	dir, hashes, msgs := storedPrompt(t)
	s, err := OpenMessageStore(dir, StoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	first, err := s.Messages(hashes, LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// Changing what was returned must not change the cache.
	first[1].Content[1].ImageURL.URL = "changed"
	first[0].Content[0].Text = "changed"
	// Served from the caches: the files are gone.
	for _, d := range []string{MessagesDir, ImagesDir} {
		if err := os.RemoveAll(filepath.Join(dir, d)); err != nil {
			t.Fatal(err)
		}
	}
	second, err := s.LoadRequest(Step{Request: hashes}, LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(msgs, second); diff != "" {
		t.Errorf("second load (-want +got):\n%s", diff)
	}
	// A directory without messages/ is not a run.
	if other, err := OpenMessageStore(dir, StoreOptions{}); err == nil {
		other.Close()
		t.Error("OpenMessageStore without messages/ succeeded")
	}
}

func TestMessageStoreWithoutCacheRereads(t *testing.T) {
	dir, hashes, msgs := storedPrompt(t)
	s, err := OpenMessageStore(dir, StoreOptions{MessageCacheBytes: -1, ImageCacheBytes: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	got, err := s.Messages(hashes, LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(msgs, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	damageObject(t, filepath.Join(dir, MessagesDir), hashes[0])
	if _, err := s.Message(hashes[0]); !errors.Is(err, ErrCorrupt) {
		t.Errorf("uncached load of a message damaged since: %v, want ErrCorrupt", err)
	}
}

func TestMessageStoreImagePNG(t *testing.T) {
	dir, _, _ := storedPrompt(t)
	s, err := OpenMessageStore(dir, StoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	got, err := s.ImagePNG(sha(tinyPNG))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(tinyPNG, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	if _, err := s.ImagePNG("nope"); !errors.Is(err, ErrBadHash) {
		t.Errorf("ImagePNG(nope): %v, want ErrBadHash", err)
	}
}

func TestMessageStoreClosed(t *testing.T) {
	dir, hashes, _ := storedPrompt(t)
	s, err := OpenMessageStore(dir, StoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	if err := s.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if _, err := s.Messages(hashes, LoadOptions{}); !errors.Is(err, ErrClosed) {
		t.Errorf("Messages after Close: %v, want ErrClosed", err)
	}
	if _, err := s.Message(hashes[0]); !errors.Is(err, ErrClosed) {
		t.Errorf("Message after Close: %v, want ErrClosed", err)
	}
	if _, err := s.ImagePNG(sha(tinyPNG)); !errors.Is(err, ErrClosed) {
		t.Errorf("ImagePNG after Close: %v, want ErrClosed", err)
	}
}

func TestLRU(t *testing.T) {
	type op struct {
		put  bool
		key  string
		cost int64
	}
	tests := []struct {
		name string
		max  int64
		ops  []op
		want []string // keys present at the end
	}{
		{"evicts least recently used", 3, []op{{true, "a", 1}, {true, "b", 1}, {true, "c", 1}, {false, "a", 0}, {true, "d", 1}}, []string{"a", "c", "d"}},
		{"evicts until it fits", 4, []op{{true, "a", 1}, {true, "b", 1}, {true, "c", 1}, {true, "d", 3}}, []string{"c", "d"}},
		{"skips values larger than the cache", 2, []op{{true, "a", 1}, {true, "big", 3}}, []string{"a"}},
		{"replacing updates the cost", 2, []op{{true, "a", 1}, {true, "b", 1}, {true, "a", 2}}, []string{"a"}},
		{"disabled", 0, []op{{true, "a", 1}}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newLRU[string, int](tt.max)
			for _, o := range tt.ops {
				if o.put {
					c.put(o.key, int(o.cost), o.cost)
				} else {
					c.get(o.key)
				}
			}
			var got []string
			for _, k := range []string{"a", "b", "c", "d", "big"} {
				if _, ok := c.get(k); ok {
					got = append(got, k)
				}
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("keys (-want +got):\n%s", diff)
			}
			if c.len() != len(tt.want) {
				t.Errorf("len() = %d, want %d", c.len(), len(tt.want))
			}
		})
	}
}

func writeFile(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}
