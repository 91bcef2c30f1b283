package httpapi

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"testing"
	"time"

	rl "legato/rl"
	"legato/rl/desktop"
	"legato/rl/desktop/fake"
	"legato/rl/policy/policytest"
)

// BenchmarkServeVsCollect runs the same groups (G=4, two steps an attempt,
// instant fake desktops and model) by Collect and through `legato rl
// serve`'s HTTP front (submit every group, read them from the stream), and
// reports the time per group of each, so their ratio is the service's
// overhead. The serve runs also report the stream's latency: from the
// moment a group ended (its journal entry) to its line reaching the
// trainer, with instant desktops (the machine saturated by the batch
// itself) and with desktops that take VM-like time (serve-paced-desktops).
//
//	go test -run '^$' -bench ServeVsCollect ./internal/httpapi
func BenchmarkServeVsCollect(b *testing.B) {
	const groups, size = 64, 4
	srv := policytest.NewServer(policytest.Options{NoLatency: true, Script: func(r policytest.Request) string {
		if r.Step < 1 {
			return "<tool_call>\n{\"name\": \"computer_use\", \"arguments\": {\"action\": \"left_click\", \"coordinate\": [5, 5]}}\n</tool_call>"
		}
		return "<tool_call>\n{\"name\": \"computer_use\", \"arguments\": {\"action\": \"terminate\", \"status\": \"success\"}}\n</tool_call>"
	}})
	defer srv.Close()
	pol := rl.PolicyConfig{BaseURL: srv.URL(), Model: "scripted", Version: "v1"}
	paced := false
	opts := func(dir string) rl.CollectOptions {
		cfg := fake.Config{Width: 320, Height: 192}
		if paced {
			// Desktops that take their time, as VMs do: the machine is
			// then not saturated, and the stream's latency is its own.
			ms := func(n int) fake.Latency { return fake.Latency{Fixed: time.Duration(n) * time.Millisecond} }
			cfg.Latency = fake.Latencies{Reset: ms(300), Observe: ms(20), Act: ms(50), Settle: ms(150), Evaluate: ms(100)}
		}
		return rl.CollectOptions{Out: dir, NewDesktop: fake.NewFleet(cfg).New,
			Desktops: 8, Group: size, MaxSteps: 4, Ready: desktop.ReadyOptions{Interval: time.Millisecond, Max: 20 * time.Millisecond}}
	}
	var tasks []rl.Task
	for i := range groups {
		tasks = append(tasks, rl.Task{ID: fmt.Sprintf("t%d", i), Domain: "os", Instruction: "x", Evaluator: json.RawMessage(`{"func":"exact_match"}`)})
	}
	b.Run("collect", func(b *testing.B) {
		for b.Loop() {
			if _, err := rl.Collect(b.Context(), tasks, pol, opts(filepath.Join(b.TempDir(), "run"))); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N*groups), "ms/group")
	})
	serve := func(b *testing.B) {
		var lat []float64
		for b.Loop() {
			svc, err := rl.Serve(b.Context(), pol, rl.ServeOptions{CollectOptions: opts(filepath.Join(b.TempDir(), "run"))})
			if err != nil {
				b.Fatal(err)
			}
			h := httptest.NewServer(New(svc, Options{Token: "bench"}))
			c := &http.Client{Transport: tokenTransport("bench")}
			for i := range groups {
				body := fmt.Sprintf(`{"task": {"task_id": "t%d", "domain": "os", "config": {"id": "t%d", "instruction": "x", "evaluator": {"func": "exact_match"}}}}`, i, i)
				res, err := c.Post(h.URL+"/v1/groups", "application/json", bytes.NewReader([]byte(body)))
				if err != nil || res.StatusCode != http.StatusCreated {
					b.Fatal(err, res.Status)
				}
				res.Body.Close()
			}
			res, err := c.Get(fmt.Sprintf("%s/v1/stream?after=0&limit=%d", h.URL, groups))
			if err != nil {
				b.Fatal(err)
			}
			sc := bufio.NewScanner(res.Body)
			sc.Buffer(nil, 64<<20)
			n := 0
			for sc.Scan() {
				now := time.Now()
				var line struct {
					Group struct {
						EndedAt time.Time `json:"ended_at"`
					} `json:"group"`
				}
				if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
					b.Fatal(err)
				}
				lat = append(lat, now.Sub(line.Group.EndedAt).Seconds()*1000)
				n++
			}
			res.Body.Close()
			h.Close()
			if _, err := svc.Close(context.Background()); err != nil {
				b.Fatal(err)
			}
			if n != groups {
				b.Fatalf("stream gave %d groups, want %d", n, groups)
			}
		}
		b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N*groups), "ms/group")
		slices.Sort(lat)
		b.ReportMetric(lat[len(lat)/2], "stream-p50-ms")
		b.ReportMetric(lat[len(lat)*99/100], "stream-p99-ms")
		b.ReportMetric(lat[len(lat)-1], "stream-max-ms")
	}
	b.Run("serve", serve)
	paced = true
	b.Run("serve-paced-desktops", serve)
}

// tokenTransport sends its bearer token with every request.
type tokenTransport string

func (tok tokenTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+string(tok))
	return http.DefaultTransport.RoundTrip(r)
}
