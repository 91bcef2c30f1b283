package schema

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// pngSignature starts every PNG file.
var pngSignature = []byte("\x89PNG\r\n\x1a\n")

// pngDataURLPrefix is the only data URL form the store accepts.
const pngDataURLPrefix = "data:image/png;base64,"

// PutMessages stores msgs in the run's content store and returns their
// hashes, in order, for Step.Request. msgs is not modified. Messages and
// images already stored cost a hash and no disk access, so callers pass the
// whole prompt of every step. Each new object appears complete (a whole
// pack entry, an image renamed into place) but is not synced: the next
// Append syncs it before writing its record, so the step path pays no
// fsync. Objects are durable once a later Append (or Close) returns.
//
// The content store keeps each distinct message of a run once, so storage
// grows with the number of steps, not with the square of the history:
//
//	messages/pack-<n>      entries of zstd frames of messages' canonical JSON (see packWriter)
//	images/<sha256>.png    the PNG bytes of an image
//
// Runs written before packs hold each message as messages/<sha256>, the
// same zstd frame; readers take both.
//
// A message's canonical JSON is encoding/json.Marshal of the Message after
// every image data URL has been replaced by ImageScheme + the sha256 (hex)
// of its PNG bytes. Marshal is deterministic (fields in struct order, no
// spaces, HTML characters escaped), so equal messages get equal hashes; the
// hash of a message is the sha256 (hex) of its canonical JSON. Text is
// stored as encoding/json writes it: invalid UTF-8 becomes U+FFFD.
//
// Images must be PNG data URLs (data:image/png;base64,...): screenshots are
// PNG, and one format keeps the reference free of a media type. Other data
// URLs fail with ErrBadImage. URLs that are not data URLs (https://...) are
// kept as they are. A part that already holds an ImageScheme reference (a
// message loaded with KeepImageRefs) is kept if the image is in the store.
func (r *Run) PutMessages(msgs []Message) ([]string, error) {
	r.life.RLock()
	defer r.life.RUnlock()
	if r.closed {
		return nil, ErrClosed
	}
	hashes := make([]string, len(msgs))
	for i := range msgs {
		h, err := r.putMessage(&msgs[i])
		if err != nil {
			return nil, fmt.Errorf("put messages: message %d: %w", i, err)
		}
		hashes[i] = h
	}
	return hashes, nil
}

func (r *Run) putMessage(m *Message) (string, error) {
	stored, err := r.withImageRefs(m)
	if err != nil {
		return "", err
	}
	canon, err := json.Marshal(stored)
	if err != nil {
		return "", &ObjectError{Op: "put", Kind: "message", Err: err}
	}
	sum := sha256.Sum256(canon)
	h := hex.EncodeToString(sum[:])
	if _, ok := r.msgs.Load(sum); ok {
		return h, nil
	}
	// singleflight: workers sharing a history write each new message once.
	_, err, _ = r.flight.Do("m"+h, func() (any, error) {
		if _, ok := r.msgs.Load(sum); ok {
			return nil, nil
		}
		if err := r.msgPack.put(sum, r.enc.EncodeAll(canon, nil)); err != nil {
			return nil, err
		}
		r.msgs.Store(sum, struct{}{})
		return nil, nil
	})
	if err != nil {
		return "", &ObjectError{Op: "put", Kind: "message", Hash: h, Err: err}
	}
	return h, nil
}

// withImageRefs returns m with its image data URLs stored and replaced by
// references. m's parts are copied only when one changes.
func (r *Run) withImageRefs(m *Message) (Message, error) {
	out := *m
	copied := false
	for i, p := range m.Content {
		if p.ImageURL == nil {
			continue
		}
		url := p.ImageURL.URL
		var ref string
		switch {
		case strings.HasPrefix(url, "data:"):
			h, err := r.putImage(url)
			if err != nil {
				return Message{}, fmt.Errorf("part %d: %w", i, err)
			}
			ref = ImageScheme + h
		case strings.HasPrefix(url, ImageScheme):
			if err := r.checkImageRef(url); err != nil {
				return Message{}, fmt.Errorf("part %d: %w", i, err)
			}
			continue
		default:
			continue
		}
		if !copied {
			out.Content = slices.Clone(m.Content)
			copied = true
		}
		out.Content[i].ImageURL = &ImageURL{URL: ref}
	}
	return out, nil
}

// putImage stores the PNG of a data URL and returns its hash.
func (r *Run) putImage(url string) (string, error) {
	buf, _ := r.scratch.Get().(*imageScratch)
	if buf == nil {
		buf = new(imageScratch)
	}
	defer r.scratch.Put(buf)
	png, err := buf.decodePNGDataURL(url)
	if err != nil {
		return "", &ObjectError{Op: "put", Kind: "image", Err: err}
	}
	sum := sha256.Sum256(png)
	h := hex.EncodeToString(sum[:])
	if _, ok := r.imgs.Load(sum); ok {
		return h, nil
	}
	// The write finishes before Do returns, so png (scratch memory) is not
	// used after buf goes back to the pool.
	_, err, _ = r.flight.Do("i"+h, func() (any, error) {
		if _, ok := r.imgs.Load(sum); ok {
			return nil, nil
		}
		if err := r.writeObject(r.imgDir, h+".png", storedObject{&r.imgs, sum}, png); err != nil {
			return nil, err
		}
		r.imgs.Store(sum, struct{}{})
		return nil, nil
	})
	if err != nil {
		return "", &ObjectError{Op: "put", Kind: "image", Hash: h, Err: err}
	}
	return h, nil
}

// checkImageRef reports an error unless ref names an image in the store.
func (r *Run) checkImageRef(ref string) error {
	h := strings.TrimPrefix(ref, ImageScheme)
	sum, err := parseHash(h)
	if err != nil {
		return &ObjectError{Op: "put", Kind: "image", Err: fmt.Errorf("reference %q: %w", ref, err)}
	}
	if _, ok := r.imgs.Load(sum); ok {
		return nil
	}
	path := filepath.Join(r.imgDir, h+".png")
	fi, err := os.Stat(path)
	if err != nil || !fi.Mode().IsRegular() {
		return &ObjectError{Op: "put", Kind: "image", Hash: h, Err: fmt.Errorf("%w: a reference must name an image of this run", ErrNotFound)}
	}
	// An earlier process may have died before syncing it.
	r.markUnsynced(path, storedObject{&r.imgs, sum})
	r.imgs.Store(sum, struct{}{})
	return nil
}

// writeObject stores a content-addressed file without syncing it: the next
// commit does (see Append), off the step path. Concurrent writers of the
// same name are safe: each renames a complete file with the same content
// over the name. A file left under the name by an earlier process is
// replaced, not trusted: that process may have died before syncing it, and
// a power loss after that could have left it short.
func (r *Run) writeObject(dir, name string, obj storedObject, data []byte) error {
	if _, err := writeAtomic(filepath.Join(dir, name), tempPrefix, false, writeBytes(data)); err != nil {
		return err
	}
	r.markUnsynced(filepath.Join(dir, name), obj)
	return nil
}

// imageScratch holds the buffers of one image decode. Every prompt repeats
// its history's screenshots (about 1 MB each), so reusing them keeps a step
// from allocating memory per screenshot it has already stored.
type imageScratch struct {
	src []byte // the base64 payload: base64.Decode wants bytes, not a string
	dst []byte // the PNG
}

// decodePNGDataURL returns the PNG bytes of a data:image/png;base64 URL,
// in buf's memory.
func (buf *imageScratch) decodePNGDataURL(url string) ([]byte, error) {
	meta, payload, ok := strings.Cut(strings.TrimPrefix(url, "data:"), ",")
	if !ok {
		return nil, fmt.Errorf("%w: data URL without a comma", ErrBadImage)
	}
	mediaType, params, _ := strings.Cut(meta, ";")
	if !strings.EqualFold(mediaType, "image/png") {
		if mediaType == "" {
			mediaType = "no media type"
		}
		return nil, fmt.Errorf("%w: %s data URL: the store keeps PNG only, encode images as PNG", ErrBadImage, mediaType)
	}
	if !slices.Contains(strings.Split(params, ";"), "base64") {
		return nil, fmt.Errorf("%w: PNG data URL is not base64 (want %s...)", ErrBadImage, pngDataURLPrefix)
	}
	buf.src = append(buf.src[:0], payload...)
	buf.dst = slices.Grow(buf.dst[:0], base64.StdEncoding.DecodedLen(len(buf.src)))
	n, err := base64.StdEncoding.Decode(buf.dst[:cap(buf.dst)], buf.src)
	if err != nil {
		return nil, fmt.Errorf("%w: PNG data URL: %v", ErrBadImage, err)
	}
	png := buf.dst[:n]
	if !bytes.HasPrefix(png, pngSignature) {
		return nil, fmt.Errorf("%w: data URL says image/png but the bytes are not a PNG", ErrBadImage)
	}
	return png, nil
}

// parseHash parses a 64-digit lowercase hex sha256. Hashes come from files
// that may be damaged, and name paths, so nothing else is accepted.
func parseHash(h string) ([32]byte, error) {
	// By hand, not hex.Decode: a store reads a hash for every token chunk
	// of every step, and []byte(h) and the case check allocated.
	var sum [32]byte
	if len(h) != 64 {
		return sum, fmt.Errorf("%w: %q", ErrBadHash, truncate(h, 80))
	}
	for i := range sum {
		hi, ok1 := lowerHex(h[2*i])
		lo, ok2 := lowerHex(h[2*i+1])
		if !ok1 || !ok2 {
			return [32]byte{}, fmt.Errorf("%w: %q", ErrBadHash, truncate(h, 80))
		}
		sum[i] = hi<<4 | lo
	}
	return sum, nil
}

// lowerHex is the value of a lower-case hex digit.
func lowerHex(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	}
	return 0, false
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// hashImageRef returns the hash of an ImageScheme reference.
func hashImageRef(url string) (string, [32]byte, error) {
	h, ok := strings.CutPrefix(url, ImageScheme)
	if !ok {
		return "", [32]byte{}, errors.New("not an image reference")
	}
	sum, err := parseHash(h)
	return h, sum, err
}
