package schema

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/klauspost/compress/zstd"
)

// Default cache sizes of a MessageStore.
const (
	// DefaultMessageCacheBytes holds the distinct messages of thousands of
	// steps: a message without images is a few KB of JSON.
	DefaultMessageCacheBytes = 64 << 20
	// DefaultImageCacheBytes holds the inlined screenshots of several
	// rollouts (about 1–2 MB each as a data URL), so exporting the steps of a
	// rollout reads and encodes each screenshot once.
	DefaultImageCacheBytes = 256 << 20
	// DefaultTokenCacheBytes holds the prompt token chunks of a few
	// rollouts (8 bytes an id), which their steps share.
	DefaultTokenCacheBytes = 32 << 20
)

// StoreOptions tunes a MessageStore. The zero value is ready to use.
type StoreOptions struct {
	// MessageCacheBytes bounds the cache of decoded messages, in bytes of
	// canonical JSON. 0 means DefaultMessageCacheBytes; negative disables it.
	MessageCacheBytes int64
	// ImageCacheBytes bounds the cache of images as data URLs, in bytes. 0
	// means DefaultImageCacheBytes; negative disables it.
	ImageCacheBytes int64
	// TokenCacheBytes bounds the cache of prompt token chunks, at 8 bytes
	// an id. 0 means DefaultTokenCacheBytes; negative disables it.
	TokenCacheBytes int64
}

// LoadOptions says how to rebuild messages.
type LoadOptions struct {
	// KeepImageRefs leaves images as legato-image://<sha256> references
	// (see MessageStore.ImagePNG) instead of inlining them as PNG data URLs.
	KeepImageRefs bool
}

// MessageStore reads messages and images from a run's content store.
// Every object is checked against its hash. Repeated loads, such as every
// step of a rollout sharing its history, are served from bounded caches.
// A MessageStore is safe for concurrent use.
type MessageStore struct {
	msgDir string
	imgDir string
	tokDir string

	// life is held shared by every load and exclusively by Close: the
	// decoder must not be used after it is closed.
	life   sync.RWMutex
	closed bool
	dec    *zstd.Decoder // DecodeAll only: safe for concurrent use

	// msgPacks and tokPacks find objects in packs; objects in none are
	// loose files (see packWriter).
	msgPacks, tokPacks *packIndex

	msgs *lru[[32]byte, Message]     // image references kept
	raws *lru[[32]byte, []byte]      // messages' canonical JSON
	imgs *lru[[32]byte, string]      // PNG data URLs
	toks *lru[[32]byte, storedChunk] // prompt token chunks
}

// OpenMessageStore opens the content store of the run directory runDir for
// reading. It may be used while a Run writes to the same directory.
func OpenMessageStore(runDir string, opts StoreOptions) (*MessageStore, error) {
	s := &MessageStore{
		msgDir: filepath.Join(runDir, MessagesDir),
		imgDir: filepath.Join(runDir, ImagesDir),
		tokDir: filepath.Join(runDir, TokensDir),
		msgs:   newLRU[[32]byte, Message](orDefault(opts.MessageCacheBytes, DefaultMessageCacheBytes)),
		raws:   newLRU[[32]byte, []byte](orDefault(opts.MessageCacheBytes, DefaultMessageCacheBytes)),
		imgs:   newLRU[[32]byte, string](orDefault(opts.ImageCacheBytes, DefaultImageCacheBytes)),
		toks:   newLRU[[32]byte, storedChunk](orDefault(opts.TokenCacheBytes, DefaultTokenCacheBytes)),
	}
	// A disabled cache rereads every object from the disk: its pack
	// windows are disabled with it.
	s.msgPacks = newPackIndex(s.msgDir, opts.MessageCacheBytes >= 0)
	s.tokPacks = newPackIndex(s.tokDir, opts.TokenCacheBytes >= 0)
	fi, err := os.Stat(s.msgDir)
	if err != nil {
		return nil, fmt.Errorf("open message store: %w", err)
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("open message store: %s is not a directory", s.msgDir)
	}
	// A message is at most a few MB; the bound stops a damaged file from
	// claiming memory for a huge frame.
	s.dec, err = zstd.NewReader(nil, zstd.WithDecoderMaxMemory(MaxRecordBytes))
	if err != nil {
		return nil, fmt.Errorf("open message store: zstd: %w", err)
	}
	return s, nil
}

func orDefault(v, def int64) int64 {
	if v == 0 {
		return def
	}
	return v
}

// Close releases the store. Later loads return ErrClosed.
func (s *MessageStore) Close() error {
	s.life.Lock()
	defer s.life.Unlock()
	if !s.closed {
		s.closed = true
		s.dec.Close()
		s.msgPacks.close()
		s.tokPacks.close()
	}
	return nil
}

// LoadRequest rebuilds the exact prompt of step from the content store of
// the run directory runDir. To load many steps, use one MessageStore.
func LoadRequest(runDir string, step Step, opts LoadOptions) ([]Message, error) {
	s, err := OpenMessageStore(runDir, StoreOptions{})
	if err != nil {
		return nil, err
	}
	defer s.Close()
	return s.LoadRequest(step, opts)
}

// LoadRequest rebuilds the exact prompt of step.
func (s *MessageStore) LoadRequest(step Step, opts LoadOptions) ([]Message, error) {
	return s.Messages(step.Request, opts)
}

// Messages loads the messages with the given hashes, in order.
func (s *MessageStore) Messages(hashes []string, opts LoadOptions) ([]Message, error) {
	s.life.RLock()
	defer s.life.RUnlock()
	if s.closed {
		return nil, ErrClosed
	}
	out := make([]Message, len(hashes))
	for i, h := range hashes {
		m, err := s.message(h)
		if err == nil && !opts.KeepImageRefs {
			err = s.inlineImages(&m)
		}
		if err != nil {
			return nil, fmt.Errorf("load request: message %d: %w", i, err)
		}
		out[i] = m
	}
	return out, nil
}

// Message loads one message with its images left as references.
func (s *MessageStore) Message(hash string) (Message, error) {
	s.life.RLock()
	defer s.life.RUnlock()
	if s.closed {
		return Message{}, ErrClosed
	}
	return s.message(hash)
}

// message returns a copy of a stored message that the caller may modify.
func (s *MessageStore) message(hash string) (Message, error) {
	sum, err := parseHash(hash)
	if err != nil {
		return Message{}, &ObjectError{Op: "load", Kind: "message", Err: err}
	}
	m, ok := s.msgs.get(sum)
	if !ok {
		var cost int64
		m, cost, err = s.readMessage(hash, sum)
		if err != nil {
			return Message{}, &ObjectError{Op: "load", Kind: "message", Hash: hash, Err: err}
		}
		s.msgs.put(sum, m, cost)
	}
	return cloneMessage(m), nil
}

// MessageJSON returns the canonical JSON of the message hash (see
// Run.PutMessages: encoding/json's, HTML characters escaped, images as
// references), checked against its hash. The bytes are shared: the caller
// must not modify them. An export writes messages from it without
// decoding them (its JSON leaves HTML characters unescaped).
func (s *MessageStore) MessageJSON(hash string) ([]byte, error) {
	return load(s, "message", hash, func(sum [32]byte) ([]byte, error) {
		if b, ok := s.raws.get(sum); ok {
			return b, nil
		}
		b, err := s.readCanonical(hash, sum)
		if err == nil {
			s.raws.put(sum, b, int64(len(b)))
		}
		return b, err
	})
}

// load is what loading one object of kind from an open store takes: its
// hash parsed, read (from a cache or the disk), and an error naming both.
func load[T any](s *MessageStore, kind, hash string, read func(sum [32]byte) (T, error)) (T, error) {
	var zero T
	s.life.RLock()
	defer s.life.RUnlock()
	if s.closed {
		return zero, ErrClosed
	}
	sum, err := parseHash(hash)
	if err != nil {
		return zero, &ObjectError{Op: "load", Kind: kind, Err: err}
	}
	v, err := read(sum)
	if err != nil {
		return zero, &ObjectError{Op: "load", Kind: kind, Hash: hash, Err: err}
	}
	return v, nil
}

// readCanonical reads the canonical JSON of a message from the disk.
func (s *MessageStore) readCanonical(hash string, sum [32]byte) ([]byte, error) {
	scratch := getScratch()
	defer putScratch(scratch)
	b, err := readObject(s.msgPacks, s.msgDir, hash, sum, scratch.stored[:0])
	scratch.stored = b
	if err != nil {
		return nil, err
	}
	canon, err := s.dec.DecodeAll(b, nil) // kept in the cache
	if err != nil {
		return nil, fmt.Errorf("%w: zstd: %v", ErrCorrupt, err)
	}
	if sha256.Sum256(canon) != sum {
		return nil, fmt.Errorf("%w: content does not match its hash", ErrCorrupt)
	}
	return canon, nil
}

func (s *MessageStore) readMessage(hash string, sum [32]byte) (Message, int64, error) {
	canon, err := s.readCanonical(hash, sum)
	if err != nil {
		return Message{}, 0, err
	}
	var m Message
	if err := json.Unmarshal(canon, &m); err != nil {
		return Message{}, 0, fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	return m, int64(len(canon)), nil
}

// inlineImages replaces m's image references by PNG data URLs. m must be a
// copy owned by the caller.
func (s *MessageStore) inlineImages(m *Message) error {
	for i, p := range m.Content {
		if p.ImageURL == nil || !strings.HasPrefix(p.ImageURL.URL, ImageScheme) {
			continue
		}
		h, sum, err := hashImageRef(p.ImageURL.URL)
		if err != nil {
			return &ObjectError{Op: "load", Kind: "image", Err: err}
		}
		url, ok := s.imgs.get(sum)
		if !ok {
			png, err := s.readImage(h, sum)
			if err != nil {
				return &ObjectError{Op: "load", Kind: "image", Hash: h, Err: err}
			}
			url = pngDataURLPrefix + base64.StdEncoding.EncodeToString(png)
			s.imgs.put(sum, url, int64(len(url)))
		}
		m.Content[i].ImageURL.URL = url
	}
	return nil
}

// ImagePNG returns the PNG bytes of the image with the given hash (the part
// of a legato-image:// reference after the scheme).
func (s *MessageStore) ImagePNG(hash string) ([]byte, error) {
	return load(s, "image", hash, func(sum [32]byte) ([]byte, error) { return s.readImage(hash, sum) })
}

// ImageHead reads the first len(head) bytes of the image with the given
// hash into head (fewer when the file is shorter) and returns how many it
// read and the image's size in bytes, without reading the rest or checking
// it against its hash: what a PNG header says (its width and height) is
// worth an open and a small read, where ImagePNG reads and hashes the
// whole screenshot. The name is the hash of the bytes the store was given
// (Run.PutMessages names each image by the sha256 of its PNG), which
// ImagePNG checks on every read.
func (s *MessageStore) ImageHead(hash string, head []byte) (n int, size int64, err error) {
	type result struct {
		n    int
		size int64
	}
	r, err := load(s, "image", hash, func([32]byte) (result, error) {
		n, size, err := readHead(filepath.Join(s.imgDir, hash+".png"), head)
		return result{n, size}, notFound(err)
	})
	return r.n, r.size, err
}

func (s *MessageStore) readImage(hash string, sum [32]byte) ([]byte, error) {
	png, err := os.ReadFile(filepath.Join(s.imgDir, hash+".png"))
	if err != nil {
		return nil, notFound(err)
	}
	if sha256.Sum256(png) != sum {
		return nil, fmt.Errorf("%w: content does not match its hash", ErrCorrupt)
	}
	return png, nil
}

// notFound adds ErrNotFound to a missing file's error.
func notFound(err error) error {
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%w: %w", ErrNotFound, err)
	}
	return err
}

// cloneMessage copies the parts of m, so callers can change a message
// without changing the cache.
func cloneMessage(m Message) Message {
	if m.Content == nil {
		return m
	}
	parts := make([]Part, len(m.Content))
	for i, p := range m.Content {
		if p.ImageURL != nil {
			u := *p.ImageURL
			p.ImageURL = &u
		}
		parts[i] = p
	}
	m.Content = parts
	return m
}

// decodeScratch holds an object's stored bytes and decoded content while
// they are decoded, for the next object to use: allocating both anew was a
// third of the memory a contiguous export allocated.
type decodeScratch struct {
	stored, content []byte
}

var decodeScratches = sync.Pool{New: func() any { return new(decodeScratch) }}

func getScratch() *decodeScratch { return decodeScratches.Get().(*decodeScratch) }

// putScratch gives s back unless it grew past what small objects need (a
// large object's memory is not kept for the next).
func putScratch(s *decodeScratch) {
	if cap(s.stored) <= 1<<20 && cap(s.content) <= 1<<20 {
		decodeScratches.Put(s)
	}
}

// readObject returns the stored data of a message or token chunk: its
// entry in the packs as indexed (at the first read, then as of the last
// refresh), its loose file (a run written before packs), or its entry in
// what the packs gained since (a Run writing meanwhile). The packs are
// read again only when both miss, so a run of loose files does not list
// its directory per object.
//
// A packed object is appended to dst; a loose one is read into memory of
// its own.
func readObject(packs *packIndex, dir, hash string, sum [32]byte, dst []byte) ([]byte, error) {
	if b, ok, err := packs.get(sum, dst); ok {
		return b, err
	}
	b, lerr := os.ReadFile(filepath.Join(dir, hash))
	if lerr == nil || !errors.Is(lerr, fs.ErrNotExist) {
		return b, notFound(lerr)
	}
	if err := packs.refresh(); err != nil {
		return nil, err
	}
	if b, ok, err := packs.get(sum, dst); ok {
		return b, err
	}
	return nil, notFound(lerr)
}
