package view

import (
	"bytes"
	"crypto/subtle"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"legato/rl/schema"
)

//go:embed assets
var assets embed.FS

var pages = template.Must(template.New("").Funcs(template.FuncMap{
	"deref":   func(p *float64) string { return strconv.FormatFloat(*p, 'g', 4, 64) },
	"fmtTime": fmtTime,
}).ParseFS(assets, "assets/pages.html"))

// staticAssets are the files under static/ every page loads: no CDN, so
// that the pages work offline.
var staticAssets = []string{"view.css", "view.js"}

// TokenCookie holds the bearer token in the browser once a page was opened
// with ?token=, so that the page's links and images carry it.
const TokenCookie = "legato_view_token"

// Handler serves the pages of run. Every request needs token: as a
// bearer token (Authorization: Bearer TOKEN), in TokenCookie, or as
// ?token=TOKEN, which sets the cookie and redirects to the same page
// without it (the link printed at start). Routes, relative to where the
// handler is mounted:
//
//	./                 the run: summary, histograms, tasks, attempts (filters and page as query parameters)
//	group?id=G         a group's attempts side by side
//	attempt?id=R       an attempt, step by step (#step-N links a step)
//	img/SHA256.png     an image of the run's store
//	static/NAME        the pages' CSS and script
func Handler(run *Run, token string) http.Handler {
	if token == "" {
		panic("view: Handler needs a token")
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", run.serveRun)
	mux.HandleFunc("GET /group", run.serveGroup)
	mux.HandleFunc("GET /attempt", run.serveAttempt)
	mux.HandleFunc("GET /img/{name}", run.serveImage)
	mux.HandleFunc("GET /static/{name}", serveAsset)
	return checkToken(token, mux)
}

func checkToken(token string, next http.Handler) http.Handler {
	want := []byte(token)
	ok := func(got string) bool { return subtle.ConstantTimeCompare([]byte(got), want) == 1 }
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if q := r.URL.Query(); q.Has("token") {
			if !ok(q.Get("token")) {
				http.Error(w, "wrong token: use the link legato rl view printed, or the token in $LEGATO_SERVE_TOKEN", http.StatusUnauthorized)
				return
			}
			http.SetCookie(w, &http.Cookie{Name: TokenCookie, Value: token, Path: "/", HttpOnly: true, SameSite: http.SameSiteStrictMode})
			q.Del("token")
			// Relative, so that it holds wherever the handler is mounted.
			loc := r.URL.Path[strings.LastIndex(r.URL.Path, "/")+1:]
			if loc == "" {
				loc = "./"
			}
			if len(q) > 0 {
				loc += "?" + q.Encode()
			}
			w.Header().Set("Location", loc)
			w.WriteHeader(http.StatusSeeOther)
			return
		}
		if scheme, cred, found := strings.Cut(r.Header.Get("Authorization"), " "); found && strings.EqualFold(scheme, "Bearer") && ok(strings.TrimSpace(cred)) {
			next.ServeHTTP(w, r)
			return
		}
		if c, err := r.Cookie(TokenCookie); err == nil && ok(c.Value) {
			next.ServeHTTP(w, r)
			return
		}
		w.Header().Set("WWW-Authenticate", `Bearer realm="legato"`)
		http.Error(w, "missing or wrong token: open the link legato rl view printed (it ends in ?token=...), or send Authorization: Bearer TOKEN", http.StatusUnauthorized)
	})
}

// render writes a page, or a 500 naming what failed; the page is made in
// memory first, so that a failure does not leave half of one.
func render(w http.ResponseWriter, name string, data any) {
	var b bytes.Buffer
	if err := pages.ExecuteTemplate(&b, name, data); err != nil {
		http.Error(w, "render "+name+": "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.Write(b.Bytes())
}

func (run *Run) serveRun(w http.ResponseWriter, r *http.Request) {
	if err := run.refresh(); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	q := r.URL.Query()
	f, err := parseFilter(q)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	page := 1
	if s := q.Get("page"); s != "" {
		if page, err = strconv.Atoi(s); err != nil || page < 1 {
			http.Error(w, fmt.Sprintf("page=%q: want a page number from 1", s), http.StatusBadRequest)
			return
		}
	}
	render(w, "run", run.buildRun(run.snapshot(), f, page, serverLinks{}))
}

func (run *Run) serveGroup(w http.ResponseWriter, r *http.Request) {
	id := r.URL.Query().Get("id")
	if id == "" {
		http.Error(w, "id: missing; want group?id=GROUP_ID", http.StatusBadRequest)
		return
	}
	if err := run.refresh(); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	p, found, err := run.buildGroup(run.snapshot(), id, serverLinks{})
	switch {
	case !found:
		http.Error(w, fmt.Sprintf("group %q: no record of this run has it", id), http.StatusNotFound)
	case err != nil:
		http.Error(w, fmt.Sprintf("group %q: %v", id, err), http.StatusInternalServerError)
	default:
		render(w, "group", p)
	}
}

func (run *Run) serveAttempt(w http.ResponseWriter, r *http.Request) {
	id := r.URL.Query().Get("id")
	if id == "" {
		http.Error(w, "id: missing; want attempt?id=ROLLOUT_ID", http.StatusBadRequest)
		return
	}
	if err := run.refresh(); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	p, found, err := run.buildAttempt(run.snapshot(), id, serverLinks{})
	switch {
	case !found:
		http.Error(w, fmt.Sprintf("attempt %q: no record of this run has it", id), http.StatusNotFound)
	case err != nil:
		http.Error(w, fmt.Sprintf("attempt %q: %v", id, err), http.StatusInternalServerError)
	default:
		render(w, "attempt", p)
	}
}

// serveImage serves an image of the store by its hash. Its bytes never
// change (the name is their hash), so the browser keeps it.
func (run *Run) serveImage(w http.ResponseWriter, r *http.Request) {
	sha, ok := strings.CutSuffix(r.PathValue("name"), ".png")
	if !ok {
		http.Error(w, "want img/SHA256.png", http.StatusBadRequest)
		return
	}
	etag := `"` + sha + `"`
	if r.Header.Get("If-None-Match") == etag {
		w.WriteHeader(http.StatusNotModified)
		return
	}
	data, err := run.store.ImagePNG(sha)
	switch {
	case errors.Is(err, schema.ErrBadHash):
		http.Error(w, fmt.Sprintf("image %q: %v", sha, err), http.StatusBadRequest)
		return
	case errors.Is(err, schema.ErrNotFound):
		http.Error(w, fmt.Sprintf("image %s: not in the run's store", sha), http.StatusNotFound)
		return
	case err != nil:
		http.Error(w, fmt.Sprintf("image %s: %v", sha, err), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "image/png")
	w.Header().Set("Cache-Control", "private, max-age=31536000, immutable")
	w.Header().Set("ETag", etag)
	w.Header().Set("Content-Length", strconv.Itoa(len(data)))
	w.Write(data)
}

func serveAsset(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	data, err := fs.ReadFile(assets, "assets/"+name)
	if err != nil || !isAsset(name) {
		http.NotFound(w, r)
		return
	}
	ct := "text/css; charset=utf-8"
	if strings.HasSuffix(name, ".js") {
		ct = "text/javascript; charset=utf-8"
	}
	w.Header().Set("Content-Type", ct)
	w.Header().Set("Cache-Control", "no-cache")
	w.Write(data)
}

func isAsset(name string) bool {
	for _, a := range staticAssets {
		if a == name {
			return true
		}
	}
	return false
}

// URL returns the link to a page of a view served at base with token:
// what legato rl view prints.
func URL(base, token string) string {
	return strings.TrimSuffix(base, "/") + "/?token=" + url.QueryEscape(token)
}
