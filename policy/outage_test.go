package policy_test

import (
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"legato/rl/policy"
	"legato/rl/policy/policytest"
)

// TestPingGenerates: Ping succeeds only when the server serves a one-token
// generation of the model, whatever GET /models says: an engine whose
// worker died behind a live front, or a gateway with no backend, still
// lists its model.
func TestPingGenerates(t *testing.T) {
	for _, tc := range []struct {
		fault policytest.Fault
		ok    bool
	}{
		{policytest.NoFault, true},
		{policytest.FaultUnavailable, false},
		{policytest.FaultServerError, false},
		{policytest.FaultTruncatedBody, false},
		{policytest.FaultHTML, false},
		{policytest.FaultHang, false},
	} {
		t.Run(tc.fault.String(), func(t *testing.T) {
			var probes atomic.Int64
			var maxTokens atomic.Int64
			srv, err := policytest.Listen("127.0.0.1:0", policytest.Options{Model: "m", NoLatency: true,
				Faults: func(_ int, r policytest.Request) policytest.Fault {
					probes.Add(1)
					maxTokens.Store(int64(r.MaxTokens))
					return tc.fault
				}})
			if err != nil {
				t.Fatal(err)
			}
			defer srv.Close()
			c, err := policy.New(policy.Config{BaseURL: srv.URL(), Model: "m", StepTimeout: time.Second})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			res, err := http.Get(srv.URL() + "/models")
			if err != nil || res.StatusCode != http.StatusOK {
				t.Fatalf("GET /models: %v %v; want 200 whatever the completions do", res, err)
			}
			res.Body.Close()
			http.DefaultClient.CloseIdleConnections()

			err = c.Ping(t.Context())
			if (err == nil) != tc.ok {
				t.Errorf("Ping: %v; want success %v", err, tc.ok)
			}
			if err != nil && !policy.IsOutage(err) {
				t.Errorf("Ping's error %v is not an outage", err)
			}
			if probes.Load() != 1 || maxTokens.Load() != 1 {
				t.Errorf("Ping made %d chat requests, max_tokens %d; want one of 1 token", probes.Load(), maxTokens.Load())
			}
		})
	}
}

// TestReplicaWithFailingCompletionsIsTakenOut: a replica whose completions
// answer 503 while its /models answers loses its keys to the other, no
// call fails, its prober's one-token generations keep it out while they
// fail, and it takes keys again once they succeed.
func TestReplicaWithFailingCompletionsIsTakenOut(t *testing.T) {
	var sw policytest.Switch
	a, err := policytest.Listen("127.0.0.1:0", policytest.Options{Model: "m", NoLatency: true, Faults: sw.Faults})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := policytest.Listen("127.0.0.1:0", policytest.Options{Model: "m", NoLatency: true})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	r, err := policy.NewReplicas(policy.Config{BaseURL: a.URL(), Replicas: []string{b.URL()}, Model: "m", StepTimeout: 5 * time.Second, Retries: 0})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	served := func(key string) string {
		t.Helper()
		res, err := r.Complete(t.Context(), key, textPrompt("task "+key))
		if err != nil {
			t.Fatalf("call for %s: %v", key, err)
		}
		return res.Model.Replica
	}
	onA := ""
	for i := 0; onA == ""; i++ {
		if k := fmt.Sprint("g", i); served(k) == a.URL() {
			onA = k
		}
	}
	sw.Set(policytest.FaultUnavailable)
	// The call on a fails, moves to b; its attempts count both requests.
	res, err := r.Complete(t.Context(), onA, textPrompt("task "+onA))
	if err != nil || res.Model.Replica != b.URL() || res.Model.Attempts != 2 {
		t.Fatalf("call for %s with a failing: %v, %+v; want served by b after 2 attempts", onA, err, res)
	}
	// The prober's generations fail: a stays out.
	<-sw.After(3)
	for i := range 4 {
		if got := served(fmt.Sprint("new", i)); got != b.URL() {
			t.Errorf("new key %d served by %s while a's completions fail", i, got)
		}
	}
	sw.Set(policytest.NoFault)
	deadline := time.Now().Add(30 * time.Second)
	for i := 0; served(fmt.Sprint("back", i)) != a.URL(); i++ {
		if time.Now().After(deadline) {
			t.Fatal("the replica whose completions work again never took a key")
		}
		time.Sleep(50 * time.Millisecond)
	}
}
