package grade

// Native Go versions of OSWorld's getters that only move data: files from
// the guest, command output, files from the web, the task's rules. They
// produce the same values as the Python ones (file paths in the task's cache
// directory, strings, rules as written), so either kind of metric can use
// them.

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/big"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Guest is what the native getters need from OSWorld's in-guest HTTP
// server. The desktop backend adapts its guest client to it.
type Guest interface {
	// File returns the content of a file in the guest (POST /file). A
	// missing file is an error wrapping ErrRefused (the server answers 404)
	// or fs.ErrNotExist.
	File(ctx context.Context, path string) ([]byte, error)
	// Execute runs a command in the guest (POST /execute with {"command":
	// argv, "shell": shell}). With shell set, argv[0] is the command line
	// for /bin/sh. An error status from the server is an error wrapping
	// ErrRefused.
	Execute(ctx context.Context, argv []string, shell bool) (ExecResult, error)
	// Accessibility returns the accessibility tree as XML (GET
	// /accessibility).
	Accessibility(ctx context.Context) (string, error)
}

// ExecResult is what a command run by Guest.Execute produced.
type ExecResult struct {
	Output     string // standard output
	Error      string // standard error
	ReturnCode int
}

// nativeEnv is what native getters read: the Go counterpart of the env
// object OSWorld passes to its getters.
type nativeEnv struct {
	guest Guest
	// ports are the guest's ports as this machine reaches them (VLC's HTTP
	// interface, Chrome's DevTools), and guestHTTP the client for them.
	ports     Env
	guestHTTP *http.Client
	cacheDir  string // the task's, OSWorld's env.cache_dir
	client    *http.Client
	now       func() time.Time
	// downloads caches cloud files by URL across tasks and attempts.
	downloads string
}

type nativeGetter func(ctx context.Context, env *nativeEnv, cfg *pyDict) (any, error)

// NativeGetters lists the getter types the grader implements in Go.
func NativeGetters() []string {
	return []string{"accessibility_tree", "cache_file", "cloud_file", "default_video_player", "gimp_config_file",
		"open_tabs_info", "rule", "vlc_config", "vlc_playing_info", "vm_command_line", "vm_file"}
}

func nativeGetterFor(typ string) (nativeGetter, bool) {
	switch typ {
	case "rule":
		return getRule, true
	case "vm_file":
		return getVMFile, true
	case "vm_command_line":
		return getVMCommandLine, true
	case "cloud_file":
		return getCloudFile, true
	case "cache_file":
		return getCacheFile, true
	case "accessibility_tree":
		return getAccessibilityTree, true
	case "vlc_playing_info":
		return getVLCPlayingInfo, true
	case "vlc_config":
		return getVLCConfig, true
	case "gimp_config_file":
		return getGIMPConfigFile, true
	case "default_video_player":
		return getDefaultVideoPlayer, true
	case "open_tabs_info":
		return getOpenTabsInfo, true
	}
	return nil, false
}

// getterNeedsGuest reports whether a native getter talks to the guest.
func getterNeedsGuest(typ string) bool {
	switch typ {
	case "vm_file", "vm_command_line", "accessibility_tree", "vlc_config", "gimp_config_file", "default_video_player":
		return true
	}
	return false
}

// refused reports whether a guest error is an answer (OSWorld passes None
// on), as opposed to a guest that could not be reached.
func refused(err error) bool {
	return errors.Is(err, ErrRefused) || errors.Is(err, fs.ErrNotExist)
}

func getRule(_ context.Context, _ *nativeEnv, cfg *pyDict) (any, error) {
	return subscript(cfg, "rules")
}

func getAccessibilityTree(ctx context.Context, env *nativeEnv, _ *pyDict) (any, error) {
	tree, err := env.guest.Accessibility(ctx)
	if refused(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("accessibility tree: %w", err)
	}
	return tree, nil
}

// getVMCommandLine returns the command's standard output, None when the
// server refuses it. A string command without a shell is split here as the
// server would split it.
func getVMCommandLine(ctx context.Context, env *nativeEnv, cfg *pyDict) (any, error) {
	command, err := subscript(cfg, "command")
	if err != nil {
		return nil, err
	}
	shell := pyTruthy(cfg.getOr("shell", false))
	var argv []string
	switch c := command.(type) {
	case string:
		if shell {
			argv = []string{c}
		} else if argv, err = shlexSplit(c); err != nil {
			return nil, raise("ValueError", "%v", err)
		}
	case []any:
		for _, a := range c {
			s, ok := a.(string)
			if !ok {
				return nil, raise("TypeError", "command argument %s is not a string", pyRepr(a))
			}
			argv = append(argv, s)
		}
	default:
		return nil, raise("TypeError", "command must be a string or a list, not %s", pyTypeName(command))
	}
	if len(argv) == 0 {
		return nil, nil // the server fails to run nothing and answers 500
	}
	res, err := env.guest.Execute(ctx, argv, shell)
	if refused(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("execute %q: %w", argv, err)
	}
	return res.Output, nil
}

// fileList returns the (source, destination) pairs of a vm_file or
// cloud_file config: one pair, or with "multi" the zipped lists.
func fileList(cfg *pyDict) (srcs, dests []any, err error) {
	if !pyTruthy(cfg.getOr("multi", false)) {
		p, err := subscript(cfg, "path")
		if err != nil {
			return nil, nil, err
		}
		d, err := subscript(cfg, "dest")
		if err != nil {
			return nil, nil, err
		}
		return []any{p}, []any{d}, nil
	}
	p, err := subscript(cfg, "path")
	if err != nil {
		return nil, nil, err
	}
	d, err := subscript(cfg, "dest")
	if err != nil {
		return nil, nil, err
	}
	if srcs, err = pyIter(p); err != nil {
		return nil, nil, err
	}
	if dests, err = pyIter(d); err != nil {
		return nil, nil, err
	}
	n := min(len(srcs), len(dests)) // zip stops at the shorter
	return srcs[:n], dests[:n], nil
}

// givesFunc returns whether file i is handed to the metric ("gives",
// default [0]).
func givesFunc(cfg *pyDict) (func(int) bool, error) {
	items, err := pyIter(cfg.getOr("gives", []any{big.NewInt(0)}))
	if err != nil {
		return nil, err
	}
	for _, it := range items {
		switch it.(type) {
		case []any, *pyDict:
			return nil, raise("TypeError", "unhashable type: '%s'", pyTypeName(it))
		}
	}
	return func(i int) bool {
		n := big.NewInt(int64(i))
		for _, it := range items {
			if pyItemEqual(it, n) {
				return true
			}
		}
		return false
	}, nil
}

// handOut is OSWorld's `paths[0] if len(paths) == 1 else paths`.
func handOut(paths []any) any {
	if len(paths) == 1 {
		return paths[0]
	}
	if paths == nil {
		return []any{}
	}
	return paths
}

// getVMFile copies files from the guest into the task's cache directory and
// returns their local paths; None for a file the guest does not have.
func getVMFile(ctx context.Context, env *nativeEnv, cfg *pyDict) (any, error) {
	srcs, dests, err := fileList(cfg)
	if err != nil {
		return nil, err
	}
	if !pyTruthy(cfg.getOr("multi", false)) && pyTruthy(cfg.getOr("time_suffix", false)) {
		format, ok := cfg.getOr("time_format", "%Y%m%d_%H%M%S").(string)
		if !ok {
			return nil, raise("TypeError", "time_format must be a string")
		}
		d, ok := dests[0].(string)
		if !ok {
			return nil, raise("TypeError", "dest must be a string")
		}
		base, ext := pySplitExt(d)
		dests[0] = base + "_" + strftime(format, env.now()) + ext
	}
	gives, err := givesFunc(cfg)
	if err != nil {
		return nil, err
	}
	var out []any
	for i := range srcs {
		dest, ok := dests[i].(string)
		if !ok {
			return nil, raise("TypeError", "dest must be a string, not %s", pyTypeName(dests[i]))
		}
		local := pyJoin(env.cacheDir, dest)
		src, ok := srcs[i].(string)
		if !ok {
			// OSWorld catches everything per file and hands on None.
			if gives(i) {
				out = append(out, nil)
			}
			continue
		}
		data, err := env.guest.File(ctx, src)
		if refused(err) {
			if gives(i) {
				out = append(out, nil)
			}
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("get file %s: %w", src, err)
		}
		if err := writeFileAtomic(local, data); err != nil {
			return nil, err
		}
		if gives(i) {
			out = append(out, local)
		}
	}
	return handOut(out), nil
}

// getCloudFile downloads files into the task's cache directory, unless they
// are there already, and returns their local paths.
func getCloudFile(ctx context.Context, env *nativeEnv, cfg *pyDict) (any, error) {
	srcs, dests, err := fileList(cfg)
	if err != nil {
		return nil, err
	}
	gives, err := givesFunc(cfg)
	if err != nil {
		return nil, err
	}
	var out []any
	for i := range srcs {
		dest, ok := dests[i].(string)
		if !ok {
			return nil, raise("TypeError", "dest must be a string, not %s", pyTypeName(dests[i]))
		}
		local := pyJoin(env.cacheDir, dest)
		if gives(i) {
			out = append(out, local)
		}
		if _, err := os.Stat(local); err == nil {
			continue
		}
		url, ok := srcs[i].(string)
		if !ok {
			return nil, raise("TypeError", "url must be a string, not %s", pyTypeName(srcs[i]))
		}
		if err := env.fetch(ctx, url, local); err != nil {
			return nil, err
		}
	}
	return handOut(out), nil
}

// fetch puts the content of url at local, downloading it only if the
// download cache does not have it yet.
func (env *nativeEnv) fetch(ctx context.Context, url, local string) error {
	if env.downloads == "" {
		return download(ctx, env.client, url, local)
	}
	sum := sha256.Sum256([]byte(url))
	stored := filepath.Join(env.downloads, hex.EncodeToString(sum[:]))
	if _, err := os.Stat(stored); err != nil {
		if err := download(ctx, env.client, url, stored); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(filepath.Dir(local), 0o755); err != nil {
		return err
	}
	if err := os.Link(stored, local); err == nil {
		return nil
	}
	// Another file system, or links not allowed: copy.
	data, err := os.ReadFile(stored)
	if err != nil {
		return err
	}
	return writeFileAtomic(local, data)
}

func download(ctx context.Context, client *http.Client, url, local string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return fmt.Errorf("download %s: %w", url, err)
	}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("download: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 400 {
		return fmt.Errorf("download %s: %s", url, resp.Status)
	}
	if err := os.MkdirAll(filepath.Dir(local), 0o755); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(local), ".download-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := io.Copy(tmp, resp.Body); err != nil {
		tmp.Close()
		return fmt.Errorf("download %s: %w", url, err)
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), local)
}

// getCacheFile returns the path of a file a postconfig step left in the
// task's cache directory. OSWorld asserts that it exists; a missing file
// here is ErrNoFile, so the metric scores 0 (see the package doc).
func getCacheFile(_ context.Context, env *nativeEnv, cfg *pyDict) (any, error) {
	p, err := subscript(cfg, "path")
	if err != nil {
		return nil, err
	}
	rel, ok := p.(string)
	if !ok {
		return nil, raise("TypeError", "path must be a string, not %s", pyTypeName(p))
	}
	local := pyJoin(env.cacheDir, rel)
	if _, err := os.Stat(local); err != nil {
		return nil, fmt.Errorf("cache file %s: %w", rel, ErrNoFile)
	}
	return local, nil
}

// writeFileAtomic writes through a temporary file so that a reader never
// sees half a file.
func writeFileAtomic(path string, data []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".vmfile-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// pyJoin is os.path.join(dir, name): an absolute name replaces dir.
func pyJoin(dir, name string) string {
	if strings.HasPrefix(name, "/") {
		return name
	}
	if dir == "" || strings.HasSuffix(dir, "/") {
		return dir + name
	}
	return dir + "/" + name
}

// pySplitExt is os.path.splitext: the extension starts at the last dot of
// the last path element, unless that element is all leading dots up to it.
func pySplitExt(p string) (string, string) {
	sep := strings.LastIndexByte(p, '/')
	dot := strings.LastIndexByte(p, '.')
	if dot <= sep {
		return p, ""
	}
	for i := sep + 1; i < dot; i++ {
		if p[i] != '.' {
			return p[:dot], p[dot:]
		}
	}
	return p, ""
}

// strftime formats t with the C/Python directives OSWorld's time formats
// use; an unknown directive is kept as written.
func strftime(format string, t time.Time) string {
	var b strings.Builder
	for i := 0; i < len(format); i++ {
		c := format[i]
		if c != '%' || i+1 == len(format) {
			b.WriteByte(c)
			continue
		}
		i++
		switch format[i] {
		case 'Y':
			fmt.Fprintf(&b, "%04d", t.Year())
		case 'y':
			fmt.Fprintf(&b, "%02d", t.Year()%100)
		case 'm':
			fmt.Fprintf(&b, "%02d", int(t.Month()))
		case 'd':
			fmt.Fprintf(&b, "%02d", t.Day())
		case 'H':
			fmt.Fprintf(&b, "%02d", t.Hour())
		case 'I':
			h := t.Hour() % 12
			if h == 0 {
				h = 12
			}
			fmt.Fprintf(&b, "%02d", h)
		case 'M':
			fmt.Fprintf(&b, "%02d", t.Minute())
		case 'S':
			fmt.Fprintf(&b, "%02d", t.Second())
		case 'f':
			fmt.Fprintf(&b, "%06d", t.Nanosecond()/1000)
		case 'j':
			fmt.Fprintf(&b, "%03d", t.YearDay())
		case 'p':
			if t.Hour() < 12 {
				b.WriteString("AM")
			} else {
				b.WriteString("PM")
			}
		case 'a':
			b.WriteString(t.Weekday().String()[:3])
		case 'A':
			b.WriteString(t.Weekday().String())
		case 'b':
			b.WriteString(t.Month().String()[:3])
		case 'B':
			b.WriteString(t.Month().String())
		case '%':
			b.WriteByte('%')
		default:
			b.WriteByte('%')
			b.WriteByte(format[i])
		}
	}
	return b.String()
}
