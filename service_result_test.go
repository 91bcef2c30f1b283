package rl

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"legato/rl/export"
	"legato/rl/policy/policytest"
	"legato/rl/schema"
)

// TestServiceResultShapes: every step lists its prompt's images in order,
// as the bytes the model server received, with their sizes and their spans
// in the prompt ids; steps=prefix carries what each step adds, which
// rebuilds the whole prompts; steps=none carries no step; images=attempt
// gives each image once.
func TestServiceResultShapes(t *testing.T) {
	// The images of each request as the server received them, by the
	// prompt's step (every attempt's prompts are the same up to the
	// screens, and each attempt's screens differ only by the fake's
	// history).
	var mu sync.Mutex
	received := map[string]bool{}
	script := clicksThenDone(2)
	e := newServiceEnv(t, policytest.Options{Script: func(req policytest.Request) string {
		mu.Lock()
		for _, m := range req.Messages {
			for _, p := range m.Content {
				if p.ImageURL == nil {
					continue
				}
				png, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(p.ImageURL.URL, "data:image/png;base64,"))
				if err != nil {
					t.Errorf("image URL %.40q: %v", p.ImageURL.URL, err)
				}
				sum := sha256.Sum256(png)
				received[hex.EncodeToString(sum[:])] = true
			}
		}
		mu.Unlock()
		return script(req)
	}})
	e.opts.Group = 2
	s := e.serve(t)
	defer s.Close(context.Background())
	info := submitClosed(t, s, GroupRequest{Task: inlineTask(1)})
	full, err := s.Result(info.ID, ResultOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if full.EndVersion != "v1" {
		t.Errorf("end_version %q; want v1, the version in force when the group ended", full.EndVersion)
	}
	steps := 0
	for _, a := range full.Attempts {
		for k, st := range a.Steps {
			steps++
			var refs []string
			for _, m := range st.Messages {
				for _, p := range m.Content {
					if p.ImageURL != nil {
						refs = append(refs, strings.TrimPrefix(p.ImageURL.URL, schema.ImageScheme))
					}
				}
			}
			if len(st.Images) != len(refs) || len(refs) != k+1 {
				t.Fatalf("%s step %d: %d images listed, %d in the messages; want %d", a.RolloutID, k, len(st.Images), len(refs), k+1)
			}
			last := 0
			for i, img := range st.Images {
				if img.SHA256 != refs[i] {
					t.Errorf("%s step %d image %d: %s listed, %s in the messages", a.RolloutID, k, i, img.SHA256, refs[i])
				}
				mu.Lock()
				sent := received[img.SHA256]
				mu.Unlock()
				if !sent {
					t.Errorf("%s step %d image %d: %s is not an image the server received", a.RolloutID, k, i, img.SHA256)
				}
				data, _, err := s.Blob(img.SHA256)
				if err != nil || img.Bytes != len(data) || img.Width != testWidth || img.Height != testHeight {
					t.Errorf("%s step %d image %d: %d bytes %dx%d (%v); want the blob's %d bytes, %dx%d", a.RolloutID, k, i, img.Bytes, img.Width, img.Height, err, len(data), testWidth, testHeight)
				}
				sp := img.TokenSpan
				if sp == nil || sp[0] < last || sp[1]-sp[0] != policytest.DefaultImageTokens {
					t.Fatalf("%s step %d image %d: span %v; want %d image tokens after %d", a.RolloutID, k, i, sp, policytest.DefaultImageTokens, last)
				}
				for _, id := range st.PromptTokenIDs[sp[0]:sp[1]] {
					if id != DefaultImageTokenID {
						t.Fatalf("%s step %d image %d: id %d in its span", a.RolloutID, k, i, id)
					}
				}
				last = sp[1]
			}
		}
	}
	if steps != 6 {
		t.Fatalf("%d steps; want 2 attempts of 3", steps)
	}

	prefix, err := s.Result(info.ID, ResultOptions{Steps: StepsPrefix})
	if err != nil {
		t.Fatal(err)
	}
	for i, a := range prefix.Attempts {
		var msgs []schema.Message
		var ids []int64
		for k, st := range a.Steps {
			want := full.Attempts[i].Steps[k]
			if k == 0 && (st.PromptPrefixMessages != 0 || st.PromptPrefixIDs != 0) {
				t.Errorf("%s step 0 has a prefix", a.RolloutID)
			}
			if k > 0 && (st.PromptPrefixMessages == 0 || st.PromptPrefixIDs == 0) {
				t.Errorf("%s step %d: prefix of %d messages, %d ids; want the step before's", a.RolloutID, k, st.PromptPrefixMessages, st.PromptPrefixIDs)
			}
			msgs = append(slices.Clone(msgs[:st.PromptPrefixMessages]), st.Messages...)
			ids = append(slices.Clone(ids[:st.PromptPrefixIDs]), st.PromptTokenIDs...)
			got, _ := json.Marshal(msgs)
			exp, _ := json.Marshal(want.Messages)
			if string(got) != string(exp) || !slices.Equal(ids, want.PromptTokenIDs) {
				t.Errorf("%s step %d: the prefix shape does not rebuild the whole prompt", a.RolloutID, k)
			}
		}
	}

	none, err := s.Result(info.ID, ResultOptions{Steps: StepsNone})
	if err != nil {
		t.Fatal(err)
	}
	for i, a := range none.Attempts {
		if len(a.Steps) != 0 || a.Reward == nil || a.Advantage == nil || *a.Advantage != *full.Attempts[i].Advantage {
			t.Errorf("steps=none: attempt %d has %d steps, reward %v, advantage %v; want no steps and the outcome", i, len(a.Steps), a.Reward, a.Advantage)
		}
	}
	noneJSON, _ := json.Marshal(none)
	fullJSON, _ := json.Marshal(full)
	t.Logf("a group of 2 attempts of 3 steps: %d bytes with steps=none, %d with full", len(noneJSON), len(fullJSON))

	once, err := s.Result(info.ID, ResultOptions{AttemptImages: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range once.Attempts {
		for _, st := range a.Steps {
			for _, img := range st.Images {
				url, ok := a.Images[img.SHA256]
				data, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(url, "data:image/png;base64,"))
				sum := sha256.Sum256(data)
				if !ok || err != nil || hex.EncodeToString(sum[:]) != img.SHA256 {
					t.Errorf("%s: image %s not in the attempt's images as its bytes", a.RolloutID, img.SHA256)
				}
			}
		}
		if len(a.Images) != len(a.Steps) {
			t.Errorf("%s: %d images once each; want one per step's new screen, %d", a.RolloutID, len(a.Images), len(a.Steps))
		}
	}
}

// TestServiceResultImagesAreExports: a result's steps list the images an
// export of the service's run directory lists for the same steps, spans
// included, whether the result inlines its images or trims its steps.
func TestServiceResultImagesAreExports(t *testing.T) {
	e := newServiceEnv(t, policytest.Options{Script: clicksThenDone(2)})
	e.opts.Group = 2
	s := e.serve(t)
	defer s.Close(context.Background())
	info := submitClosed(t, s, GroupRequest{Task: inlineTask(1)})
	out := filepath.Join(t.TempDir(), "train.jsonl")
	if _, err := export.ExportSteps(e.opts.Out, out, export.Options{}); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	exported := map[string][]StepImage{}
	for _, line := range bytes.Split(bytes.TrimSpace(data), []byte("\n")) {
		var smp struct {
			RolloutID string      `json:"rollout_id"`
			Step      int         `json:"step"`
			Images    []StepImage `json:"images"`
		}
		if err := json.Unmarshal(line, &smp); err != nil {
			t.Fatal(err)
		}
		exported[fmt.Sprint(smp.RolloutID, "/", smp.Step)] = smp.Images
	}
	for _, opts := range []ResultOptions{{}, {Steps: StepsPrefix, InlineImages: true}} {
		res, err := s.Result(info.ID, opts)
		if err != nil {
			t.Fatal(err)
		}
		steps := 0
		for _, a := range res.Attempts {
			for _, st := range a.Steps {
				steps++
				want, ok := exported[fmt.Sprint(a.RolloutID, "/", st.Step)]
				if !ok {
					t.Fatalf("%+v: %s step %d is not in the export", opts, a.RolloutID, st.Step)
				}
				if len(st.Images) == 0 || st.Images[0].TokenSpan == nil {
					t.Fatalf("%+v: %s step %d: images %+v; want the screens with their spans", opts, a.RolloutID, st.Step, st.Images)
				}
				if diff := cmp.Diff(want, st.Images); diff != "" {
					t.Errorf("%+v: %s step %d images (-export +result):\n%s", opts, a.RolloutID, st.Step, diff)
				}
			}
		}
		if steps != len(exported) {
			t.Errorf("%+v: %d steps in the result, %d in the export", opts, steps, len(exported))
		}
	}
}

// submitClosed submits req to s and waits until its group closed.
func submitClosed(t *testing.T, s *Service, req GroupRequest) GroupInfo {
	t.Helper()
	info, _, err := s.Submit(req)
	if err != nil {
		t.Fatal(err)
	}
	if info := waitEnded(t, s, info.ID); info.State != GroupClosed {
		t.Fatalf("group %s", info.State)
	}
	return info
}
