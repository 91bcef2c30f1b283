package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"

	"legato/rl/policy"
)

// lineWriter hands each write to a channel, so a test can wait for a
// server's first line without polling.
type lineWriter chan string

func (w lineWriter) Write(p []byte) (int, error) {
	w <- string(p)
	return len(p), nil
}

const chatBody = `{"model": "m", "logprobs": true, "messages": [{"role": "user", "content": "hi"}]}`

// startServePolicy runs serve-policy with args and
// returns its first line and its URL; stop cancels it and wants it to
// return nil.
func startServePolicy(t *testing.T, args ...string) (line, url string, stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	out := make(lineWriter, 8)
	done := make(chan error, 1)
	go func() { done <- new(servePolicyCommand).Run(ctx, args, out, &bytes.Buffer{}) }()
	select {
	case line = <-out:
	case err := <-done:
		cancel()
		t.Fatalf("serve-policy returned early: %v", err)
	}
	stop = func() {
		http.DefaultClient.CloseIdleConnections()
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve-policy after cancel = %v, want nil", err)
		}
	}
	return line, line[strings.Index(line, "http://") : len(line)-1], stop
}

func TestServePolicy(t *testing.T) {
	line, url, stop := startServePolicy(t, "-addr", "127.0.0.1:0", "-dialect", "sglang", "-no-latency", "-fault", "500", "-fault-every", "2")
	if !strings.Contains(line, "(sglang latest)") {
		t.Errorf("first line %q does not name the dialect", line)
	}
	for i, want := range []int{200, 500, 200} {
		res, err := http.Post(url+"/chat/completions", "application/json", strings.NewReader(chatBody))
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != want {
			t.Errorf("request %d: status %d, want %d", i, res.StatusCode, want)
		}
	}
	stop()
}

// TestServePolicySample: with --sample the same prompt gets different
// replies (a group's attempts differ), and another server with the same
// seed gives the same ones in the same order.
func TestServePolicySample(t *testing.T) {
	replies := func(seed string) []string {
		_, url, stop := startServePolicy(t, "-addr", "127.0.0.1:0", "-no-latency", "-sample", "-seed", seed)
		defer stop()
		var got []string
		for range 8 {
			res, err := http.Post(url+"/chat/completions", "application/json", strings.NewReader(chatBody))
			if err != nil {
				t.Fatal(err)
			}
			var body struct {
				Choices []struct {
					Message struct{ Content string } `json:"message"`
				} `json:"choices"`
			}
			err = json.NewDecoder(res.Body).Decode(&body)
			res.Body.Close()
			if err != nil || len(body.Choices) != 1 {
				t.Fatalf("reply: %v, %d choices", err, len(body.Choices))
			}
			got = append(got, body.Choices[0].Message.Content)
		}
		return got
	}
	a, b, c := replies("5"), replies("5"), replies("6")
	if !slices.Equal(a, b) {
		t.Errorf("two servers with seed 5 replied differently:\n%q\n%q", a, b)
	}
	if slices.Equal(a, c) {
		t.Errorf("seeds 5 and 6 gave the same replies: %q", a)
	}
	if distinct := len(slices.Compact(slices.Sorted(slices.Values(a)))); distinct < 4 {
		t.Errorf("8 calls with one prompt gave %d distinct replies: %q", distinct, a)
	}
}

func TestServePolicyUsage(t *testing.T) {
	t.Setenv(policy.KeyEnv, "")
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"dialect", []string{"-dialect", "tgi"}, `invalid value "tgi" for flag -dialect: want vllm, sglang or openai`},
		{"fault", []string{"-fault", "explode"}, `unknown fault "explode"`},
		{"version", []string{"-dialect", "sglang", "-version", "0.10.2"}, `unknown sglang version "0.10.2": want one of 0.4, 0.5.13, latest`},
		{"image limit", []string{"-image-limit", "-1"}, `invalid value "-1" for flag -image-limit: want an integer ≥ 0`},
		{"public address", []string{"-addr", "0.0.0.0:8000"}, "not a loopback address"},
		{"port out of range", []string{"-addr", "127.0.0.1:70000"}, "want 0 (any free port) to 65535"},
		{"key missing", []string{"-require-key"}, "LEGATO_POLICY_KEY"},
		{"stray argument", []string{"serve"}, "unexpected arguments"},
		{"fault every zero", []string{"-fault", "500", "-fault-every", "0"}, `invalid value "0" for flag -fault-every: want an integer ≥ 1`},
		{"fault every negative", []string{"-fault-every", "-2"}, "-fault-every"},
		{"image tokens", []string{"-image-tokens", "-1"}, `invalid value "-1" for flag -image-tokens: want an integer from 1 to 1048576`},
		{"unknown flag", []string{"-latency", "0"}, "flag provided but not defined: -latency"},
		{"seed without sample", []string{"-seed", "3"}, "--seed is the seed of --sample's draws: give --sample too"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout bytes.Buffer
			err := new(servePolicyCommand).Run(t.Context(), tt.args, &stdout, &bytes.Buffer{})
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("serve-policy %q = %v, want an error containing %q", tt.args, err, tt.want)
			}
			if code := exitCode(t.Context(), err, &bytes.Buffer{}); code != exitUsage {
				t.Errorf("exit code %d, want %d", code, exitUsage)
			}
			if stdout.Len() > 0 {
				t.Errorf("stdout = %q: the server started", stdout.String())
			}
		})
	}
}
