package vm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/template"

	"github.com/digitalocean/go-libvirt"
)

// The storage pool holds, on every host, the image files VMs boot from
// (uploaded once, named after their content) and each VM's overlay (named
// after the VM). Everything is made, written and deleted through libvirt:
// legato never touches a host's files by path. Nothing is read back with a
// volume download: go-libvirt can deadlock on an incoming stream (its
// issue 241), so what legato must know of a volume is in its name and
// size.

// ErrNoPool means the host has no storage pool of the configured name.
var ErrNoPool = errors.New("no storage pool")

// overlayVolume is the name of a VM's overlay volume.
func overlayVolume(vm string) string { return vm + ".qcow2" }

// libvirt's flag for StorageVolGetInfoFlags: report the file's size on
// disk (VIR_STORAGE_VOL_GET_PHYSICAL), not what a qcow2 file allocates.
const volGetPhysical = 1

// poolXML defines a directory pool: the volumes are files in Dir.
var poolXML = template.Must(template.New("pool").Funcs(template.FuncMap{"x": xmlText}).Parse(
	`<pool type='dir'>
  <name>{{x .Name}}</name>
  <target>
    <path>{{x .Dir}}</path>
    <permissions><mode>0755</mode></permissions>
  </target>
</pool>
`))

// volumeXML defines a volume; with Backing, a qcow2 overlay on that path.
// Mode 0644 lets QEMU (another user) read shared image files.
var volumeXML = template.Must(template.New("volume").Funcs(template.FuncMap{"x": xmlText}).Parse(
	`<volume>
  <name>{{x .Name}}</name>
  <capacity unit='bytes'>{{.Capacity}}</capacity>
  <allocation unit='bytes'>0</allocation>
  <target>
    <format type='{{.Format}}'/>
    <permissions><mode>{{.Mode}}</mode></permissions>
  </target>
{{- if .Backing}}
  <backingStore>
    <path>{{x .Backing}}</path>
    <format type='qcow2'/>
  </backingStore>
{{- end}}
</volume>
`))

type volumeSpec struct {
	Name     string
	Capacity uint64
	Format   string // raw or qcow2
	Mode     string
	Backing  string
}

func render(t *template.Template, v any) (string, error) {
	var b bytes.Buffer
	if err := t.Execute(&b, v); err != nil {
		return "", fmt.Errorf("render %s xml: %w", t.Name(), err)
	}
	return b.String(), nil
}

// storage is the configured pool on one host, reached through a conn.
type storage struct {
	c    *conn
	name string
	dir  string
}

func (h *Host) storage(c *conn) *storage {
	return &storage{c: c, name: h.cfg.StoragePool, dir: h.cfg.PoolDir}
}

func isNoPool(err error) bool {
	code, ok := libvirtCode(err)
	return ok && code == libvirt.ErrNoStoragePool
}

func isNoVolume(err error) bool {
	code, ok := libvirtCode(err)
	return ok && code == libvirt.ErrNoStorageVol
}

// pool returns the pool, which must exist and be active.
func (s *storage) pool(ctx context.Context) (libvirt.StoragePool, error) {
	var p libvirt.StoragePool
	var active int32
	err := s.c.do(ctx, "look up storage pool", func(lv *libvirt.Libvirt) error {
		var err error
		if p, err = lv.StoragePoolLookupByName(s.name); err != nil {
			return err
		}
		active, err = lv.StoragePoolIsActive(p)
		return err
	})
	switch {
	case isNoPool(err):
		return p, &Error{Op: "look up storage pool", Err: fmt.Errorf("%w %q on host %s: `legato rl hosts sync` creates it (at %s) and uploads the image", ErrNoPool, s.name, s.c.host.Name(), s.dir)}
	case err != nil:
		return p, err
	case active == 0:
		err = s.c.do(ctx, "start storage pool", func(lv *libvirt.Libvirt) error { return lv.StoragePoolCreate(p, 0) })
	}
	return p, err
}

// ensurePool returns the pool, defining, building and starting a
// directory pool at dir first if the host has none of that name.
func (s *storage) ensurePool(ctx context.Context) (libvirt.StoragePool, bool, error) {
	p, err := s.pool(ctx)
	if !errors.Is(err, ErrNoPool) {
		return p, false, err
	}
	x, err := render(poolXML, struct{ Name, Dir string }{s.name, s.dir})
	if err != nil {
		return p, false, err
	}
	err = s.c.do(ctx, "create storage pool", func(lv *libvirt.Libvirt) error {
		var err error
		if p, err = lv.StoragePoolDefineXML(x, 0); err != nil {
			return err
		}
		if err := lv.StoragePoolBuild(p, 0); err != nil {
			return err
		}
		if err := lv.StoragePoolCreate(p, 0); err != nil {
			return err
		}
		return lv.StoragePoolSetAutostart(p, 1)
	})
	return p, err == nil, err
}

// volume looks a volume up; ok is false when it does not exist.
func (s *storage) volume(ctx context.Context, p libvirt.StoragePool, name string) (v libvirt.StorageVol, ok bool, err error) {
	err = s.c.do(ctx, "look up volume", func(lv *libvirt.Libvirt) error {
		var err error
		v, err = lv.StorageVolLookupByName(p, name)
		return err
	})
	if isNoVolume(err) {
		return v, false, nil
	}
	return v, err == nil, err
}

// path returns where a volume is on the host, for the domain XML.
func (s *storage) path(ctx context.Context, v libvirt.StorageVol) (string, error) {
	var path string
	err := s.c.do(ctx, "volume path", func(lv *libvirt.Libvirt) error {
		var err error
		path, err = lv.StorageVolGetPath(v)
		return err
	})
	return path, err
}

// create makes a volume.
func (s *storage) create(ctx context.Context, p libvirt.StoragePool, spec volumeSpec) (libvirt.StorageVol, error) {
	var v libvirt.StorageVol
	x, err := render(volumeXML, spec)
	if err != nil {
		return v, err
	}
	err = s.c.do(ctx, "create volume "+spec.Name, func(lv *libvirt.Libvirt) error {
		var err error
		v, err = lv.StorageVolCreateXML(p, x, 0)
		return err
	})
	return v, err
}

// remove deletes a volume; one that does not exist is fine.
func (s *storage) remove(ctx context.Context, p libvirt.StoragePool, name string) error {
	v, ok, err := s.volume(ctx, p, name)
	if err != nil || !ok {
		return err
	}
	err = s.c.do(ctx, "delete volume "+name, func(lv *libvirt.Libvirt) error { return lv.StorageVolDelete(v, 0) })
	if isNoVolume(err) {
		return nil
	}
	return err
}

// size returns a volume's size on disk.
func (s *storage) size(ctx context.Context, v libvirt.StorageVol) (uint64, error) {
	var n uint64
	err := s.c.do(ctx, "volume size", func(lv *libvirt.Libvirt) error {
		var err error
		_, _, n, err = lv.StorageVolGetInfoFlags(v, volGetPhysical)
		return err
	})
	return n, err
}

// capacity returns a volume's virtual size (a qcow2 image's disk size).
func (s *storage) capacity(ctx context.Context, v libvirt.StorageVol) (uint64, error) {
	var n uint64
	err := s.c.do(ctx, "volume capacity", func(lv *libvirt.Libvirt) error {
		var err error
		_, n, _, err = lv.StorageVolGetInfo(v)
		return err
	})
	return n, err
}

// write replaces a volume's content with r's size bytes through libvirt's
// volume upload. Only ctx bounds it: an image takes as long as the link
// needs.
func (s *storage) write(ctx context.Context, v libvirt.StorageVol, r io.Reader, size uint64) error {
	return s.c.doLong(ctx, "upload volume", func(lv *libvirt.Libvirt) error {
		return lv.StorageVolUpload(v, r, 0, size, 0)
	})
}

// read writes a volume's content to w through libvirt's volume download.
// Only ctx bounds it, as write.
func (s *storage) read(ctx context.Context, v libvirt.StorageVol, w io.Writer) error {
	return s.c.doLong(ctx, "download volume", func(lv *libvirt.Libvirt) error {
		return lv.StorageVolDownload(v, w, 0, 0, 0)
	})
}

// names lists the pool's volumes.
func (s *storage) names(ctx context.Context, p libvirt.StoragePool) ([]string, error) {
	var vols []libvirt.StorageVol
	err := s.c.do(ctx, "list volumes", func(lv *libvirt.Libvirt) error {
		if err := lv.StoragePoolRefresh(p, 0); err != nil {
			return err
		}
		var err error
		vols, _, err = lv.StoragePoolListAllVolumes(p, 1, 0)
		return err
	})
	out := make([]string, 0, len(vols))
	for _, v := range vols {
		out = append(out, v.Name)
	}
	return out, err
}

// tail returns the end of a console log as text for an error message.
func consoleText(b []byte, err error) string {
	if err != nil {
		return "(no console log: " + err.Error() + ")"
	}
	const max = 600
	s := strings.TrimSpace(string(b))
	if len(s) > max {
		s = "…" + s[len(s)-max:]
	}
	if s == "" {
		return "(empty)"
	}
	return s
}
