package probe

import (
	"strings"
	"testing"
	"time"

	"legato/rl/policy"
	"legato/rl/policy/policytest"
)

// TestRunListsButDoesNotServe: a server whose GET /models lists the model
// while every completion fails as a broken engine's does is not trainable,
// and the advice says the server is broken, not that the URL, model or key
// is wrong.
func TestRunListsButDoesNotServe(t *testing.T) {
	for _, f := range []policytest.Fault{policytest.FaultUnavailable, policytest.FaultServerError, policytest.FaultHTML, policytest.FaultTruncatedBody} {
		t.Run(f.String(), func(t *testing.T) {
			srv, err := policytest.Listen("127.0.0.1:0", policytest.Options{Model: "m", NoLatency: true, Faults: policytest.FaultAlways(f)})
			if err != nil {
				t.Fatal(err)
			}
			defer srv.Close()
			r, err := Run(t.Context(), policy.Config{BaseURL: srv.URL(), Model: "m", StepTimeout: 5 * time.Second}, Options{})
			if err != nil {
				t.Fatal(err)
			}
			if r.Server == "" {
				t.Fatal("GET /models named no server: the test tested nothing")
			}
			if r.Trainable || len(r.Why) == 0 || r.Why[0] != "the server does not serve a generation" {
				t.Errorf("trainable %v, why %q; want not trainable: the server does not serve a generation", r.Trainable, r.Why)
			}
			if len(r.Advice) == 0 || !strings.Contains(r.Advice[0], "server's logs") {
				t.Errorf("advice %q; want the server's logs first", r.Advice)
			}
		})
	}
}
