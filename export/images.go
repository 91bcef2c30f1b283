package export

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"strconv"
	"strings"

	"legato/rl/schema"
)

// This file holds the images of a prompt as a sample lists them
// (StepImage): which screenshots, their sizes, and where their tokens are
// in the prompt's ids. legato rl serve lists a result's step images with
// the same code, so that a service and an export cannot disagree.

// DefaultImageTokenID is the token id a Qwen2-VL, Qwen2.5-VL or Qwen3-VL
// processor expands each image into (<|image_pad|>), repeated once per
// merged patch: the runs of it in a prompt's ids are its images' spans.
const DefaultImageTokenID = 151655

// StepImage is one image of a prompt, in the order the prompt holds them:
// what a trainer needs to feed its vision encoder the pixels the model
// server saw, lined up with their tokens.
type StepImage struct {
	// SHA256 names the PNG in the run's store (images/<sha256>.png, GET
	// /v1/blobs/{sha256} of legato rl serve): the exact bytes sent to
	// the server.
	SHA256 string `json:"sha256"`
	// Bytes, Width and Height are the PNG's size as sent.
	Bytes  int `json:"bytes"`
	Width  int `json:"width"`
	Height int `json:"height"`
	// TokenSpan is [start, end) of the image's placeholder tokens in the
	// prompt's token ids (a contiguous sample's: its sequence's), as the
	// server expanded them; absent when the ids do not say (no ids, or
	// runs of the image token that do not match the images one for one).
	TokenSpan *[2]int `json:"token_span,omitempty"`
}

// pngHeadBytes is how much of a PNG holds its size: the signature, then
// the IHDR chunk (length, type, 13 bytes of data, CRC).
const pngHeadBytes = 8 + 4 + 4 + 13 + 4

var pngSignature = []byte("\x89PNG\r\n\x1a\n")

// pngSize returns the width and height a PNG's first pngHeadBytes bytes
// give in its IHDR chunk, checked as a PNG decoder checks them (the
// chunk's CRC, sizes from 1 to 2³¹−1).
func pngSize(head []byte) (width, height int, err error) {
	switch {
	case len(head) < pngHeadBytes:
		return 0, 0, fmt.Errorf("not a PNG: %d bytes, fewer than a PNG header's %d", len(head), pngHeadBytes)
	case !bytes.Equal(head[:8], pngSignature):
		return 0, 0, errors.New("not a PNG: no PNG signature")
	case binary.BigEndian.Uint32(head[8:12]) != 13 || string(head[12:16]) != "IHDR":
		return 0, 0, errors.New("not a PNG: the first chunk is not a 13-byte IHDR")
	case crc32.ChecksumIEEE(head[12:29]) != binary.BigEndian.Uint32(head[29:33]):
		return 0, 0, errors.New("damaged PNG: the IHDR chunk's checksum does not match")
	}
	w, h := binary.BigEndian.Uint32(head[16:20]), binary.BigEndian.Uint32(head[20:24])
	if w == 0 || h == 0 || w > 1<<31-1 || h > 1<<31-1 {
		return 0, 0, fmt.Errorf("damaged PNG: size %dx%d", w, h)
	}
	return int(w), int(h), nil
}

// storedImage describes the stored image hash from its header and its
// file's size, without reading its pixels: an export lists every
// screenshot of every step, and reading and hashing each whole (1–2 MB)
// would make it thirty times slower. The hash is the image's name, which
// the store gives it by its content (schema.Run.PutMessages).
func storedImage(store *schema.MessageStore, hash string) (StepImage, error) {
	var head [pngHeadBytes]byte
	n, size, err := store.ImageHead(hash, head[:])
	if err != nil {
		return StepImage{}, err
	}
	w, h, err := pngSize(head[:n])
	if err != nil {
		return StepImage{}, fmt.Errorf("image %s: %w", hash, err)
	}
	return StepImage{SHA256: hash, Bytes: int(size), Width: w, Height: h}, nil
}

// imageLister lists the images of an attempt's prompts. A step's prompt
// repeats the messages and screenshots of the steps before it, so an
// attempt of n steps names its images n(n+1)/2 times: each message is
// looked into and each image's header read once.
type imageLister struct {
	store  *schema.MessageStore
	token  int64                // the token images expand into
	refs   map[string][]string  // the images' hashes of a message, by its hash
	images map[string]StepImage // by hash
}

func newImageLister(store *schema.MessageStore, token int64) *imageLister {
	if token == 0 {
		token = DefaultImageTokenID
	}
	return &imageLister{store: store, token: token, refs: map[string][]string{}, images: map[string]StepImage{}}
}

// reset forgets the images of the attempt before: the next attempt's are
// others.
func (l *imageLister) reset() {
	clear(l.refs)
	clear(l.images)
}

// list returns the images of the prompt whose messages have the hashes
// request, in order, with their spans in its ids (given as chunks) when
// those hold one run of the image token per image; nil when it has none.
func (l *imageLister) list(request []string, ids [][]int64) ([]StepImage, error) {
	var out []StepImage
	for k, h := range request {
		refs, ok := l.refs[h]
		if !ok {
			var err error
			if refs, err = l.messageImages(h); err != nil {
				return nil, fmt.Errorf("message %d: %w", k, err)
			}
			l.refs[h] = refs
		}
		for _, ref := range refs {
			img, ok := l.images[ref]
			if !ok {
				var err error
				if img, err = storedImage(l.store, ref); err != nil {
					return nil, fmt.Errorf("message %d: %w", k, err)
				}
				l.images[ref] = img
			}
			out = append(out, img)
		}
	}
	if len(out) == 0 {
		return nil, nil
	}
	if spans := tokenRuns(ids, l.token); len(spans) == len(out) {
		for i := range out {
			out[i].TokenSpan = &spans[i]
		}
	}
	return out, nil
}

// imageURLKey is how a part's image starts in a stored message's JSON,
// encoding/json's (schema.Run.PutMessages) of a schema.ImageURL. In that
// JSON a string's quotes are escaped: a key's closing quote followed by a
// colon is never inside a string, so a message without the key has no
// image, and where it is, a part's image URL follows.
var imageURLKey = []byte(`"image_url":`)

// messageImages returns the hashes of the images of the stored message h,
// in order. Every image of a stored message is a reference to the run's
// store (schema.Run.PutMessages stores data URLs); an image given by
// another URL is not one a trainer can be given, and fails.
func (l *imageLister) messageImages(h string) ([]string, error) {
	canon, err := l.store.MessageJSON(h)
	if err != nil {
		return nil, err
	}
	urls, ok := imageURLs(canon)
	if !ok {
		// Not as encoding/json writes a reference: decode it.
		var m schema.Message
		if err := json.Unmarshal(canon, &m); err != nil {
			return nil, fmt.Errorf("message %s: %w", h, err)
		}
		urls = nil
		for _, p := range m.Content {
			if p.ImageURL != nil {
				urls = append(urls, p.ImageURL.URL)
			}
		}
	}
	var refs []string
	for _, url := range urls {
		ref, ok := strings.CutPrefix(url, schema.ImageScheme)
		if !ok {
			return nil, fmt.Errorf("message %s: image %.40q is not a %s reference to the run's store", h, url, schema.ImageScheme)
		}
		refs = append(refs, ref)
	}
	return refs, nil
}

// imageURLs returns the image URLs of a stored message's JSON, in order,
// read where each image_url key is without decoding the message (a
// sixth of the images' cost in an export); ok is false when one is not
// {"url":"..."} with a URL free of escapes, which must then be decoded.
func imageURLs(canon []byte) (urls []string, ok bool) {
	const prefix = `{"url":"`
	for {
		i := bytes.Index(canon, imageURLKey)
		if i < 0 {
			return urls, true
		}
		rest, found := bytes.CutPrefix(canon[i+len(imageURLKey):], []byte(prefix))
		end := bytes.IndexByte(rest, '"')
		if !found || end < 0 || bytes.IndexByte(rest[:end], '\\') >= 0 {
			return nil, false
		}
		urls = append(urls, string(rest[:end]))
		canon = rest[end:]
	}
}

// tokenRuns returns the [start, end) of each maximal run of tok in the
// ids given as chunks (a run may cross chunks).
func tokenRuns(chunks [][]int64, tok int64) [][2]int {
	var runs [][2]int
	at, start := 0, -1 // start: where the run being read began, -1 for none
	for _, c := range chunks {
		for i, id := range c {
			switch {
			case id == tok && start < 0:
				start = at + i
			case id != tok && start >= 0:
				runs = append(runs, [2]int{start, at + i})
				start = -1
			}
		}
		at += len(c)
	}
	if start >= 0 {
		runs = append(runs, [2]int{start, at})
	}
	return runs
}

// appendImages appends imgs as encoding/json writes them (TestAppendTail).
func appendImages(b []byte, imgs []StepImage) []byte {
	if imgs == nil {
		return append(b, "null"...)
	}
	b = append(b, '[')
	for i := range imgs {
		img := &imgs[i]
		if i > 0 {
			b = append(b, ',')
		}
		// A hash is hex (schema's parseHash refused any other).
		b = append(b, `{"sha256":"`...)
		b = append(b, img.SHA256...)
		b = append(b, `","bytes":`...)
		b = strconv.AppendInt(b, int64(img.Bytes), 10)
		b = append(b, `,"width":`...)
		b = strconv.AppendInt(b, int64(img.Width), 10)
		b = append(b, `,"height":`...)
		b = strconv.AppendInt(b, int64(img.Height), 10)
		if sp := img.TokenSpan; sp != nil {
			b = append(b, `,"token_span":[`...)
			b = strconv.AppendInt(b, int64(sp[0]), 10)
			b = append(b, ',')
			b = strconv.AppendInt(b, int64(sp[1]), 10)
			b = append(b, ']')
		}
		b = append(b, '}')
	}
	return append(b, ']')
}
