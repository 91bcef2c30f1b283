package vm

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"html"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/digitalocean/go-libvirt"
)

// Roles of the files a VM boots from.
const (
	RoleBase   = "base"
	RoleKernel = "kernel"
	RoleInitrd = "initrd"
)

// ImageFile is a local file VMs boot from (Config.BaseImage, Kernel,
// Initrd), which every host holds as a volume of its storage pool named
// after the file's content.
type ImageFile struct {
	// Role is RoleBase, RoleKernel or RoleInitrd.
	Role string
	// Path is the local file.
	Path string
	// Size is its length in bytes, SHA256 its content's hash (hex).
	Size   int64
	SHA256 string
}

// Volume is the name of the file's volume on every host: the role and the
// start of the content hash, so different images live side by side and a
// new image never changes the file under an old batch's overlays.
func (f ImageFile) Volume() string {
	n := "legato-" + f.Role + "-" + f.SHA256[:16]
	if f.Role == RoleBase {
		n += ".qcow2"
	}
	return n
}

// marker is the name of the empty volume made once an upload is complete:
// it holds the file's full hash in its name, so a volume without it (an
// upload cut off) does not count, and checking it needs no download.
func (f ImageFile) marker() string { return f.Volume() + ".sha256-" + f.SHA256 }

// ImageFiles returns the image files of cfg (base image, kernel, initrd)
// with their hashes. Hashing a large image takes a while, so the sums are
// kept in Config.HashCache, keyed by path, size and modification time.
func ImageFiles(ctx context.Context, cfg Config) ([]ImageFile, error) {
	cfg = cfg.withDefaults()
	var files []ImageFile
	for _, f := range []struct{ role, path string }{
		{RoleBase, cfg.BaseImage}, {RoleKernel, cfg.Kernel}, {RoleInitrd, cfg.Initrd},
	} {
		if f.path != "" {
			files = append(files, ImageFile{Role: f.role, Path: f.path})
		}
	}
	if len(files) == 0 || files[0].Role != RoleBase {
		return nil, errors.New("base image: not set; give the qcow2 image the VMs start from")
	}
	cache := loadSums(cfg.HashCache)
	changed := false
	for i := range files {
		f := &files[i]
		st, err := os.Stat(f.Path)
		if err != nil {
			return nil, fmt.Errorf("%s %q: %w", f.Role, f.Path, err)
		}
		if !st.Mode().IsRegular() {
			return nil, fmt.Errorf("%s %q: not a regular file", f.Role, f.Path)
		}
		abs, err := filepath.Abs(f.Path)
		if err != nil {
			return nil, err
		}
		f.Size = st.Size()
		key := sumKey{Path: abs, Size: st.Size(), ModNS: st.ModTime().UnixNano()}
		if sum, ok := cache[key.String()]; ok {
			f.SHA256 = sum
			continue
		}
		t0 := time.Now()
		if f.SHA256, err = hashFile(ctx, f.Path); err != nil {
			return nil, fmt.Errorf("%s %q: %w", f.Role, f.Path, err)
		}
		cfg.Logger.Info("hashed image file", "role", f.Role, "path", f.Path, "bytes", f.Size, "took", time.Since(t0).Round(time.Millisecond))
		cache[key.String()] = f.SHA256
		changed = true
	}
	if changed && cfg.HashCache != "" {
		if err := saveSums(cfg.HashCache, cache); err != nil {
			cfg.Logger.Warn("cannot keep the image hashes; they are computed again next time", "file", cfg.HashCache, "err", err)
		}
	}
	return files, nil
}

type sumKey struct {
	Path  string
	Size  int64
	ModNS int64
}

func (k sumKey) String() string { return fmt.Sprintf("%s\x00%d\x00%d", k.Path, k.Size, k.ModNS) }

func loadSums(path string) map[string]string {
	m := map[string]string{}
	if path == "" {
		return m
	}
	b, err := os.ReadFile(path)
	if err == nil {
		_ = json.Unmarshal(b, &m) // a damaged cache is rebuilt
	}
	return m
}

func saveSums(path string, m map[string]string) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".sums-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// hashFile returns the SHA-256 of a file, giving up when ctx ends.
func hashFile(ctx context.Context, path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, ctxReader{ctx, f}); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// ctxReader stops reading once ctx is done.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (r ctxReader) Read(p []byte) (int, error) {
	if err := r.ctx.Err(); err != nil {
		return 0, context.Cause(r.ctx)
	}
	return r.r.Read(p)
}

// ImageState says whether a host holds an image file.
type ImageState struct {
	File ImageFile
	// Volume is the file's volume name (ImageFile.Volume).
	Volume string
	// Present: the volume exists. Matches: its upload completed with this
	// file's hash and size, and its size on disk is the file's.
	Present, Matches bool
	// Why says what does not match.
	Why string
	// Path is the volume's path on the host and Capacity its virtual size
	// as libvirt reads it (a qcow2 image's disk size), when it matches.
	Path     string
	Capacity uint64
}

// CheckImages reports, per image file, whether the host holds it.
func (h *Host) CheckImages(ctx context.Context) ([]ImageState, error) {
	files, err := h.imageFiles(ctx)
	if err != nil {
		return nil, err
	}
	c := h.connect()
	defer c.close()
	s := h.storage(c)
	p, err := s.pool(ctx)
	if err != nil {
		if errors.Is(err, ErrNoPool) {
			states := make([]ImageState, len(files))
			for i, f := range files {
				states[i] = ImageState{File: f, Volume: f.Volume(), Why: fmt.Sprintf("no storage pool %q", h.cfg.StoragePool)}
			}
			return states, nil
		}
		return nil, err
	}
	states := make([]ImageState, len(files))
	for i, f := range files {
		if states[i], err = checkImage(ctx, s, p, f); err != nil {
			return nil, err
		}
	}
	return states, nil
}

func checkImage(ctx context.Context, s *storage, p libvirt.StoragePool, f ImageFile) (ImageState, error) {
	st := ImageState{File: f, Volume: f.Volume()}
	v, ok, err := s.volume(ctx, p, f.Volume())
	if err != nil || !ok {
		st.Why = "volume missing"
		return st, err
	}
	st.Present = true
	_, ok, err = s.volume(ctx, p, f.marker())
	if err != nil {
		return st, err
	}
	if !ok {
		st.Why = "upload incomplete (no " + f.marker() + ")"
		return st, nil
	}
	size, err := s.size(ctx, v)
	if err != nil {
		return st, err
	}
	if size != uint64(f.Size) {
		st.Why = fmt.Sprintf("size %d on the host, %d here", size, f.Size)
		return st, nil
	}
	st.Matches = true
	if st.Path, err = s.path(ctx, v); err != nil {
		return st, err
	}
	st.Capacity, err = s.capacity(ctx, v)
	return st, err
}

// SyncProgress is told how far an upload got.
type SyncProgress func(f ImageFile, sent int64)

// SyncImages uploads, through libvirt's volume upload, every image file
// the host lacks or holds differently, creating the storage pool first if
// the host has none. It returns the states after the upload.
func (h *Host) SyncImages(ctx context.Context, progress SyncProgress) ([]ImageState, error) {
	files, err := h.imageFiles(ctx)
	if err != nil {
		return nil, err
	}
	c := h.connect()
	defer c.close()
	s := h.storage(c)
	p, created, err := s.ensurePool(ctx)
	if err != nil {
		return nil, fmt.Errorf("host %s: storage pool %q: %w", h.Name(), h.cfg.StoragePool, err)
	}
	if created {
		h.log.Info("created the storage pool", "pool", h.cfg.StoragePool, "dir", h.cfg.PoolDir)
	}
	states := make([]ImageState, len(files))
	for i, f := range files {
		st, err := checkImage(ctx, s, p, f)
		if err != nil {
			return nil, err
		}
		if !st.Matches {
			h.log.Info("uploading an image file", "role", f.Role, "file", f.Path, "volume", f.Volume(), "bytes", f.Size, "why", st.Why)
			t0 := time.Now()
			if err := upload(ctx, s, p, f, progress); err != nil {
				return nil, fmt.Errorf("host %s: upload %s %s: %w", h.Name(), f.Role, f.Path, err)
			}
			h.log.Info("uploaded an image file", "volume", f.Volume(), "took", time.Since(t0).Round(time.Millisecond))
			if st, err = checkImage(ctx, s, p, f); err != nil {
				return nil, err
			}
			if !st.Matches {
				return nil, fmt.Errorf("host %s: %s after its upload: %s", h.Name(), f.Volume(), st.Why)
			}
		}
		states[i] = st
	}
	h.forgetImages()
	return states, nil
}

// upload replaces f's volume (and marker) with the file's content.
func upload(ctx context.Context, s *storage, p libvirt.StoragePool, f ImageFile, progress SyncProgress) error {
	if err := removeMarkers(ctx, s, p, f); err != nil {
		return err
	}
	if err := s.remove(ctx, p, f.Volume()); err != nil {
		return err
	}
	file, err := os.Open(f.Path)
	if err != nil {
		return err
	}
	defer file.Close()
	v, err := s.create(ctx, p, volumeSpec{Name: f.Volume(), Capacity: uint64(f.Size), Format: "raw", Mode: "0644"})
	if err != nil {
		return err
	}
	var r io.Reader = ctxReader{ctx, io.LimitReader(file, f.Size)}
	if progress != nil {
		r = &progressReader{r: r, f: f, progress: progress}
	}
	if err := s.write(ctx, v, r, uint64(f.Size)); err != nil {
		return err
	}
	_, err = s.create(ctx, p, volumeSpec{Name: f.marker(), Format: "raw", Mode: "0644"})
	return err
}

// removeMarkers deletes f's volume's markers, whatever hash they name.
func removeMarkers(ctx context.Context, s *storage, p libvirt.StoragePool, f ImageFile) error {
	names, err := s.names(ctx, p)
	if err != nil {
		return err
	}
	for _, n := range names {
		if strings.HasPrefix(n, f.Volume()+".sha256") {
			if err := s.remove(ctx, p, n); err != nil {
				return err
			}
		}
	}
	return nil
}

type progressReader struct {
	r        io.Reader
	f        ImageFile
	sent     int64
	progress SyncProgress
}

func (p *progressReader) Read(b []byte) (int, error) {
	n, err := p.r.Read(b)
	p.sent += int64(n)
	p.progress(p.f, p.sent)
	return n, err
}

// imageSet is a host's view of the image files: their hashes (computed
// once, or given by OpenHost's caller) and, once checked, their paths.
type imageSet struct {
	mu    sync.Mutex
	files []ImageFile
	paths map[string]string // role → path on the host, once checked
	// capacity is the base image's virtual size, once checked.
	capacity uint64
}

func (h *Host) imageFiles(ctx context.Context) ([]ImageFile, error) {
	h.images.mu.Lock()
	defer h.images.mu.Unlock()
	if h.images.files == nil {
		files, err := ImageFiles(ctx, h.cfg)
		if err != nil {
			return nil, err
		}
		h.images.files = files
	}
	return h.images.files, nil
}

func (h *Host) forgetImages() {
	h.images.mu.Lock()
	h.images.paths = nil
	h.images.mu.Unlock()
}

// imagePaths returns the host's paths of the image files by role, which
// must all be there: a VM's domain points at them.
func (h *Host) imagePaths(ctx context.Context) (map[string]string, error) {
	h.images.mu.Lock()
	paths := h.images.paths
	h.images.mu.Unlock()
	if paths != nil {
		return paths, nil
	}
	states, err := h.CheckImages(ctx)
	if err != nil {
		return nil, err
	}
	paths = map[string]string{}
	var missing []string
	var capacity uint64
	for _, st := range states {
		if !st.Matches {
			missing = append(missing, fmt.Sprintf("%s %s (%s: %s)", st.File.Role, st.File.Path, st.Volume, st.Why))
			continue
		}
		paths[st.File.Role] = st.Path
		if st.File.Role == RoleBase {
			capacity = st.Capacity
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("%w: host %s lacks %s: run `legato rl hosts sync` to upload them", ErrImageMissing, h.Name(), strings.Join(missing, ", "))
	}
	h.images.mu.Lock()
	h.images.paths, h.images.capacity = paths, capacity
	h.images.mu.Unlock()
	return paths, nil
}

// baseCapacity is the base image's virtual size, once imagePaths found it.
func (h *Host) baseCapacity() uint64 {
	h.images.mu.Lock()
	defer h.images.mu.Unlock()
	return h.images.capacity
}

// ErrImageMissing means a host lacks an image file VMs boot from (or holds
// a different one).
var ErrImageMissing = errors.New("image not on the host")

// imageVolumeRE matches the volumes of image files (and their markers)
// that SyncImages makes, whatever their content.
var imageVolumeRE = regexp.MustCompile(`^legato-(base|kernel|initrd)-[0-9a-f]{16}(\.qcow2)?(\.sha256.*)?$`)

// PruneImages deletes the image volumes of other images than the host's
// current ones (an image rebuilt, an older OSWorld image) that nothing on
// the host uses: no domain boots from them and no volume is backed by
// them. It returns the volumes it deleted.
func (h *Host) PruneImages(ctx context.Context) ([]string, error) {
	files, err := h.imageFiles(ctx)
	if err != nil {
		return nil, err
	}
	keep := map[string]bool{}
	for _, f := range files {
		keep[f.Volume()], keep[f.marker()] = true, true
	}
	c := h.connect()
	defer c.close()
	s := h.storage(c)
	p, err := s.pool(ctx)
	if errors.Is(err, ErrNoPool) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	used, err := usedPaths(ctx, c, s, p)
	if err != nil {
		return nil, err
	}
	names, err := s.names(ctx, p)
	if err != nil {
		return nil, err
	}
	var pruned []string
	for _, n := range names {
		if keep[n] || !imageVolumeRE.MatchString(n) {
			continue
		}
		v, ok, err := s.volume(ctx, p, n)
		if err != nil {
			return pruned, err
		}
		if !ok {
			continue
		}
		path, err := s.path(ctx, v)
		if err != nil {
			return pruned, err
		}
		// A marker goes with its volume, and is kept with it.
		if base, _, isMarker := strings.Cut(path, ".sha256"); isMarker && used[base] {
			continue
		}
		if used[path] {
			continue
		}
		if err := s.remove(ctx, p, n); err != nil {
			return pruned, err
		}
		pruned = append(pruned, n)
	}
	return pruned, nil
}

// usedPaths returns the paths on the host that a domain boots from (disks,
// kernels, initrds) or a volume of the pool is backed by.
func usedPaths(ctx context.Context, c *conn, s *storage, p libvirt.StoragePool) (map[string]bool, error) {
	used := map[string]bool{}
	var docs []string
	err := c.do(ctx, "list what uses the image volumes", func(lv *libvirt.Libvirt) error {
		doms, _, err := lv.ConnectListAllDomains(1, 0)
		if err != nil {
			return err
		}
		for _, d := range doms {
			x, err := lv.DomainGetXMLDesc(d, 0)
			if err != nil && !isNoDomain(err) {
				return err
			}
			docs = append(docs, x)
		}
		vols, _, err := lv.StoragePoolListAllVolumes(p, 1, 0)
		if err != nil {
			return err
		}
		for _, v := range vols {
			x, err := lv.StorageVolGetXMLDesc(v, 0)
			if err != nil && !isNoVolume(err) {
				return err
			}
			docs = append(docs, x)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	for _, x := range docs {
		for _, m := range usedPathRE.FindAllStringSubmatch(x, -1) {
			for _, g := range m[1:] {
				if g != "" {
					used[html.UnescapeString(g)] = true
				}
			}
		}
	}
	return used, nil
}

// usedPathRE finds the paths a domain or volume definition refers to:
// disk sources, kernels and initrds, backing stores.
var usedPathRE = regexp.MustCompile(`<source file='([^']*)'|<source file="([^"]*)"|<kernel>([^<]*)</kernel>|<initrd>([^<]*)</initrd>|<backingStore>\s*<path>([^<]*)</path>`)
