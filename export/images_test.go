package export_test

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"image/png"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	rl "legato/rl"
	"legato/rl/export"
	"legato/rl/policy/policytest"
	"legato/rl/schema"
)

// lineImages is what a line of an export says of its images, decoded on
// its own (as a trainer reads it).
type lineImages struct {
	RolloutID string      `json:"rollout_id"`
	Step      int         `json:"step"`
	TokenIDs  []int64     `json:"token_ids"` // a contiguous sample's
	Images    []lineImage `json:"images"`
}

type lineImage struct {
	SHA256 string  `json:"sha256"`
	Bytes  int     `json:"bytes"`
	Width  int     `json:"width"`
	Height int     `json:"height"`
	Span   *[2]int `json:"token_span"`
}

// readLineImages reads the images of every line of an export.
func readLineImages(t *testing.T, path string) []lineImages {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []lineImages
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<26)
	for sc.Scan() {
		var l lineImages
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatal(err)
		}
		if !bytes.Contains(sc.Bytes(), []byte(`"images":`)) {
			t.Fatalf("%s step %d: no images field", l.RolloutID, l.Step)
		}
		out = append(out, l)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// wantImages lists the images of a step's prompt from its messages and its
// ids, without export: each image's whole bytes from the store, their
// hash and decoded size, and the runs of tok in the ids.
func wantImages(t *testing.T, store *schema.MessageStore, step schema.Step, tok int64) []lineImage {
	t.Helper()
	msgs, err := store.LoadRequest(step, schema.LoadOptions{KeepImageRefs: true})
	if err != nil {
		t.Fatal(err)
	}
	var out []lineImage
	for _, m := range msgs {
		for _, p := range m.Content {
			if p.ImageURL == nil {
				continue
			}
			data, err := store.ImagePNG(strings.TrimPrefix(p.ImageURL.URL, schema.ImageScheme))
			if err != nil {
				t.Fatal(err)
			}
			sum := sha256.Sum256(data)
			cfg, err := png.DecodeConfig(bytes.NewReader(data))
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, lineImage{SHA256: hex.EncodeToString(sum[:]), Bytes: len(data), Width: cfg.Width, Height: cfg.Height})
		}
	}
	ids, err := store.PromptTokenIDs(step)
	if err != nil {
		t.Fatal(err)
	}
	var runs [][2]int
	for i := 0; i < len(ids); i++ {
		if ids[i] == tok && (i == 0 || ids[i-1] != tok) {
			runs = append(runs, [2]int{i, i})
		}
		if ids[i] == tok {
			runs[len(runs)-1][1] = i + 1
		}
	}
	if len(runs) == len(out) {
		for i := range out {
			out[i].Span = &runs[i]
		}
	}
	return out
}

// TestExportImages: every sample lists its prompt's screenshots in order,
// as the bytes the server was sent (their sha256, size and PNG size), with
// the span of each image's tokens in the prompt's ids; with prompt
// prefixes the spans stay the whole prompt's; a contiguous sample lists
// its last prompt's, which its sequence starts with.
func TestExportImages(t *testing.T) {
	dir := contiguousRun(t, rl.MaxImageMax)
	store, err := schema.OpenMessageStore(dir, schema.StoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	recs := map[string]schema.Record{}
	if _, err := schema.ReadRunRecords(dir, func(r schema.Record) error { recs[r.RolloutID] = r; return nil }); err != nil {
		t.Fatal(err)
	}
	wantByStep := map[string][]lineImage{}
	for _, prefix := range []bool{false, true} {
		out := filepath.Join(t.TempDir(), "train.jsonl")
		if _, err := export.ExportSteps(dir, out, export.Options{PromptPrefix: prefix}); err != nil {
			t.Fatal(err)
		}
		lines := readLineImages(t, out)
		if len(lines) == 0 {
			t.Fatal("no samples")
		}
		spans := 0
		for _, l := range lines {
			want := wantImages(t, store, recs[l.RolloutID].Steps[l.Step], rl.DefaultImageTokenID)
			if len(want) != l.Step+1 {
				t.Fatalf("%s step %d: %d images in the prompt; want a screenshot per step so far", l.RolloutID, l.Step, len(want))
			}
			for _, img := range want {
				if img.Width != 320 || img.Height != 192 || img.Span == nil || img.Span[1]-img.Span[0] != policytest.DefaultImageTokens {
					t.Fatalf("%s step %d: image %+v; want the fake's 320x192 screens, %d tokens each", l.RolloutID, l.Step, img, policytest.DefaultImageTokens)
				}
				spans++
			}
			if diff := cmp.Diff(want, l.Images); diff != "" {
				t.Errorf("prefix %v: %s step %d images (-want +got):\n%s", prefix, l.RolloutID, l.Step, diff)
			}
			wantByStep[fmt.Sprint(l.RolloutID, "/", l.Step)] = want
		}
		if spans == 0 {
			t.Fatal("no image spans to check")
		}
	}

	// Another model's image token: an id none of the prompts holds gives
	// the images without spans.
	absent := int64(0)
	for _, rec := range recs {
		for _, st := range rec.Steps {
			ids, err := store.PromptTokenIDs(st)
			if err != nil {
				t.Fatal(err)
			}
			for _, id := range ids {
				absent = max(absent, id+1)
			}
		}
	}
	out := filepath.Join(t.TempDir(), "other.jsonl")
	if _, err := export.ExportSteps(dir, out, export.Options{ImageTokenID: absent}); err != nil {
		t.Fatal(err)
	}
	for _, l := range readLineImages(t, out) {
		want := slices.Clone(wantByStep[fmt.Sprint(l.RolloutID, "/", l.Step)])
		for i := range want {
			want[i].Span = nil
		}
		if diff := cmp.Diff(want, l.Images); diff != "" {
			t.Errorf("image token %d: %s step %d images (-want +got):\n%s", absent, l.RolloutID, l.Step, diff)
		}
	}
	if _, err := export.ExportSteps(dir, out, export.Options{ImageTokenID: -1}); err == nil || !strings.Contains(err.Error(), "ImageTokenID -1") {
		t.Errorf("ImageTokenID -1: %v; want an error naming it", err)
	}

	out = filepath.Join(t.TempDir(), "seq.jsonl")
	if _, err := export.ExportSteps(dir, out, export.Options{Contiguous: true}); err != nil {
		t.Fatal(err)
	}
	for _, l := range readLineImages(t, out) {
		last := len(recs[l.RolloutID].Steps) - 1
		want := wantByStep[fmt.Sprint(l.RolloutID, "/", last)]
		if diff := cmp.Diff(want, l.Images); diff != "" {
			t.Errorf("contiguous %s: images (-want: its last step's +got):\n%s", l.RolloutID, diff)
		}
		for _, img := range l.Images {
			if img.Span == nil {
				continue // the diff says
			}
			for _, id := range l.TokenIDs[img.Span[0]:img.Span[1]] {
				if id != rl.DefaultImageTokenID {
					t.Fatalf("contiguous %s: id %d in image %s's span %v", l.RolloutID, id, img.SHA256, *img.Span)
				}
			}
		}
	}
}
