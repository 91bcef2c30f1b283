package view

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"legato/rl/schema"
)

// StaticStats counts what WriteStatic wrote.
type StaticStats struct {
	Pages, Images int
	// Missing counts the images pages name that the run's store lacks.
	Missing int
}

// WriteStatic writes the pages of run into out as files that open from
// file:// without a server: index.html and page-N.html (the run, without
// filters), g-*.html (groups), a-*.html (attempts), img/ (the screenshots
// they show, hard links into the run's store where the file system allows,
// else copies) and static/. out must not exist or be empty, and must not
// be the run directory or inside it.
func WriteStatic(run *Run, out string) (StaticStats, error) {
	var st StaticStats
	if err := checkOut(run.dir, out); err != nil {
		return st, err
	}
	if err := os.MkdirAll(filepath.Join(out, "img"), 0o777); err != nil {
		return st, err
	}
	if err := os.MkdirAll(filepath.Join(out, "static"), 0o777); err != nil {
		return st, err
	}
	for _, name := range staticAssets {
		data, err := fs.ReadFile(assets, "assets/"+name)
		if err == nil {
			err = os.WriteFile(filepath.Join(out, "static", name), data, 0o666)
		}
		if err != nil {
			return st, err
		}
	}
	ix := run.snapshot()
	l := fileLinks{}
	images := map[string]bool{}
	write := func(name, tmpl string, data any) error {
		var b bytes.Buffer
		if err := pages.ExecuteTemplate(&b, tmpl, data); err != nil {
			return fmt.Errorf("render %s: %w", name, err)
		}
		st.Pages++
		return os.WriteFile(filepath.Join(out, name), b.Bytes(), 0o666)
	}
	first := run.buildRun(ix, filter{}, 1, l)
	for page := 1; page <= first.Pages; page++ {
		if err := write(l.run(filter{}, page), "run", run.buildRun(ix, filter{}, page, l)); err != nil {
			return st, err
		}
	}
	groups := map[string]bool{}
	for _, rw := range ix.rows {
		if !groups[rw.Group] {
			groups[rw.Group] = true
			p, _, err := run.buildGroup(ix, rw.Group, l)
			if err != nil {
				return st, fmt.Errorf("group %q: %w", rw.Group, err)
			}
			if err := write(l.group(rw.Group), "group", p); err != nil {
				return st, err
			}
		}
		p, _, err := run.buildAttempt(ix, rw.ID, l)
		if err != nil {
			return st, fmt.Errorf("attempt %q: %w", rw.ID, err)
		}
		for _, s := range p.Steps {
			if s.Shot != nil {
				images[s.Shot.SHA] = true
			}
			if s.Replay != nil && s.Replay.ReplayedSrc != "" {
				images[s.Replay.Replayed] = true
			}
		}
		if err := write(l.attempt(rw.ID), "attempt", p); err != nil {
			return st, err
		}
	}
	for sha := range images {
		err := linkImage(run, sha, filepath.Join(out, "img", sha+".png"))
		switch {
		case errors.Is(err, schema.ErrNotFound):
			// A damaged store: the page shows no image there, as the
			// server answers 404.
			st.Missing++
		case err != nil:
			return st, err
		default:
			st.Images++
		}
	}
	return st, nil
}

// checkOut refuses an output directory that holds files, or that is the
// run directory or inside it: an export adds to no run.
func checkOut(runDir, out string) error {
	absRun, err1 := filepath.Abs(runDir)
	absOut, err2 := filepath.Abs(out)
	if err := errors.Join(err1, err2); err != nil {
		return err
	}
	if rel, err := filepath.Rel(absRun, absOut); err == nil && (rel == "." || filepath.IsLocal(rel)) {
		return fmt.Errorf("--out %s: %w: it is inside the run directory %s; write the pages elsewhere", out, schema.ErrRunFile, runDir)
	}
	f, err := os.Open(out)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := f.Readdirnames(1); !errors.Is(err, io.EOF) {
		if err == nil {
			return fmt.Errorf("--out %s: %w: it holds files; give a new or empty directory", out, fs.ErrExist)
		}
		return fmt.Errorf("--out %s: %w", out, err)
	}
	return nil
}

// linkImage puts the store's image sha at path: a hard link when the file
// system allows (the store's file is checked against its hash first),
// else a copy.
func linkImage(run *Run, sha, path string) error {
	data, err := run.store.ImagePNG(sha)
	if err != nil {
		return err
	}
	if os.Link(filepath.Join(run.dir, schema.ImagesDir, sha+".png"), path) == nil {
		return nil
	}
	return os.WriteFile(path, data, 0o666)
}
