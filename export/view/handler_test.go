package view_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"legato/rl/export/view"
	"legato/rl/schema"
)

const token = "test-token"

func openRun(t *testing.T, dir string) *view.Run {
	t.Helper()
	run, err := view.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { run.Close() })
	return run
}

func get(t *testing.T, c *http.Client, url string, header ...string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(body)
}

// TestHandlerToken checks that every route needs the token, that ?token=
// sets the cookie and redirects without it, and that the cookie and a
// bearer header both let a request through.
func TestHandlerToken(t *testing.T) {
	srv := httptest.NewServer(view.Handler(openRun(t, writeFixture(t)), token))
	defer srv.Close()
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	for _, path := range []string{"/", "/attempt?id=r-save-0", "/group?id=v1/t-save", "/static/view.css", "/img/" + strings.Repeat("0", 64) + ".png"} {
		if resp, _ := get(t, noRedirect, srv.URL+path); resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("GET %s without the token: %s, want 401", path, resp.Status)
		}
		if resp, _ := get(t, noRedirect, srv.URL+path, "Authorization", "Bearer wrong"); resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("GET %s with a wrong token: %s, want 401", path, resp.Status)
		}
	}
	resp, _ := get(t, noRedirect, srv.URL+"/attempt?id=r-save-0&token="+token)
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "attempt?id=r-save-0" {
		t.Fatalf("GET with ?token=: %s, Location %q; want 303 to attempt?id=r-save-0", resp.Status, resp.Header.Get("Location"))
	}
	var cookie *http.Cookie
	for _, c := range resp.Cookies() {
		if c.Name == view.TokenCookie {
			cookie = c
		}
	}
	if cookie == nil || cookie.Value != token || !cookie.HttpOnly || cookie.SameSite != http.SameSiteStrictMode {
		t.Fatalf("cookie %+v: want %s=%s, HttpOnly, SameSite=Strict", cookie, view.TokenCookie, token)
	}
	if resp, body := get(t, noRedirect, srv.URL+"/attempt?id=r-save-0", "Cookie", cookie.String()); resp.StatusCode != 200 || !strings.Contains(body, "The Save button is in the toolbar") {
		t.Errorf("GET with the cookie: %s, want 200 with the reasoning", resp.Status)
	}
	if resp, _ := get(t, noRedirect, srv.URL+"/", "Authorization", "Bearer "+token); resp.StatusCode != 200 {
		t.Errorf("GET / with the bearer token: %s, want 200", resp.Status)
	}
}

// TestHandlerRoutes checks the answers to good and bad requests: images
// with their type and caching, 400 naming a bad parameter, 404 for an id
// no record has.
func TestHandlerRoutes(t *testing.T) {
	dir := writeFixture(t)
	srv := httptest.NewServer(view.Handler(openRun(t, dir), token))
	defer srv.Close()
	auth := []string{"Authorization", "Bearer " + token}
	imgs, err := os.ReadDir(filepath.Join(dir, "images"))
	if err != nil || len(imgs) == 0 {
		t.Fatalf("images: %v, %d", err, len(imgs))
	}
	want, _ := os.ReadFile(filepath.Join(dir, "images", imgs[0].Name()))
	resp, body := get(t, http.DefaultClient, srv.URL+"/img/"+imgs[0].Name(), auth...)
	if resp.StatusCode != 200 || body != string(want) || resp.Header.Get("Content-Type") != "image/png" ||
		!strings.Contains(resp.Header.Get("Cache-Control"), "immutable") || resp.Header.Get("ETag") == "" {
		t.Errorf("image: %s, %d bytes (want %d), Content-Type %q, Cache-Control %q, ETag %q", resp.Status, len(body), len(want),
			resp.Header.Get("Content-Type"), resp.Header.Get("Cache-Control"), resp.Header.Get("ETag"))
	}
	if resp, _ := get(t, http.DefaultClient, srv.URL+"/img/"+imgs[0].Name(), append(auth, "If-None-Match", resp.Header.Get("ETag"))...); resp.StatusCode != http.StatusNotModified {
		t.Errorf("image with its ETag: %s, want 304", resp.Status)
	}
	for _, c := range []struct {
		path, says string
		status     int
	}{
		{"/img/" + strings.Repeat("0", 64) + ".png", "not in the run's store", 404},
		{"/img/nothex.png", "image", 400},
		{"/?reward_min=abc", "reward_min", 400},
		{"/?quarantined=maybe", "quarantined", 400},
		{"/?page=0", "page", 400},
		{"/attempt", "id: missing", 400},
		{"/attempt?id=nope", `attempt "nope"`, 404},
		{"/group?id=nope", `group "nope"`, 404},
		{"/static/secret.txt", "not found", 404},
	} {
		resp, body := get(t, http.DefaultClient, srv.URL+c.path, auth...)
		if resp.StatusCode != c.status || !strings.Contains(body, c.says) {
			t.Errorf("GET %s: %s %q; want %d saying %q", c.path, resp.Status, body, c.status, c.says)
		}
	}
	// An attempt that started before the screen settled says so; the
	// others do not.
	for id, want := range map[string]bool{"r-save-0": true, "r-save-1": false} {
		_, body := get(t, http.DefaultClient, srv.URL+"/attempt?id="+id, auth...)
		if got := strings.Contains(body, "started before the screen settled"); got != want {
			t.Errorf("attempt %s says it started before the screen settled: %v, want %v", id, got, want)
		}
	}
	// Filters narrow the attempts listed.
	for q, ids := range map[string][]string{
		"":                 {"r-save-0", "r-save-1", "r-other-0"},
		"?task=t-save":     {"r-save-0", "r-save-1"},
		"?quarantined=yes": {"r-other-0"},
		"?reward_min=0.5":  {"r-save-0"},
	} {
		_, body := get(t, http.DefaultClient, srv.URL+"/"+q, auth...)
		for _, id := range []string{"r-save-0", "r-save-1", "r-other-0"} {
			listed := strings.Contains(body, `data-rollout="`+id+`"`)
			if listed != contains(ids, id) {
				t.Errorf("run page %q: %s listed %v, want %v", q, id, listed, !listed)
			}
		}
	}
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// TestOpenNotRun checks that a directory without records is refused
// with ErrNotRun.
func TestOpenNotRun(t *testing.T) {
	_, err := view.Open(t.TempDir())
	if err == nil || !strings.Contains(err.Error(), "not a run directory") {
		t.Fatalf("Open of an empty directory: %v, want ErrNotRun", err)
	}
}

// TestAttemptReplayRegrade checks that an attempt's page shows what
// replay.json and regrades.jsonl say of it: the replayed reward, the step
// whose screen diverged and by how much, the regraded reward.
func TestAttemptReplayRegrade(t *testing.T) {
	dir := writeFixture(t)
	replay := `{"schema":"legato.replay/v0","attempts":[{"rollout_id":"r-save-0","task_id":"t-save","recorded_reward":1,"replayed_reward":0,"reward_agrees":false,` +
		`"first_divergence":1,"screens":[{"step":0,"identical":true,"distance":0,"recorded":"a","replayed":"a"},{"step":1,"identical":false,"distance":0.125,"recorded":"b","replayed":"c"}]}]}`
	if err := os.WriteFile(filepath.Join(dir, "replay.json"), []byte(replay), 0o644); err != nil {
		t.Fatal(err)
	}
	regrade := `{"rollout_id":"r-save-0","task_id":"t-save","reward":1,"regraded":0.5,"task_sha256":"new","recorded_task_sha256":"old","end_state":"e","at":"2026-12-02T10:00:00.000Z"}` + "\n"
	if err := os.WriteFile(filepath.Join(dir, "regrades.jsonl"), []byte(regrade), 0o644); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(view.Handler(openRun(t, dir), token))
	defer srv.Close()
	_, body := get(t, http.DefaultClient, srv.URL+"/attempt?id=r-save-0", "Authorization", "Bearer "+token)
	for _, want := range []string{
		`<p id="replay">replayed: reward 0 (recorded 1) <span class="q">disagrees</span>; <span class="q">screens diverge from step 1</span>`,
		"the replayed screen differs: 12.50% of pixels",
		`<p id="regrade">regraded 2026-12-02T10:00:00.000Z: 0.5 (recorded 1); the task changed since (old → new)`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("attempt page lacks %q", want)
		}
	}
	_, body = get(t, http.DefaultClient, srv.URL+"/attempt?id=r-save-1", "Authorization", "Bearer "+token)
	if strings.Contains(body, `id="replay"`) || strings.Contains(body, `id="regrade"`) {
		t.Error("an attempt neither replayed nor regraded shows a replay or a regrade")
	}
}

// TestLiveRun checks that the pages follow a run being written: records
// appended show, a torn tail counts as unreadable until its line is whole,
// and a file rewritten shorter is indexed again from its start.
func TestLiveRun(t *testing.T) {
	dir := writeFixture(t)
	srv := httptest.NewServer(view.Handler(openRun(t, dir), token))
	defer srv.Close()
	listed := func() (ids []string, torn bool) {
		t.Helper()
		_, body := get(t, http.DefaultClient, srv.URL+"/", "Authorization", "Bearer "+token)
		for _, m := range regexp.MustCompile(`class="attempt" data-rollout="([^"]+)"`).FindAllStringSubmatch(body, -1) {
			ids = append(ids, m[1])
		}
		return ids, strings.Contains(body, "unreadable line(s)")
	}
	check := func(what string, wantIDs []string, wantTorn bool) {
		t.Helper()
		ids, torn := listed()
		if diff := cmp.Diff(wantIDs, ids); diff != "" || torn != wantTorn {
			t.Errorf("%s: attempts (-want +got):\n%s; torn lines shown %v, want %v", what, diff, torn, wantTorn)
		}
	}
	check("at first", []string{"r-save-0", "r-save-1", "r-other-0"}, false)

	w, err := schema.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Append(&schema.Record{RolloutID: "r-new", TaskID: "t-new", GroupID: "v1/t-new", Status: schema.StatusOK, Reward: new(1.0)}); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	check("after an append", []string{"r-save-0", "r-save-1", "r-other-0", "r-new"}, false)

	path := filepath.Join(dir, schema.RecordsFile)
	appendTo := func(s string) {
		f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if _, err := f.WriteString(s); err != nil {
			t.Fatal(err)
		}
	}
	appendTo(`{"schema":"legato.rollout/v0","rollout_id":"r-late","status":"ok"`)
	check("with a torn tail", []string{"r-save-0", "r-save-1", "r-other-0", "r-new"}, true)
	appendTo("}\n")
	check("once the tail is whole", []string{"r-save-0", "r-save-1", "r-other-0", "r-new", "r-late"}, false)

	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	first, _, _ := strings.Cut(string(data), "\n")
	if err := os.WriteFile(path, []byte(first+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	check("rewritten shorter", []string{"r-save-0"}, false)
}

// TestStaticSelfContained checks the exported pages: every link is
// relative and names a file of the export, nothing is loaded from the
// network, and html/template rejected no value.
func TestStaticSelfContained(t *testing.T) {
	out := filepath.Join(t.TempDir(), "pages")
	if _, err := view.WriteStatic(openRun(t, writeFixture(t)), out); err != nil {
		t.Fatal(err)
	}
	pages, _ := filepath.Glob(filepath.Join(out, "*.html"))
	if len(pages) != 6 {
		t.Fatalf("%d pages, want 6", len(pages))
	}
	ref := regexp.MustCompile(`(?:href|src)="([^"#]*)`)
	for _, p := range pages {
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		for _, bad := range []string{"http:", "https:", "ZgotmplZ", "@import", "url("} {
			if strings.Contains(string(data), bad) {
				t.Errorf("%s contains %q", filepath.Base(p), bad)
			}
		}
		for _, m := range ref.FindAllStringSubmatch(string(data), -1) {
			if m[1] == "" {
				continue
			}
			if _, err := os.Stat(filepath.Join(out, m[1])); err != nil {
				t.Errorf("%s links %q, which the export lacks", filepath.Base(p), m[1])
			}
		}
	}
}

// TestGroupAdvantageStd: a group's page shows the advantages with the std
// the batch recorded, as export writes them: t-save's rewards 1 and 0 get
// ±1 with the population std, ±1/√2 with the sample std.
func TestGroupAdvantageStd(t *testing.T) {
	for _, c := range []struct {
		kind schema.AdvantageStd
		want []string
	}{
		// html/template writes + as &#43;.
		{schema.PopulationStd, []string{"advantage &#43;1.000", "advantage -1.000"}},
		{schema.SampleStd, []string{"advantage &#43;0.707", "advantage -0.707"}},
	} {
		t.Run(string(c.kind), func(t *testing.T) {
			dir := writeFixture(t)
			b, err := schema.ReadBatch(dir)
			if err != nil {
				t.Fatal(err)
			}
			b.AdvantageStd = c.kind
			run, err := schema.Create(dir)
			if err != nil {
				t.Fatal(err)
			}
			err = run.WriteBatch(b)
			run.Close()
			if err != nil {
				t.Fatal(err)
			}
			srv := httptest.NewServer(view.Handler(openRun(t, dir), token))
			defer srv.Close()
			resp, body := get(t, http.DefaultClient, srv.URL+"/group?id=v1/t-save", "Authorization", "Bearer "+token)
			if resp.StatusCode != 200 {
				t.Fatalf("group page: %s", resp.Status)
			}
			for _, w := range c.want {
				if !strings.Contains(body, w) {
					t.Errorf("%s std: the group page does not say %q", c.kind, w)
				}
			}
		})
	}
}
