package policy_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"legato/rl/policy"
	"legato/rl/policy/policytest"
	"legato/rl/schema"
)

// benchPrompts are a short text prompt and a step-3 prompt with three
// 150 kB screenshots, the size of a 1280×720 PNG.
func benchPrompts(b *testing.B) map[string][]schema.Message {
	shot := func() schema.Part {
		raw := make([]byte, 150<<10)
		if _, err := rand.Read(raw); err != nil {
			b.Fatal(err)
		}
		return schema.ImagePart("data:image/png;base64," + base64.StdEncoding.EncodeToString(raw))
	}
	text := func(s string) []schema.Part { return []schema.Part{schema.TextPart(s)} }
	return map[string][]schema.Message{
		"text": {
			{Role: "system", Content: text("You operate a Linux desktop. Answer with one tool call per step.")},
			{Role: "user", Content: text("Open the terminal")},
		},
		"screenshots": {
			{Role: "system", Content: text("You operate a Linux desktop. Answer with one tool call per step.")},
			{Role: "user", Content: []schema.Part{schema.TextPart("Open the terminal"), shot()}},
			{Role: "assistant", Content: text("Action: click.")},
			{Role: "user", Content: []schema.Part{shot()}},
			{Role: "assistant", Content: text("Action: type.")},
			{Role: "user", Content: []schema.Part{shot()}},
		},
	}
}

// bodyRecorder keeps the body of the last request it carries.
type bodyRecorder struct {
	next http.RoundTripper
	body []byte
}

func (r *bodyRecorder) RoundTrip(req *http.Request) (*http.Response, error) {
	b, err := io.ReadAll(req.Body)
	if err != nil {
		return nil, err
	}
	req.Body.Close()
	r.body = b
	req.Body = io.NopCloser(bytes.NewReader(b))
	return r.next.RoundTrip(req)
}

// BenchmarkClientOverhead compares a Client call with a bare net/http POST
// of the same request body to the same server: the difference is what the
// client costs per call (building the request through openai-go, parsing
// the answer, the retry and limiter bookkeeping).
func BenchmarkClientOverhead(b *testing.B) {
	srv := policytest.NewServer(policytest.Options{NoLatency: true})
	defer srv.Close()
	for name, msgs := range benchPrompts(b) {
		transport := &http.Transport{MaxIdleConnsPerHost: 4}
		defer transport.CloseIdleConnections()
		rec := &bodyRecorder{next: transport}
		c, err := policy.New(policy.Config{BaseURL: srv.URL(), Model: "m", HTTPClient: &http.Client{Transport: rec}})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := c.Complete(context.Background(), msgs); err != nil {
			b.Fatal(err)
		}
		body := rec.body
		b.Run(name+"/client", func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				if _, err := c.Complete(context.Background(), msgs); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(name+"/bare-post", func(b *testing.B) {
			hc := &http.Client{Transport: transport}
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				res, err := hc.Post(srv.URL()+"/chat/completions", "application/json", bytes.NewReader(body))
				if err != nil {
					b.Fatal(err)
				}
				if _, err := io.Copy(io.Discard, res.Body); err != nil {
					b.Fatal(err)
				}
				res.Body.Close()
				if res.StatusCode != http.StatusOK {
					b.Fatalf("status %d", res.StatusCode)
				}
			}
		})
	}
}

// BenchmarkSaturation runs 64 concurrent callers against the scripted
// server's H100-shaped latency model (scaled down 10× to keep the run
// short) and reports completed requests per second for several
// MaxInflight caps.
func BenchmarkSaturation(b *testing.B) {
	d := policytest.DefaultLatency()
	lat := policytest.Latency{Base: d.Base / 10, PerPromptToken: d.PerPromptToken / 10, PerToken: d.PerToken / 10, Knee: d.Knee, Capacity: d.Capacity}
	msgs := benchPrompts(b)["text"]
	const callers = 64
	for _, maxInflight := range []int{32, 48, 0} {
		name := fmt.Sprintf("max-inflight=%d", maxInflight)
		if maxInflight == 0 {
			name = "max-inflight=unlimited"
		}
		b.Run(name, func(b *testing.B) {
			srv := policytest.NewServer(policytest.Options{Latency: lat})
			defer srv.Close()
			c, err := policy.New(policy.Config{BaseURL: srv.URL(), Model: "m", MaxInflight: maxInflight, StepTimeout: time.Minute})
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			var left atomic.Int64
			left.Store(int64(b.N))
			var wg sync.WaitGroup
			b.ResetTimer()
			for range callers {
				wg.Go(func() {
					for left.Add(-1) >= 0 {
						if _, err := c.Complete(context.Background(), msgs); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
			b.StopTimer()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
			b.ReportMetric(float64(srv.Stats().MaxInFlight), "max-in-flight")
		})
	}
}
