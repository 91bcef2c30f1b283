package grade

import (
	"crypto/sha256"
	"encoding/hex"
	"io"
	"os"
	"path/filepath"
)

// inputs are the digests of the values a metric was given (inputDigest):
// empty for a getter it has not, or a value without a stable form; and the
// result's text in brief (shown).
type inputs struct{ result, expected, shown string }

// inputDigest is the hex SHA-256 of inputText(v, cacheDir).
func inputDigest(v any, cacheDir string) string { return textDigest(inputText(v, cacheDir)) }

// inputText is repr(v), each string in v that names a regular file in the
// grade's cache directory (a getter's download) replaced first by "file
// sha256:" and the file's digest, so that it follows the content and not
// where the cache is. bridge.py's input_text computes the same for the
// metrics that run in Python.
func inputText(v any, cacheDir string) string { return pyRepr(byContent(v, cacheDir)) }

func textDigest(text string) string {
	sum := sha256.Sum256([]byte(text))
	return hex.EncodeToString(sum[:])
}

// maxShown bounds the text of a value shown in words
// (desktop.MetricRun.ResultValue), in characters; bridge.py sends a little
// more, so that a cut is seen here.
const maxShown = 200

// shown is text cut to maxShown characters, "…" marking a cut.
func shown(text string) string {
	n := 0
	for i := range text {
		if n == maxShown {
			return text[:i] + "…"
		}
		n++
	}
	return text
}

// byContent is v with the files of cacheDir it names replaced by their
// digests (inputDigest); v itself is left as it is.
func byContent(v any, cacheDir string) any {
	switch x := v.(type) {
	case string:
		if sum, ok := fileDigest(x, cacheDir); ok {
			return "file sha256:" + sum
		}
		return x
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = byContent(e, cacheDir)
		}
		return out
	case *pyDict:
		out := newPyDict()
		for _, k := range x.keys {
			out.set(k, byContent(x.vals[k], cacheDir))
		}
		return out
	}
	return v
}

// fileDigest is the hex SHA-256 of the regular file p in dir (at any
// depth); ok is false for any other p, or a file that cannot be read.
func fileDigest(p, dir string) (sum string, ok bool) {
	rel, err := filepath.Rel(dir, p)
	if !filepath.IsAbs(p) || err != nil || !filepath.IsLocal(rel) {
		return "", false
	}
	// A FIFO would block the open.
	if fi, err := os.Stat(p); err != nil || !fi.Mode().IsRegular() {
		return "", false
	}
	f, err := os.Open(p)
	if err != nil {
		return "", false
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", false
	}
	return hex.EncodeToString(h.Sum(nil)), true
}
