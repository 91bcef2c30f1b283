package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	rl "legato/rl"
	"legato/rl/desktop"
	"legato/rl/desktop/fake"
	"legato/rl/internal/httpapi/httpapitest"
	"legato/rl/policy/policytest"
)

// testService is a service in this process on one fake desktop against a
// scripted model server, with the task t0 of domain os; its run directory
// is out.
func testService(t *testing.T, pol rl.PolicyConfig) (svc *rl.Service, out string) {
	t.Helper()
	if pol.BaseURL == "" {
		srv := policytest.NewServer(policytest.Options{NoLatency: true})
		t.Cleanup(srv.Close)
		pol.BaseURL = srv.URL()
	}
	pol.Model, pol.Version = "scripted", "v1"
	out = filepath.Join(t.TempDir(), "run")
	svc, err := rl.Serve(t.Context(), pol,
		rl.ServeOptions{CollectOptions: rl.CollectOptions{Out: out,
			NewDesktop: fake.NewFleet(fake.Config{Width: 320, Height: 192}).New, Desktops: 1, Group: 1, MaxSteps: 2,
			Ready: desktop.ReadyOptions{Interval: time.Millisecond, Max: 50 * time.Millisecond}},
			Tasks: []rl.Task{{ID: "t0", Domain: "os", Instruction: "x", Evaluator: json.RawMessage(`{"func":"exact_match"}`)}}})
	if err != nil {
		t.Fatal(err)
	}
	return svc, out
}

// TestServeHTTP checks the HTTP front's answers to bad requests and its
// bearer token, on a service in this process.
func TestServeHTTP(t *testing.T) {
	svc, out := testService(t, rl.PolicyConfig{})
	defer svc.Close(context.Background())
	h := httptest.NewServer(New(svc, Options{Token: "s3cret"}))
	defer h.Close()
	do := func(method, path, authz, body string) (int, string) {
		return httpapitest.Call(t, method, h.URL+path, authz, body)
	}
	const ok = "Bearer s3cret"
	task := `{"task_id": "t1", "domain": "os", "config": {"id": "t1", "instruction": "x", "evaluator": {"func": "exact_match"}}}`
	for _, tt := range []struct {
		method, path, authz, body string
		status                    int
		words                     string
	}{
		{"GET", "/v1/status", "", "", 401, "bearer token"},
		{"GET", "/v1/status", "Bearer wrong", "", 401, "bearer token"},
		{"GET", "/v1/status", "bearer s3cret", "", 200, `"desktops":1`}, // RFC 7235: the scheme is case-insensitive
		{"GET", "/v1/status", "BEARER  s3cret", "", 200, `"desktops":1`},
		{"GET", "/v1/status", "Basic s3cret", "", 401, "bearer token"},
		{"GET", "/v1/status", "s3cret", "", 401, "bearer token"},
		{"POST", "/v1/groups", ok, `{"task": ` + task + `, "group_size": 2000}`, 400, "group_size 2000"},
		{"POST", "/v1/groups", ok, `{"task": ` + task + `, "group_size": 0}`, 400, "group_size 0"},
		{"POST", "/v1/groups", ok, `{"task": ` + task + `, "group_size": -1}`, 400, "group_size -1"},
		{"POST", "/v1/groups", ok, `{"task": {"task_id": "t0", "domain": "chrome"}}`, 400, `domain \"chrome\"`},
		{"POST", "/v1/groups", ok, `{"task": {"task_id": "t0", "domain": "os", "extra": 1}}`, 400, "extra: unknown field"},
		{"POST", "/v1/groups", ok, `{"task": ` + task + `} {}`, 400, "more than one JSON value"},
		{"POST", "/v1/groups", ok, `not json`, 400, "body"},
		{"GET", "/v1/groups/g1?wait=-1", ok, "", 400, "wait="},
		{"GET", "/v1/groups/g1?wait=NaN", ok, "", 400, `wait=\"NaN\"`},
		{"GET", "/v1/stream?limit=x", ok, "", 400, "limit="},
		{"GET", "/v1/stream?steps=some", ok, "", 400, `steps=\"some\": want full, prefix or none`},
		{"GET", "/v1/groups/g1?images=all", ok, "", 400, `images=\"all\": want refs`},
		{"POST", "/v1/policy", ok, `{"state": "serving", "version": "a\nb"}`, 400, "version"},
		{"POST", "/v1/policy", ok, `{"state": "serving", "version": "v2\u0000"}`, 400, `version \"v2\\x00\"`},
		{"POST", "/v1/policy", ok, `{"state": "serving", "version": "v2\u001b[2J"}`, 400, "control character"},
		{"POST", "/v1/policy", ok, `{"state": "serving", "version": "v2"}`, 200, `"version":"v2"`},
		{"POST", "/v1/policy", ok, `{"state": "serving", "version": "v1"}`, 409, `version \"v1\" came into force before \"v2\"`},
		{"POST", "/v1/policy", ok, `{"state": "serving", "version": "v1"}`, 409, `\"force\": true`},
		{"POST", "/v1/policy", ok, `{"state": "serving", "version": "v1", "force": true}`, 200, `"version":"v1"`},
		{"POST", "/v1/policy", ok, `{"state": "serving", "drain": true}`, 400, `drain: goes with \"state\": \"paused\"`},
		{"POST", "/v1/policy", ok, `{"state": "paused", "drain": true}`, 200, `"state":"paused","since"`},
		{"GET", "/v1/policy", ok, "", 200, `"in_flight":0,"servers":["http://127.0.0.1:`},
		{"POST", "/v1/policy", ok, `{"state": "serving"}`, 200, `"state":"serving"`},
		{"GET", "/v1/blobs/zz", ok, "", 400, "sha256"},
		{"PUT", "/v1/groups", ok, "", 404, "no endpoint PUT /v1/groups"},
		// Last: a stream that took NaN for no bound would wait here for ever.
		{"GET", "/v1/stream?wait=nan", ok, "", 400, `wait=\"nan\"`},
		{"GET", "/v1/stream?wait=Inf", ok, "", 400, `wait=\"Inf\"`},
		{"POST", "/v1/groups", ok, `{"task": ` + task + `, "group_size": 1}`, 201, `"id":"g000001"`},
	} {
		// Each is answered at once, unless it waits for nothing by mistake.
		status, body := httpapitest.CallWithin(t, time.Minute, tt.method, h.URL+tt.path, tt.authz, tt.body)
		if status != tt.status || !strings.Contains(body, tt.words) {
			t.Errorf("%s %s (%s): %d %s, want %d with %q", tt.method, tt.path, tt.body, status, body, tt.status, tt.words)
		}
		if status >= 400 {
			var e struct{ Error string }
			if json.Unmarshal([]byte(body), &e) != nil || e.Error == "" {
				t.Errorf("%s %s: error body %q is not {\"error\": ...}", tt.method, tt.path, body)
			}
		}
	}
	// Only the versions accepted were journaled, the reset marked so (then
	// the drained pause and the serving after it).
	var versions []string
	for _, line := range httpapitest.JournalLines(t, out) {
		if line["op"] == "policy" {
			versions = append(versions, fmt.Sprint(line["version"], " force=", line["force"] == true))
		}
	}
	if want := []string{"v2 force=false", "v1 force=true", "v1 force=false", "v1 force=false"}; !slices.Equal(versions, want) {
		t.Errorf("policy changes journaled %q, want %q", versions, want)
	}
	// Once the group ended (waited for as an event: on a loaded machine
	// at -race it took longer than the stream's idle bound below), the
	// stream hands it over, then waits for more until that bound.
	if status, body := do("GET", "/v1/groups/g000001?wait=300", ok, ""); status != 200 || !strings.Contains(body, `"state":"closed"`) || !strings.Contains(body, `"cursor":1`) {
		t.Fatalf("group g000001: %d %s, want it ended", status, body)
	}
	status, body := do("GET", "/v1/stream?after=0&wait=0.2", ok, "")
	lines := bytes.Split(bytes.TrimSpace([]byte(body)), []byte("\n"))
	if status != 200 || len(lines) != 1 || !bytes.Contains(lines[0], []byte(`"cursor":1`)) {
		t.Errorf("stream: %d %q, want one line with cursor 1", status, body)
	}
	_, metrics := do("GET", "/metrics", ok, "")
	for _, want := range []string{"# TYPE legato_groups gauge\n", `legato_groups{state="closed"} 1` + "\n",
		`legato_records_total{status="ok"} 1` + "\n", "legato_stream_cursor 1\n", "legato_policy_paused 0\n"} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %q:\n%s", want, metrics)
		}
	}
}

// TestServeAuthEveryRoute: every route, and a path that is none, refuses
// a caller without the token, with a wrong one or another scheme; with
// --metrics-open, /metrics alone answers without it.
func TestServeAuthEveryRoute(t *testing.T) {
	svc, _ := testService(t, rl.PolicyConfig{})
	defer svc.Close(context.Background())
	closed := httptest.NewServer(New(svc, Options{Token: "s3cret"}))
	defer closed.Close()
	open := httptest.NewServer(New(svc, Options{Token: "s3cret", MetricsOpen: true}))
	defer open.Close()
	patterns := slices.Sorted(maps.Keys((&handler{}).routes()))
	patterns = append(patterns, "PUT /v1/nothing")
	if len(patterns) < 10 {
		t.Fatalf("routes %q: too few", patterns)
	}
	path := strings.NewReplacer("{id}", "g000001", "{sha}", strings.Repeat("0", 64))
	for _, p := range patterns {
		method, route, _ := strings.Cut(path.Replace(p), " ")
		for _, authz := range []string{"", "Bearer", "Bearer ", "Bearer wrong", "Bearer s3cret2", "Bearer s3cre", "Basic czNjcmV0", "s3cret", "Token s3cret"} {
			if status, body := httpapitest.Call(t, method, closed.URL+route, authz, `{"state": "paused"}`); status != http.StatusUnauthorized {
				t.Errorf("%s %s with Authorization %q: %d %s, want 401", method, route, authz, status, body)
			}
			status, _ := httpapitest.Call(t, method, open.URL+route, authz, `{"state": "paused"}`)
			if want := http.StatusUnauthorized; route == "/metrics" {
				if status != http.StatusOK {
					t.Errorf("--metrics-open: GET /metrics with Authorization %q: %d, want 200", authz, status)
				}
			} else if status != want {
				t.Errorf("--metrics-open: %s %s with Authorization %q: %d, want 401", method, route, authz, status)
			}
		}
	}
	if p := svc.Policy(); p.Paused {
		t.Error("a caller without the token paused the policy")
	}
}

// submitOne submits a group of one attempt of task t0 with the bearer
// header auth and returns what the service answered with.
func submitOne(t *testing.T, url, auth string) (g struct{ ID string }) {
	t.Helper()
	status, body := httpapitest.Call(t, "POST", url+"/v1/groups", auth, `{"task": {"task_id": "t0", "domain": "os"}, "group_size": 1}`)
	if status != http.StatusCreated {
		t.Fatalf("submit: %d %s", status, body)
	}
	if err := json.Unmarshal([]byte(body), &g); err != nil {
		t.Fatal(err)
	}
	return g
}

// TestServeBatchBlobs: POST /v1/blobs answers every screenshot of a group
// in one call, the same bytes as one GET each; a bad or unknown hash, or
// none, is refused.
func TestServeBatchBlobs(t *testing.T) {
	svc, _ := testService(t, rl.PolicyConfig{})
	defer svc.Close(context.Background())
	h := httptest.NewServer(New(svc, Options{Token: "s3cret"}))
	defer h.Close()
	const ok = "Bearer s3cret"
	g := submitOne(t, h.URL, ok)
	status, body := httpapitest.Call(t, "GET", h.URL+"/v1/groups/"+g.ID+"?wait=300", ok, "")
	var res rl.GroupResult
	if err := json.Unmarshal([]byte(body), &res); err != nil || status != http.StatusOK || !res.State.Ended() {
		t.Fatalf("group: %d %v %s", status, err, body)
	}
	var shas []string
	for _, a := range res.Attempts {
		for _, st := range a.Steps {
			for _, img := range st.Images {
				shas = append(shas, img.SHA256)
			}
		}
	}
	if len(shas) < 2 {
		t.Fatalf("%d screenshots listed; want the steps' images", len(shas))
	}
	req, _ := json.Marshal(map[string]any{"sha256": append(shas, shas[0])})
	status, body = httpapitest.Call(t, "POST", h.URL+"/v1/blobs", ok, string(req))
	var got struct{ Blobs map[string][]byte }
	if err := json.Unmarshal([]byte(body), &got); err != nil || status != http.StatusOK {
		t.Fatalf("batch: %d %v %.200s", status, err, body)
	}
	for _, sha := range shas {
		st, one := httpapitest.Call(t, "GET", h.URL+"/v1/blobs/"+sha, ok, "")
		if st != http.StatusOK || !bytes.Equal(got.Blobs[sha], []byte(one)) {
			t.Errorf("blob %s: %d bytes in the batch, %d from GET (%d)", sha, len(got.Blobs[sha]), len(one), st)
		}
	}
	for _, tt := range []struct {
		body   string
		status int
		words  string
	}{
		{`{"sha256": []}`, 400, "0 hashes; want 1 to 256"},
		{`{"sha256": ["zz"]}`, 400, "sha256"},
		{`{"sha256": ["` + strings.Repeat("ab", 32) + `"]}`, 404, ""},
		{`{"sha": ["x"]}`, 400, "unknown field"},
	} {
		if status, body := httpapitest.Call(t, "POST", h.URL+"/v1/blobs", ok, tt.body); status != tt.status || !strings.Contains(body, tt.words) {
			t.Errorf("POST /v1/blobs %s: %d %s; want %d with %q", tt.body, status, body, tt.status, tt.words)
		}
	}
}

// TestGroupAdvantageStd: an ended group, as GET /v1/groups/{id} and the
// stream give it, says which std divided its advantages (the service's
// default, population), for a trainer that would compute its own.
func TestGroupAdvantageStd(t *testing.T) {
	svc, _ := testService(t, rl.PolicyConfig{})
	defer svc.Close(context.Background())
	h := httptest.NewServer(New(svc, Options{Token: "s3cret"}))
	defer h.Close()
	const ok = "Bearer s3cret"
	g := submitOne(t, h.URL, ok)
	for _, path := range []string{"/v1/groups/" + g.ID + "?wait=300&steps=none", "/v1/stream?after=0&limit=1&steps=none"} {
		status, body := httpapitest.Call(t, "GET", h.URL+path, ok, "")
		if status != http.StatusOK || !strings.Contains(body, `"advantage_std":"population"`) {
			t.Errorf("GET %s: %d %.300s; want the group's advantage_std population", path, status, body)
		}
	}
}
