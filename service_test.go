package rl

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"legato/rl/desktop"
	"legato/rl/desktop/fake"
	"legato/rl/policy/policytest"
	"legato/rl/schema"
)

// serviceEnv is a service on fake desktops against a scripted server on
// loopback, in real time.
type serviceEnv struct {
	srv   *policytest.Server
	fleet *fake.Fleet
	pol   PolicyConfig
	opts  ServeOptions
}

func newServiceEnv(t *testing.T, srvOpts policytest.Options) *serviceEnv {
	t.Helper()
	srvOpts.NoLatency = true
	srv := policytest.NewServer(srvOpts)
	t.Cleanup(srv.Close)
	fleet := fake.NewFleet(fake.Config{Width: testWidth, Height: testHeight, DefaultReward: fake.Reward{P: 0.5}, Seed: 3})
	return &serviceEnv{
		srv: srv, fleet: fleet,
		pol: PolicyConfig{BaseURL: srv.URL(), Model: "scripted", Version: "v1", StepTimeout: 30 * time.Second},
		opts: ServeOptions{CollectOptions: CollectOptions{
			Out: filepath.Join(t.TempDir(), "run"), NewDesktop: fleet.New, Desktops: 2, Group: 2, MaxSteps: 4,
			Ready: desktop.ReadyOptions{Interval: time.Millisecond, Max: 100 * time.Millisecond},
		}},
	}
}

func (e *serviceEnv) serve(t *testing.T) *Service {
	t.Helper()
	s, err := Serve(t.Context(), e.pol, e.opts)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// inlineTask is a submission's task entry carrying task i's config.
func inlineTask(i int) json.RawMessage {
	return json.RawMessage(fmt.Sprintf(`{"task_id": "t%d", "domain": "os", "config": {"id": "t%d", "instruction": "do thing %d", "evaluator": {"func": "exact_match"}}}`, i, i, i))
}

func waitEnded(t *testing.T, s *Service, id string) GroupInfo {
	t.Helper()
	info, err := s.Wait(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	if !info.State.Ended() {
		t.Fatalf("group %s: %s when the wait returned", id, info.State)
	}
	return info
}

func TestServiceGroups(t *testing.T) {
	e := newServiceEnv(t, policytest.Options{Script: clicksThenDone(2)})
	s := e.serve(t)
	defer s.Close(context.Background())
	var ids []string
	for i := range 3 {
		info, created, err := s.Submit(GroupRequest{Task: inlineTask(i), Size: 2 + i%2})
		if err != nil || !created {
			t.Fatalf("submit %d: created %v, %v", i, created, err)
		}
		ids = append(ids, info.ID)
	}
	for i, id := range ids {
		info := waitEnded(t, s, id)
		if info.State != GroupClosed || info.Cursor == 0 {
			t.Errorf("group %s: %+v, want closed with a cursor", id, info)
		}
		res, err := s.Result(id, ResultOptions{})
		if err != nil {
			t.Fatal(err)
		}
		counted, sum := 0, 0.0
		for _, a := range res.Attempts {
			if a.Masked {
				continue
			}
			counted++
			sum += *a.Advantage
			if len(a.Steps) != 3 {
				t.Errorf("attempt %s: %d steps, want 3", a.RolloutID, len(a.Steps))
			}
			for _, st := range a.Steps {
				if st.PolicyVersion != "v1" || st.GroupID != id || len(st.ResponseTokenIDs) == 0 {
					t.Errorf("attempt %s step %d: version %q group %q ids %d", a.RolloutID, st.Step, st.PolicyVersion, st.GroupID, len(st.ResponseTokenIDs))
				}
			}
		}
		if counted != 2+i%2 || sum > 1e-9 || sum < -1e-9 {
			t.Errorf("group %s: %d counted attempts with advantages summing to %v, want %d and 0", id, counted, sum, 2+i%2)
		}
	}
	// The stream holds every group once, in the order they ended.
	got := s.Ended(0, 0)
	if len(got) != 3 {
		t.Fatalf("stream %v, want 3 groups", got)
	}
	for i, id := range got {
		info, _ := s.Info(id)
		if info.Cursor != i+1 {
			t.Errorf("stream[%d] = %s with cursor %d", i, id, info.Cursor)
		}
	}
	// The same key names the same group; another task under it is refused.
	a, created, err := s.Submit(GroupRequest{Task: inlineTask(7), Key: "k1"})
	if err != nil || !created {
		t.Fatal(created, err)
	}
	b, created, err := s.Submit(GroupRequest{Task: inlineTask(7), Key: "k1"})
	if err != nil || created || b.ID != a.ID {
		t.Errorf("resubmit with key: %+v created %v %v, want group %s again", b, created, err, a.ID)
	}
	if _, _, err := s.Submit(GroupRequest{Task: inlineTask(8), Key: "k1"}); !errors.Is(err, ErrKeyConflict) {
		t.Errorf("another task under the key: %v, want ErrKeyConflict", err)
	}
	if _, _, err := s.Submit(GroupRequest{Task: json.RawMessage(`{"task_id": "nope"}`)}); !IsUnknownTask(err) {
		t.Errorf("submit an unknown task: %v, want IsUnknownTask", err)
	}
	for _, bad := range []GroupRequest{{}, {Task: inlineTask(1), Size: -1},
		{Task: json.RawMessage(`{"task_id": "x", "config": {"id": "x"}}`)}, {Task: inlineTask(1), Key: "a/b"}} {
		if _, _, err := s.Submit(bad); !errors.Is(err, ErrBadRequest) {
			t.Errorf("submit %s size %d key %q: %v, want ErrBadRequest", bad.Task, bad.Size, bad.Key, err)
		}
	}
	waitEnded(t, s, a.ID)
	if _, err := s.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	checkClosed(t, e.fleet)
}

// TestServicePause: calls made while the policy is paused wait at the gate,
// and go out with the version the trainer then serves.
func TestServicePause(t *testing.T) {
	e := newServiceEnv(t, policytest.Options{Script: clicksThenDone(1)})
	s := e.serve(t)
	defer s.Close(context.Background())
	if _, err := s.SetPolicy("", true); err != nil {
		t.Fatal(err)
	}
	info, _, err := s.Submit(GroupRequest{Task: inlineTask(0)})
	if err != nil {
		t.Fatal(err)
	}
	// Both desktops reach their first model call and wait there.
	for s.Policy().Held < 2 {
		select {
		case <-t.Context().Done():
			t.Fatal("the attempts never reached the gate")
		case <-time.After(5 * time.Millisecond):
		}
	}
	if st, err := s.SetPolicy("v2", false); err != nil || st.Version != "v2" || st.Paused {
		t.Fatalf("serve v2: %+v %v", st, err)
	}
	waitEnded(t, s, info.ID)
	res, err := s.Result(info.ID, ResultOptions{})
	if err != nil {
		t.Fatal(err)
	}
	steps := 0
	for _, a := range res.Attempts {
		for _, st := range a.Steps {
			steps++
			if st.PolicyVersion != "v2" {
				t.Errorf("attempt %s step %d: version %q, want v2", a.RolloutID, st.Step, st.PolicyVersion)
			}
		}
	}
	if steps == 0 {
		t.Fatal("no steps")
	}
}

// TestServiceRestart: a service continued in its directory keeps its
// stream, its policy and its groups; cancelled groups stay cancelled.
func TestServiceRestart(t *testing.T) {
	e := newServiceEnv(t, policytest.Options{Script: clicksThenDone(1)})
	s := e.serve(t)
	first, _, err := s.Submit(GroupRequest{Task: inlineTask(0), Key: "first"})
	if err != nil {
		t.Fatal(err)
	}
	waitEnded(t, s, first.ID)
	if _, err := s.SetPolicy("v7", true); err != nil {
		t.Fatal(err)
	}
	held, _, err := s.Submit(GroupRequest{Task: inlineTask(1)})
	if err != nil {
		t.Fatal(err)
	}
	dropped, _, err := s.Submit(GroupRequest{Task: inlineTask(2)})
	if err != nil {
		t.Fatal(err)
	}
	if info, err := s.Cancel(t.Context(), dropped.ID); err != nil || info.State != GroupCancelled {
		t.Fatalf("cancel: %+v %v", info, err)
	}
	if _, err := s.Close(context.Background()); err != nil {
		t.Fatal(err)
	}

	s2 := e.serve(t)
	defer s2.Close(context.Background())
	if p := s2.Policy(); p.Version != "v7" || !p.Paused {
		t.Errorf("policy after restart %+v, want v7 paused", p)
	}
	if got := s2.Ended(0, 0); len(got) != 2 || got[0] != first.ID || got[1] != dropped.ID {
		t.Errorf("stream after restart %v, want [%s %s]", got, first.ID, dropped.ID)
	}
	if again, created, err := s2.Submit(GroupRequest{Task: inlineTask(0), Key: "first"}); err != nil || created || again.ID != first.ID {
		t.Errorf("the key after restart: %+v %v %v", again, created, err)
	}
	next, _, err := s2.Submit(GroupRequest{Task: inlineTask(3)})
	if err != nil {
		t.Fatal(err)
	}
	if next.ID == held.ID || next.ID == dropped.ID || next.ID == first.ID {
		t.Errorf("new group id %s reuses an old one", next.ID)
	}
	if _, err := s2.SetPolicy("v8", false); err != nil {
		t.Fatal(err)
	}
	if info := waitEnded(t, s2, held.ID); info.State != GroupClosed || info.Cursor != 3 && info.Cursor != 4 {
		t.Errorf("held group after restart: %+v", info)
	}
	res, err := s2.Result(held.ID, ResultOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range res.Attempts {
		for _, st := range a.Steps {
			if st.PolicyVersion != "v8" {
				t.Errorf("held group's step version %q, want v8", st.PolicyVersion)
			}
		}
	}
	waitEnded(t, s2, next.ID)
	ctx, cancel := context.WithTimeout(t.Context(), time.Millisecond)
	defer cancel()
	if s2.WaitEnded(ctx, 4) {
		t.Error("WaitEnded past the last cursor reported a group")
	}
}

// TestCollectAborted: a server that aborts generations mid-batch (a
// trainer pausing it) costs time only: every group closes, no step keeps
// an aborted fragment, and a step says the server's weight version.
func TestCollectAborted(t *testing.T) {
	srv := policytest.NewServer(policytest.Options{NoLatency: true, Dialect: policytest.SGLang, Script: clicksThenDone(2),
		Faults: policytest.FaultEvery(3, policytest.FaultAbort), WeightVersion: func() string { return "w9" }})
	defer srv.Close()
	fleet := fake.NewFleet(fake.Config{Width: testWidth, Height: testHeight})
	out := filepath.Join(t.TempDir(), "run")
	_, err := Collect(t.Context(), testTasks(4), PolicyConfig{BaseURL: srv.URL(), Model: "scripted", Version: "v1", Retries: 1},
		CollectOptions{Out: out, NewDesktop: fleet.New, Desktops: 2, Group: 2,
			Ready: desktop.ReadyOptions{Interval: time.Millisecond, Max: 100 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	if st := srv.Stats(); st.Faults == 0 {
		t.Fatal("the server aborted nothing")
	}
	for _, r := range readRecords(t, out) {
		if r.Status != StatusOK {
			t.Errorf("rollout %s: %s %+v", r.RolloutID, r.Status, r.Error)
		}
		for i, st := range r.Steps {
			if st.Response.FinishReason == "abort" || st.PolicyVersion != "w9" {
				t.Errorf("rollout %s step %d: finish %q version %q", r.RolloutID, i, st.Response.FinishReason, st.PolicyVersion)
			}
		}
	}
}

// heldCalls makes a scripted server hold its first calls until the test
// lets each through, so that each goes out under the one version the test
// serves for it.
type heldCalls struct {
	n                 atomic.Int32
	arrived, released chan struct{}
}

// script holds the first n calls, then answers with next.
func (h *heldCalls) script(n int32, next func(policytest.Request) string) func(policytest.Request) string {
	h.arrived, h.released = make(chan struct{}), make(chan struct{})
	return func(req policytest.Request) string {
		if h.n.Add(1) <= n {
			h.arrived <- struct{}{}
			<-h.released
		}
		return next(req)
	}
}

// oneGroupOneCallPerVersion pauses s, submits a group and sends its first
// calls out one per version, pausing again before each is answered; it
// returns with the last version serving.
func (h *heldCalls) oneGroupOneCallPerVersion(t *testing.T, s *Service, versions ...string) GroupInfo {
	t.Helper()
	if _, err := s.SetPolicy("", true); err != nil {
		t.Fatal(err)
	}
	info, _, err := s.Submit(GroupRequest{Task: inlineTask(0)})
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range versions {
		if _, err := s.SetPolicy(v, false); err != nil {
			t.Fatal(err)
		}
		<-h.arrived
		if _, err := s.SetPolicy("", true); err != nil {
			t.Fatal(err)
		}
		h.released <- struct{}{}
	}
	if _, err := s.SetPolicy("", false); err != nil {
		t.Fatal(err)
	}
	return info
}

// TestServiceStaleness: steps say how many versions behind the group's end
// they are, and MaxStaleness drops the older ones.
func TestServiceStaleness(t *testing.T) {
	var calls heldCalls
	e := newServiceEnv(t, policytest.Options{Script: calls.script(3, clicksThenDone(2))})
	e.opts.MaxStaleness = 1
	e.opts.Desktops, e.opts.Group = 1, 1
	s := e.serve(t)
	defer s.Close(context.Background())
	// v1 for the first call, v2 and v3 for the next two: the group ends
	// under v3, so its first step is two versions behind.
	info := calls.oneGroupOneCallPerVersion(t, s, "v1", "v2", "v3")
	waitEnded(t, s, info.ID)
	res, err := s.Result(info.ID, ResultOptions{})
	if err != nil {
		t.Fatal(err)
	}
	a := res.Attempts[0]
	var got []string
	for _, st := range a.Steps {
		got = append(got, fmt.Sprintf("%s:%d", st.PolicyVersion, *st.Staleness))
	}
	if want := []string{"v2:1", "v3:0"}; fmt.Sprint(got) != fmt.Sprint(want) || a.StaleSteps != 1 {
		t.Errorf("steps %v with %d stale, want %v and 1 stale", got, a.StaleSteps, want)
	}
}

// TestServiceNoDesktops: a service whose desktops cannot be created stops,
// saying why, instead of taking groups it can never run.
func TestServiceNoDesktops(t *testing.T) {
	e := newServiceEnv(t, policytest.Options{})
	e.opts.Desktops = 1
	e.opts.NewDesktop = func(context.Context, int) (desktop.Desktop, error) { return nil, errors.New("no VM today") }
	s := e.serve(t)
	defer s.Close(context.Background())
	<-s.Done()
	if err := s.Err(); err == nil || !strings.Contains(err.Error(), "no VM today") {
		t.Errorf("service error %v, want the desktops' failure", err)
	}
	if _, _, err := s.Submit(GroupRequest{Task: inlineTask(0)}); !errors.Is(err, ErrServiceStopped) {
		t.Errorf("submit to a stopped service: %v, want ErrServiceStopped", err)
	}
}

// TestServiceContiguous: a group submitted with history contiguous, on a
// service whose own prompts evict screenshots, keeps every screenshot, and
// its graded attempts carry their sequence, whose loss mask covers exactly
// the generated ids; a per-step group of the same service has none.
func TestServiceContiguous(t *testing.T) {
	e := newServiceEnv(t, policytest.Options{Script: clicksThenDone(2)})
	e.opts.ImageMax = 1
	s := e.serve(t)
	defer s.Close(context.Background())
	info, _, err := s.Submit(GroupRequest{Task: inlineTask(0), History: "contiguous"})
	if err != nil {
		t.Fatal(err)
	}
	plain, _, err := s.Submit(GroupRequest{Task: inlineTask(1)})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Submit(GroupRequest{Task: inlineTask(2), History: "full"}); !errors.Is(err, ErrBadRequest) {
		t.Errorf("history full: %v, want ErrBadRequest", err)
	}
	waitEnded(t, s, plain.ID)
	pres, err := s.Result(plain.ID, ResultOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range pres.Attempts {
		if a.Sequence != nil {
			t.Errorf("per-step attempt %s has a sequence", a.RolloutID)
		}
	}
	waitEnded(t, s, info.ID)
	res, err := s.Result(info.ID, ResultOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if res.History != "contiguous" {
		t.Errorf("group history %q", res.History)
	}
	for _, a := range res.Attempts {
		if a.Sequence == nil {
			t.Fatalf("attempt %s: no sequence (%s)", a.RolloutID, a.SequenceError)
		}
		ones, generated := 0, 0
		for _, m := range a.Sequence.LossMask {
			ones += int(m)
		}
		for _, st := range a.Steps {
			generated += len(st.ResponseTokenIDs)
		}
		if ones != generated || len(a.Sequence.StepStarts) != 3 || a.Masked {
			t.Errorf("attempt %s: mask covers %d ids of %d generated, %d step starts, masked %v", a.RolloutID, ones, generated, len(a.Sequence.StepStarts), a.Masked)
		}
	}
}

// TestServiceGroupPolicy: a group with its own model server and key sends
// its calls there and records that model; a group whose server refuses its
// key fails alone, with policy errors, and the service goes on.
func TestServiceGroupPolicy(t *testing.T) {
	e := newServiceEnv(t, policytest.Options{Script: clicksThenDone(1)})
	own := policytest.NewServer(policytest.Options{NoLatency: true, Script: clicksThenDone(1), APIKey: "group-secret"})
	defer own.Close()
	s := e.serve(t)
	defer s.Close(context.Background())
	gp := &GroupPolicy{BaseURL: own.URL(), Model: "gateway-model"}
	good, _, err := s.Submit(GroupRequest{Task: inlineTask(0), Policy: gp, APIKey: "group-secret"})
	if err != nil {
		t.Fatal(err)
	}
	bad, _, err := s.Submit(GroupRequest{Task: inlineTask(1), Policy: gp, APIKey: "wrong"})
	if err != nil {
		t.Fatal(err)
	}
	plain, _, err := s.Submit(GroupRequest{Task: inlineTask(2)})
	if err != nil {
		t.Fatal(err)
	}
	if info := waitEnded(t, s, good.ID); info.State != GroupClosed {
		t.Errorf("group with its own server: %s", info.State)
	}
	if info := waitEnded(t, s, bad.ID); info.State != GroupShort {
		t.Errorf("group whose server refused its key: %s, want short", info.State)
	}
	if info := waitEnded(t, s, plain.ID); info.State != GroupClosed {
		t.Errorf("the service's own group after a refused one: %s", info.State)
	}
	byGroup := map[string][]schema.Record{}
	for _, r := range readRecords(t, e.opts.Out) {
		byGroup[r.GroupID] = append(byGroup[r.GroupID], r)
	}
	for _, r := range byGroup[good.ID] {
		if r.Policy.Model != "gateway-model" {
			t.Errorf("rollout %s: model %q, want gateway-model", r.RolloutID, r.Policy.Model)
		}
	}
	if len(byGroup[bad.ID]) == 0 {
		t.Error("no record of the refused group")
	}
	for _, r := range byGroup[bad.ID] {
		if r.Status != StatusError || r.Error == nil || r.Error.Kind != "policy" || strings.Contains(r.Error.Message, "wrong") {
			t.Errorf("refused rollout %s: %s %+v (the key must not show)", r.RolloutID, r.Status, r.Error)
		}
	}
	for _, r := range byGroup[plain.ID] {
		if r.Policy.Model != "scripted" || r.Status != StatusOK {
			t.Errorf("plain rollout %s: %s model %q", r.RolloutID, r.Status, r.Policy.Model)
		}
	}
	if own.Stats().Completed == 0 {
		t.Error("the group's own server completed no call")
	}
	if _, _, err := s.Submit(GroupRequest{Task: inlineTask(3), Policy: &GroupPolicy{BaseURL: "ftp://x"}}); !errors.Is(err, ErrBadRequest) {
		t.Errorf("a policy with a bad URL: %v, want ErrBadRequest", err)
	}
}

// TestServiceKeyNotKept: a group whose own server had a key is cancelled
// when the service continues after a restart, since keys are never
// stored; the key is in no file of the run directory.
func TestServiceKeyNotKept(t *testing.T) {
	e := newServiceEnv(t, policytest.Options{Script: clicksThenDone(1)})
	s := e.serve(t)
	if _, err := s.SetPolicy("", true); err != nil {
		t.Fatal(err)
	}
	keyed, _, err := s.Submit(GroupRequest{Task: inlineTask(0), Policy: &GroupPolicy{Model: "m2"}, APIKey: "sk-never-stored-42"})
	if err != nil {
		t.Fatal(err)
	}
	open, _, err := s.Submit(GroupRequest{Task: inlineTask(1), Policy: &GroupPolicy{Model: "scripted"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	s2 := e.serve(t)
	defer s2.Close(context.Background())
	if _, err := s2.SetPolicy("", false); err != nil {
		t.Fatal(err)
	}
	if info := waitEnded(t, s2, keyed.ID); info.State != GroupCancelled {
		t.Errorf("keyed group after a restart: %s, want cancelled", info.State)
	}
	if info := waitEnded(t, s2, open.ID); info.State != GroupClosed || info.Policy == nil || info.Policy.Model != "scripted" {
		t.Errorf("group with its own keyless policy after a restart: %+v", info)
	}
	err = filepath.WalkDir(e.opts.Out, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := os.ReadFile(p)
		if err == nil && bytes.Contains(data, []byte("sk-never-stored-42")) {
			t.Errorf("%s holds the group's key", p)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestServiceMovePolicy: serving a version with base URLs moves the calls
// sent from then on to those servers, across a restart too.
func TestServiceMovePolicy(t *testing.T) {
	e := newServiceEnv(t, policytest.Options{Script: clicksThenDone(1)})
	next := policytest.NewServer(policytest.Options{NoLatency: true, Script: clicksThenDone(1)})
	defer next.Close()
	s := e.serve(t)
	first, _, err := s.Submit(GroupRequest{Task: inlineTask(0)})
	if err != nil {
		t.Fatal(err)
	}
	waitEnded(t, s, first.ID)
	if _, err := s.SetPolicy("v2", false, "ftp://nowhere"); !errors.Is(err, ErrBadRequest) {
		t.Errorf("a bad base URL: %v, want ErrBadRequest", err)
	}
	if _, err := s.SetPolicy("v2", false, next.URL()); err != nil {
		t.Fatal(err)
	}
	before := e.srv.Stats().Requests
	moved, _, err := s.Submit(GroupRequest{Task: inlineTask(1)})
	if err != nil {
		t.Fatal(err)
	}
	waitEnded(t, s, moved.ID)
	if got := e.srv.Stats().Requests; got != before || next.Stats().Completed == 0 {
		t.Errorf("after the move the old server got %d more calls and the new one completed %d", got-before, next.Stats().Completed)
	}
	if _, err := s.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	s2 := e.serve(t)
	defer s2.Close(context.Background())
	n := next.Stats().Completed
	again, _, err := s2.Submit(GroupRequest{Task: inlineTask(2)})
	if err != nil {
		t.Fatal(err)
	}
	waitEnded(t, s2, again.ID)
	if e.srv.Stats().Requests != before || next.Stats().Completed == n {
		t.Error("after a restart the calls went back to --policy-url's server")
	}
}

// TestServiceStaleRerun: with StaleRerun, an attempt that finishes with a
// step too many versions behind runs again (a retried record of kind
// stale, not counted against EnvRetries), and its result is the rerun's.
func TestServiceStaleRerun(t *testing.T) {
	var calls heldCalls
	e := newServiceEnv(t, policytest.Options{Script: calls.script(3, clicksThenDone(2))})
	e.opts.MaxStaleness, e.opts.StaleRerun = 1, true
	e.opts.Desktops, e.opts.Group = 1, 1
	e.opts.EnvRetries = -1 // a stale rerun must not need one
	s := e.serve(t)
	defer s.Close(context.Background())
	info := calls.oneGroupOneCallPerVersion(t, s, "v1", "v2", "v3")
	if info := waitEnded(t, s, info.ID); info.State != GroupClosed {
		t.Fatalf("group %s", info.State)
	}
	var statuses []string
	for _, r := range readRecords(t, e.opts.Out) {
		kind := ""
		if r.Error != nil {
			kind = "/" + r.Error.Kind
		}
		statuses = append(statuses, string(r.Status)+kind)
	}
	if want := []string{"retried/stale", "ok"}; fmt.Sprint(statuses) != fmt.Sprint(want) {
		t.Errorf("records %v, want %v", statuses, want)
	}
	res, err := s.Result(info.ID, ResultOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range res.Attempts[0].Steps {
		if st.PolicyVersion != "v3" {
			t.Errorf("the rerun's step %d: version %s, want v3", st.Step, st.PolicyVersion)
		}
	}
}

func TestVersionAfter(t *testing.T) {
	seen := map[string]int{"v1": 0, "v2": 1, "step-41": 2, "step-42": 3}
	for _, tt := range []struct {
		cur, next string
		ok        bool
	}{
		{"v2", "v2", true},            // no change
		{"v2", "v3", true},            // new, larger number
		{"v2", "v10", true},           // numbers, not text, are compared
		{"v2", "v1", false},           // in force before
		{"step-42", "step-41", false}, // in force before
		{"step-42", "step-9", false},  // never seen, but a smaller number after the same text
		{"step-42", "step-042", false},
		{"step-42", "step-100", true},
		{"step-42", "ckpt-1", true}, // other text: a new name comes after
		{"", "v7", true},
		{"v2", "final", true},
	} {
		err := versionAfter(seen, tt.cur, tt.next)
		if (err == nil) != tt.ok || err != nil && !errors.Is(err, ErrVersionOrder) {
			t.Errorf("versionAfter(%q, %q) = %v, want ok %v", tt.cur, tt.next, err, tt.ok)
		}
	}
}

// TestServicePolicyOrder: versions only go up; a rollback is refused and
// leaves the journal as it was, ResetPolicy goes back on purpose and is
// journaled so, across a restart; a version that could not be stamped is
// refused.
func TestServicePolicyOrder(t *testing.T) {
	e := newServiceEnv(t, policytest.Options{Script: clicksThenDone(1)})
	s := e.serve(t)
	journal := func() string {
		b, err := os.ReadFile(filepath.Join(e.opts.Out, JournalFile))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	if _, err := s.SetPolicy("v2", false); err != nil {
		t.Fatal(err)
	}
	before := journal()
	if st, err := s.SetPolicy("v1", false); !errors.Is(err, ErrVersionOrder) || !strings.Contains(err.Error(), `"v1"`) {
		t.Errorf("v1 after v2: %+v %v, want ErrVersionOrder naming v1", st, err)
	}
	for _, v := range []string{"v3\x00", "v3\x1b[2J", "v3\u0085", "v3\xff", strings.Repeat("v", 257)} {
		if _, err := s.SetPolicy(v, false); !errors.Is(err, ErrBadRequest) || !strings.Contains(err.Error(), "version") {
			t.Errorf("version %q: %v, want ErrBadRequest naming the version", v, err)
		}
	}
	if got := journal(); got != before {
		t.Errorf("refused changes were journaled:\n%s", strings.TrimPrefix(got, before))
	}
	if p := s.Policy(); p.Version != "v2" {
		t.Errorf("version %q after refusals, want v2", p.Version)
	}
	if st, err := s.ResetPolicy("v1", false); err != nil || st.Version != "v1" {
		t.Fatalf("reset to v1: %+v %v", st, err)
	}
	if last := strings.TrimPrefix(journal(), before); !strings.Contains(last, `"version":"v1"`) || !strings.Contains(last, `"force":true`) {
		t.Errorf("the reset was journaled as %q, want it marked force", last)
	}
	s.mu.Lock()
	n, _ := s.staleness("v2", "v1")
	s.mu.Unlock()
	if n != 1 {
		t.Errorf("steps of v2 after the reset to v1 are %d behind, want 1", n)
	}
	if _, err := s.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	s2 := e.serve(t)
	defer s2.Close(context.Background())
	if p := s2.Policy(); p.Version != "v1" {
		t.Errorf("version %q after restart, want v1", p.Version)
	}
	s2.mu.Lock()
	n, _ = s2.staleness("v2", "v1")
	s2.mu.Unlock()
	if n != 1 {
		t.Errorf("after restart, steps of v2 are %d behind v1, want 1: the reset was not replayed", n)
	}
	if _, err := s2.SetPolicy("v2", false); !errors.Is(err, ErrVersionOrder) {
		t.Errorf("v2 again after restart: %v, want ErrVersionOrder", err)
	}
	if _, err := s2.SetPolicy("v3", false); err != nil {
		t.Errorf("v3: %v", err)
	}
}

// TestServiceTaskEntry: a submission naming one of the service's tasks
// follows the tasks file's rule for fields, and a wrong domain is said to
// be the domain.
func TestServiceTaskEntry(t *testing.T) {
	e := newServiceEnv(t, policytest.Options{Script: clicksThenDone(1)})
	e.opts.Tasks = []Task{{ID: "t0", Domain: "os", Instruction: "x", Evaluator: json.RawMessage(`{"func":"exact_match"}`)}}
	s := e.serve(t)
	defer s.Close(context.Background())
	s.SetPolicy("", true) // nothing needs to run
	for _, tt := range []struct{ entry, words string }{
		{`{"task_id": "t0", "domain": "chrome"}`, `domain "chrome": the service's task "t0" is in domain "os"`},
		{`{"task_id": "t0", "domain": "os", "extra": 1}`, `extra: unknown field`},
		{`{"task_id": "t0", "Domain": "os"}`, `Domain: unknown field`},
	} {
		_, _, err := s.Submit(GroupRequest{Task: json.RawMessage(tt.entry)})
		if !errors.Is(err, ErrBadRequest) || IsUnknownTask(err) || !strings.Contains(err.Error(), tt.words) {
			t.Errorf("task %s: %v, want ErrBadRequest saying %q", tt.entry, err, tt.words)
		}
	}
	if _, _, err := s.Submit(GroupRequest{Task: json.RawMessage(`{"task_id": "t0", "domain": "os"}`)}); err != nil {
		t.Errorf("the task itself: %v", err)
	}
}
