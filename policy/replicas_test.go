package policy_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"legato/rl/policy"
	"legato/rl/policy/policytest"
	"legato/rl/schema"
)

func textPrompt(text string) []schema.Message {
	return []schema.Message{{Role: "user", Content: []schema.Part{schema.TextPart(text)}}}
}

// TestReplicasStickyFailoverAndBack: keys spread over the replicas and
// stay on theirs; a replica that stops answering loses its keys to the
// others at once, no call fails, and it takes keys again once it answers.
func TestReplicasStickyFailoverAndBack(t *testing.T) {
	a := policytest.NewServer(policytest.Options{Model: "m", NoLatency: true})
	defer a.Close()
	b := policytest.NewServer(policytest.Options{Model: "m", NoLatency: true})
	defer b.Close()
	r, err := policy.NewReplicas(policy.Config{BaseURL: a.URL(), Replicas: []string{b.URL()}, Model: "m", StepTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	ctx := t.Context()
	served := func(key string) string {
		t.Helper()
		res, err := r.Complete(ctx, key, textPrompt("task "+key))
		if err != nil {
			t.Fatalf("call for %s: %v", key, err)
		}
		return res.Model.Replica
	}
	first := map[string]string{}
	for _, k := range []string{"g0", "g1", "g2", "g3"} {
		first[k] = served(k)
	}
	if first["g0"] == first["g1"] || first["g0"] != first["g2"] || first["g1"] != first["g3"] {
		t.Errorf("keys on %v: want g0, g2 on one replica and g1, g3 on the other", first)
	}
	for _, k := range []string{"g0", "g1", "g2", "g3"} {
		if got := served(k); got != first[k] {
			t.Errorf("%s moved from %s to %s while both were up", k, first[k], got)
		}
	}

	// a goes away: its keys move to b, and no call fails.
	addr := strings.TrimSuffix(strings.TrimPrefix(a.URL(), "http://"), "/v1")
	a.Close()
	for _, k := range []string{"g0", "g1", "g2", "g3"} {
		if got := served(k); got != b.URL() {
			t.Errorf("%s served by %s with %s down", k, got, a.URL())
		}
	}
	// a comes back on its address: the prober finds it, and new keys go
	// to it again (b holds all four).
	a2, err := policytest.Listen(addr, policytest.Options{Model: "m", NoLatency: true})
	if err != nil {
		t.Fatal(err)
	}
	defer a2.Close()
	deadline := time.Now().Add(30 * time.Second)
	for i := 0; served(fmt.Sprint("new", i)) != a2.URL(); i++ {
		if time.Now().After(deadline) {
			t.Fatal("the replica that came back never took a key again")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestReplicasAllDown: with every replica down the call fails as an
// outage, so the batch's breaker waits; Ping says when one is back.
func TestReplicasAllDown(t *testing.T) {
	a := policytest.NewServer(policytest.Options{Model: "m", NoLatency: true})
	b := policytest.NewServer(policytest.Options{Model: "m", NoLatency: true})
	r, err := policy.NewReplicas(policy.Config{BaseURL: a.URL(), Replicas: []string{b.URL()}, Model: "m", StepTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	a.Close()
	b.Close()
	// The first call finds them down; the second finds them marked down
	// and calls none.
	for _, call := range []string{"first", "second"} {
		_, err = r.Complete(t.Context(), "g", textPrompt("x"))
		if !errors.Is(err, policy.ErrNoReplica) || !policy.IsOutage(err) {
			t.Errorf("%s call with every replica down: %v; want ErrNoReplica and an outage", call, err)
		}
	}
	if err := r.Ping(t.Context()); err == nil {
		t.Error("Ping succeeded with every replica down")
	}
}

func TestReplicasConfig(t *testing.T) {
	_, err := policy.NewReplicas(policy.Config{BaseURL: "http://127.0.0.1:1/v1", Replicas: []string{"127.0.0.1:2"}, Model: "m"})
	if err == nil || !strings.Contains(err.Error(), "Replicas[0]") {
		t.Errorf("a replica without a scheme: %v; want an error naming Replicas[0]", err)
	}
}
