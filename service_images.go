package rl

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"image/png"
	"strings"

	"legato/rl/schema"
)

// DefaultImageTokenID is the token id a Qwen2-VL, Qwen2.5-VL or Qwen3-VL
// processor expands each image into (<|image_pad|>), repeated once per
// merged patch: the runs of it in a prompt's ids are its images' spans.
const DefaultImageTokenID = 151655

// StepImage is one image of a step's prompt, in the order the prompt holds
// them: what a trainer needs to feed its vision encoder the pixels the
// model server saw.
type StepImage struct {
	// SHA256 names the PNG in the run's store (GET /v1/blobs/{sha256}):
	// the exact bytes sent to the server.
	SHA256 string `json:"sha256"`
	// Bytes, Width and Height are the PNG's size as sent.
	Bytes  int `json:"bytes"`
	Width  int `json:"width"`
	Height int `json:"height"`
	// TokenSpan is [start, end) of the image's placeholder tokens in the
	// step's prompt token ids, as the server expanded them; absent when
	// the ids do not say (no ids, or runs of the image token that do not
	// match the images one for one).
	TokenSpan *[2]int `json:"token_span,omitempty"`
}

// imageSizes describes the images of one group's result, each once: a
// step's prompt holds the screenshots of the steps before it, so an
// attempt of n steps names its images n(n+1)/2 times, and each would be
// read, hashed and decoded again.
type imageSizes struct {
	store *schema.MessageStore
	seen  map[string]StepImage // by the URL a message part holds
}

// stepImages lists the images of msgs in order, with their sizes and, when
// ids holds one run of imageToken per image, their spans.
func (is *imageSizes) stepImages(msgs []schema.Message, ids []int64, imageToken int64) ([]StepImage, error) {
	var out []StepImage
	for _, m := range msgs {
		for _, p := range m.Content {
			if p.ImageURL == nil {
				continue
			}
			img, ok := is.seen[p.ImageURL.URL]
			if !ok {
				var err error
				if img, err = imageOf(is.store, p.ImageURL.URL); err != nil {
					return nil, err
				}
				is.seen[p.ImageURL.URL] = img
			}
			out = append(out, img)
		}
	}
	spans := tokenRuns(ids, imageToken)
	if len(spans) == len(out) {
		for i := range out {
			out[i].TokenSpan = &spans[i]
		}
	}
	return out, nil
}

// imageOf describes the image a message part names: a store reference or
// an inlined data URL.
func imageOf(store *schema.MessageStore, url string) (StepImage, error) {
	var data []byte
	var err error
	sha, isRef := strings.CutPrefix(url, schema.ImageScheme)
	switch b64, isData := strings.CutPrefix(url, "data:image/png;base64,"); {
	case isRef:
		// The store checks the bytes against the hash they are named by.
		data, err = store.ImagePNG(sha)
	case isData:
		if data, err = base64.StdEncoding.DecodeString(b64); err == nil {
			sha = pngHash(data)
		}
	default:
		return StepImage{}, fmt.Errorf("image %.40q: neither a %s reference nor a PNG data URL", url, schema.ImageScheme)
	}
	if err != nil {
		return StepImage{}, err
	}
	cfg, err := png.DecodeConfig(bytes.NewReader(data))
	if err != nil {
		return StepImage{}, fmt.Errorf("image %s: %w", sha, err)
	}
	return StepImage{SHA256: sha, Bytes: len(data), Width: cfg.Width, Height: cfg.Height}, nil
}

func pngHash(data []byte) string {
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

// tokenRuns returns the [start, end) of each maximal run of tok in ids.
func tokenRuns(ids []int64, tok int64) [][2]int {
	var runs [][2]int
	for i := 0; i < len(ids); i++ {
		if ids[i] != tok {
			continue
		}
		j := i
		for j < len(ids) && ids[j] == tok {
			j++
		}
		runs = append(runs, [2]int{i, j})
		i = j
	}
	return runs
}
