package main

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"legato/rl/policy"
	"legato/rl/policy/policytest"
	"legato/rl/policy/probe"
)

func TestProbeCommand(t *testing.T) {
	const key = "sk-probe-secret-5150"
	tests := []struct {
		name      string
		opts      policytest.Options
		env       string
		wantErr   error
		wantInOut string
	}{
		{"trainable with the key from the environment", policytest.Options{APIKey: key}, key, nil, "verdict: trainable"},
		{"no logprobs exits non-zero", policytest.Options{Faults: policytest.FaultAlways(policytest.FaultNoLogprobs)}, "", probe.ErrNotTrainable, "verdict: NOT trainable: no logprobs"},
		{"null logprobs exit non-zero", policytest.Options{Faults: policytest.FaultAlways(policytest.FaultNullLogprobs)}, "", probe.ErrNotTrainable,
			"verdict: NOT trainable: null or non-finite logprobs"},
		{"misaligned logprobs exit non-zero", policytest.Options{Faults: policytest.FaultAlways(policytest.FaultLogprobsMismatch)}, "", probe.ErrNotTrainable,
			"verdict: NOT trainable: logprobs not aligned with token ids"},
		{"an image limit below --image-max exits non-zero", policytest.Options{ImageLimit: 3}, "", probe.ErrNotTrainable,
			"verdict: NOT trainable: at most 3 images per prompt, and --image-max is 5"},
		{"token strings exit non-zero", policytest.Options{Dialect: policytest.SGLang, Version: policytest.SGLang04}, "", probe.ErrNotTrainable,
			"verdict: NOT trainable: not exact"},
		{"missing key exits non-zero", policytest.Options{APIKey: key}, "", probe.ErrNotTrainable, "401 Unauthorized"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv(policy.KeyEnv, tt.env)
			tt.opts.NoLatency = true
			srv := policytest.NewServer(tt.opts)
			defer srv.Close()
			var stdout, stderr bytes.Buffer
			err := new(probeCommand).Run(t.Context(), []string{"--policy-url", srv.URL(), "--model", "qwen", "--step-timeout", "5s", "--image-max", "5"}, &stdout, &stderr)
			if !errors.Is(err, tt.wantErr) || (err == nil) != (tt.wantErr == nil) {
				t.Errorf("probe = %v, want %v", err, tt.wantErr)
			}
			if code := exitCode(t.Context(), err, &bytes.Buffer{}); err != nil && code != exitFailure {
				t.Errorf("exit code %d, want %d", code, exitFailure)
			}
			if !strings.Contains(stdout.String(), tt.wantInOut) {
				t.Errorf("stdout does not say %q:\n%s", tt.wantInOut, stdout.String())
			}
			all := stdout.String() + stderr.String()
			if err != nil {
				all += err.Error()
			}
			if strings.Contains(all, key) {
				t.Errorf("the key appears in the output:\n%s", all)
			}
		})
	}
}

func TestProbeCommandUsage(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"no flags", nil, "--policy-url URL is required"},
		{"no model", []string{"--policy-url", "http://127.0.0.1:1/v1"}, "--model NAME is required"},
		{"not http", []string{"--policy-url", "ftp://127.0.0.1/v1", "--model", "m"}, "is not an http(s) URL"},
		{"key as a flag", []string{"--api-key", "x"}, "flag provided but not defined: -api-key"},
		{"stray argument", []string{"--model", "m", "extra"}, "unexpected arguments"},
		{"zero timeout", []string{"--step-timeout", "0"}, `invalid value "0" for flag -step-timeout: want from 1s to 24h, as seconds (60) or a duration with units (1m30s)`},
		{"negative timeout", []string{"--step-timeout", "-5s"}, "-step-timeout"},
		{"image max zero", []string{"--image-max", "0"}, `invalid value "0" for flag -image-max: want an integer from 1 to 1000`},
		{"image max negative", []string{"--image-max", "-2"}, "-image-max"},
		{"timeout not a number", []string{"--step-timeout", "soon"}, "as seconds (60) or a duration with units (1m30s)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout bytes.Buffer
			err := new(probeCommand).Run(t.Context(), tt.args, &stdout, &bytes.Buffer{})
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("probe %q = %v, want an error saying %q", tt.args, err, tt.want)
			}
			if code := exitCode(t.Context(), err, &bytes.Buffer{}); code != exitUsage {
				t.Errorf("exit code %d, want %d", code, exitUsage)
			}
			if stdout.Len() > 0 {
				t.Errorf("stdout = %q, want nothing: nothing may run", stdout.String())
			}
		})
	}
}
