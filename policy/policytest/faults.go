package policytest

import (
	"fmt"
	"strings"
	"sync"
)

// Fault is a misbehaviour the server shows on one request, chosen by
// Options.Faults.
type Fault int

const (
	// NoFault answers normally.
	NoFault Fault = iota
	// FaultHang never answers: the request is held until the client gives
	// up or the server closes.
	FaultHang
	// FaultServerError answers 500 with the dialect's error body.
	FaultServerError
	// FaultRateLimit answers 429 with a Retry-After header
	// (Options.RetryAfter).
	FaultRateLimit
	// FaultRefuseField answers 400 naming return_token_ids when the
	// request carries it, as hosted APIs do; a request without it is
	// answered normally.
	FaultRefuseField
	// FaultIgnoreField answers as if return_token_ids had not been sent, as
	// servers too old to know it do (see also Options.Version).
	FaultIgnoreField
	// FaultFlatError answers 500 with a flat {"object":"error","message":…}
	// body, as SGLang and old vLLM do.
	FaultFlatError
	// FaultUnauthorizedString answers 401 {"error":"Unauthorized"}, as
	// vLLM's --api-key check does.
	FaultUnauthorizedString
	// FaultMalformedJSON answers 200 with a complete body that is not JSON.
	FaultMalformedJSON
	// FaultTruncatedBody answers 200, sends half the body and drops the
	// connection.
	FaultTruncatedBody
	// FaultSlowFirstByte waits Options.FirstByteDelay before answering.
	FaultSlowFirstByte
	// FaultNoLogprobs answers without logprobs even when they were asked
	// for.
	FaultNoLogprobs
	// FaultLogprobsMismatch answers with one logprob fewer than token ids.
	FaultLogprobsMismatch
	// FaultValidationError answers 400 as vLLM and SGLang do when a model
	// validator rejects the request: FastAPI's validation error, whose
	// message echoes the whole request body (field names and all) and
	// whose param is null.
	FaultValidationError
	// FaultNullLogprobs answers with every logprob null, as vLLM and
	// SGLang send a NaN logprob.
	FaultNullLogprobs
	// FaultUnavailable answers 503 with a plain-text body, as a gateway or
	// load balancer with no live backend does.
	FaultUnavailable
	// FaultHTML answers 200 with an HTML page, as a proxy's error or login
	// page does.
	FaultHTML
	// FaultAbort answers 200 with half the reply and finish_reason
	// "abort", as vLLM and SGLang answer a request they aborted (a trainer
	// pausing the engine to swap weights).
	FaultAbort
)

var faultNames = [...]string{
	NoFault:                 "none",
	FaultHang:               "hang",
	FaultServerError:        "500",
	FaultRateLimit:          "429",
	FaultRefuseField:        "refuse-field",
	FaultIgnoreField:        "ignore-field",
	FaultFlatError:          "flat-error",
	FaultUnauthorizedString: "401-string",
	FaultMalformedJSON:      "malformed-json",
	FaultTruncatedBody:      "truncated-body",
	FaultSlowFirstByte:      "slow-first-byte",
	FaultNoLogprobs:         "no-logprobs",
	FaultLogprobsMismatch:   "logprobs-mismatch",
	FaultValidationError:    "validation-400",
	FaultNullLogprobs:       "null-logprobs",
	FaultUnavailable:        "503",
	FaultHTML:               "html-200",
	FaultAbort:              "abort",
}

func (f Fault) String() string {
	if f >= 0 && int(f) < len(faultNames) {
		return faultNames[f]
	}
	return fmt.Sprintf("Fault(%d)", int(f))
}

// ParseFault returns the fault named s (as printed by Fault.String).
func ParseFault(s string) (Fault, error) {
	for f, name := range faultNames {
		if name == s {
			return Fault(f), nil
		}
	}
	return NoFault, fmt.Errorf("unknown fault %q: want one of %s", s, strings.Join(faultNames[:], ", "))
}

// UnmarshalText sets f from its name (ParseFault), so that a Fault can be
// a flag's or a config file's value.
func (f *Fault) UnmarshalText(b []byte) error {
	v, err := ParseFault(string(b))
	if err != nil {
		return err
	}
	*f = v
	return nil
}

// MarshalText returns f's name.
func (f Fault) MarshalText() ([]byte, error) { return []byte(f.String()), nil }

// FaultSeq returns an Options.Faults that gives the n-th request (from 0)
// faults[n] and every later request NoFault.
func FaultSeq(faults ...Fault) func(n int, req Request) Fault {
	return func(n int, _ Request) Fault {
		if n < len(faults) {
			return faults[n]
		}
		return NoFault
	}
}

// FaultAlways returns an Options.Faults that gives every request f.
func FaultAlways(f Fault) func(n int, req Request) Fault {
	return func(int, Request) Fault { return f }
}

// FaultEvery returns an Options.Faults that gives every k-th request f
// (requests k-1, 2k-1, …).
func FaultEvery(k int, f Fault) func(n int, req Request) Fault {
	return func(n int, _ Request) Fault {
		if k > 0 && (n+1)%k == 0 {
			return f
		}
		return NoFault
	}
}

// Switch is an Options.Faults a test flips while a batch runs: every chat
// request gets the fault it holds, NoFault at first. /v1/models is never
// faulted, so a server given a fault still lists its model, as an engine
// whose worker died behind a live HTTP front does. Its methods are safe
// for concurrent use.
type Switch struct {
	mu      sync.Mutex
	fault   Fault
	faulted int                     // requests given a fault
	watch   map[int][]chan struct{} // closed once faulted reaches the key
}

// Faults is the function to put in Options.Faults.
func (s *Switch) Faults(int, Request) Fault {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fault == NoFault {
		return NoFault
	}
	s.faulted++
	for _, ch := range s.watch[s.faulted] {
		close(ch)
	}
	delete(s.watch, s.faulted)
	return s.fault
}

// Set makes every later chat request get f (NoFault: none).
func (s *Switch) Set(f Fault) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fault = f
}

// Faulted is the number of chat requests given a fault so far.
func (s *Switch) Faulted() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.faulted
}

// After returns a channel closed once n chat requests in all were given a
// fault: a test waits on it to end a fault window by events, not by time.
func (s *Switch) After(n int) <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	ch := make(chan struct{})
	if s.faulted >= n {
		close(ch)
		return ch
	}
	if s.watch == nil {
		s.watch = make(map[int][]chan struct{})
	}
	s.watch[n] = append(s.watch[n], ch)
	return ch
}
