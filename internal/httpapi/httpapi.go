// Package httpapi is the HTTP API of `legato rl serve`: its routes, its
// JSON bodies and query parameters, its status codes and error texts, the
// bearer token it asks of every caller and its Prometheus metrics. It is
// the wire contract of the service and of its Python client,
// examples/python/legato_client.py; cmd/legato only wires it to flags, a
// listener, TLS and signals.
//
// JSON in and out, errors as {"error": "..."} with a 4xx naming what was
// wrong, never a crash.
package httpapi

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	rl "legato/rl"
)

// A caller finds the bearer token in TokenEnv, when the service was started
// with it, else in TokenFile in the run directory, where the service wrote
// the one it made (the Python client's run_dir).
const (
	TokenEnv  = "LEGATO_SERVE_TOKEN"
	TokenFile = "serve.token"
)

const (
	maxBodyBytes = 1 << 20          // a task config is a few KB
	maxWait      = 10 * time.Minute // bound on ?wait=
)

// policyKeyHeader carries the key of a group's own model server.
const policyKeyHeader = "X-Legato-Policy-Key"

// Options are who may call a service and where its handler logs.
type Options struct {
	// Token is the bearer token every caller must send, on every route;
	// required.
	Token string
	// MetricsOpen answers GET /metrics without the token (a Prometheus
	// scraper).
	MetricsOpen bool
	// Logger gets the errors a caller cannot be told (a 500's cause, a
	// stream cut short); nil discards them.
	Logger *slog.Logger
}

type handler struct {
	svc  *rl.Service
	opts Options
	log  *slog.Logger
}

// New returns the HTTP API of svc. It panics without opts.Token: a service
// without a token would serve any local user the model key, the rollouts
// and the policy.
func New(svc *rl.Service, opts Options) http.Handler {
	if opts.Token == "" {
		panic("serve: no bearer token")
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	h := &handler{svc: svc, opts: opts, log: log}
	mux := http.NewServeMux()
	for pattern, handle := range h.routes() {
		mux.HandleFunc(pattern, handle)
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, fmt.Sprintf("no endpoint %s %s; see legato rl help serve", r.Method, r.URL.Path))
	})
	return h.checkToken(mux)
}

// routes are the service's endpoints by pattern.
func (h *handler) routes() map[string]http.HandlerFunc {
	return map[string]http.HandlerFunc{
		"POST /v1/groups":        h.submit,
		"GET /v1/groups/{id}":    h.group,
		"DELETE /v1/groups/{id}": h.cancel,
		"GET /v1/stream":         h.stream,
		"GET /v1/policy":         h.policy,
		"POST /v1/policy":        h.setPolicy,
		"GET /v1/blobs/{sha}":    h.blob,
		"POST /v1/blobs":         h.blobs,
		"GET /v1/status":         h.status,
		"GET /metrics":           h.metrics,
	}
}

// checkToken refuses a request without the service's bearer token.
func (h *handler) checkToken(next http.Handler) http.Handler {
	want := []byte(h.opts.Token)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		open := h.opts.MetricsOpen && r.URL.Path == "/metrics"
		if !open && subtle.ConstantTimeCompare(bearerToken(r.Header.Get("Authorization")), want) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="legato"`)
			writeError(w, http.StatusUnauthorized, "missing or wrong bearer token: send Authorization: Bearer TOKEN, the token in "+TokenFile+" in the run directory or in $"+TokenEnv)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// bearerToken returns the credentials of an Authorization header of the
// Bearer scheme, whose name is case-insensitive (RFC 7235 section 2.1),
// or nil.
func bearerToken(header string) []byte {
	scheme, cred, ok := strings.Cut(header, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return nil
	}
	return []byte(strings.TrimLeft(cred, " "))
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]string{"error": msg})
}

// serviceError answers err from the service with the status it calls for.
func (h *handler) serviceError(w http.ResponseWriter, err error) {
	status := http.StatusInternalServerError
	switch {
	case rl.IsUnknownTask(err), errors.Is(err, rl.ErrUnknownGroup), errors.Is(err, rl.ErrUnknownBlob):
		status = http.StatusNotFound
	case errors.Is(err, rl.ErrBadRequest):
		status = http.StatusBadRequest
	case errors.Is(err, rl.ErrKeyConflict), errors.Is(err, rl.ErrQuarantined), errors.Is(err, rl.ErrVersionOrder):
		status = http.StatusConflict
	case errors.Is(err, rl.ErrServiceStopped):
		status = http.StatusServiceUnavailable
	}
	if status == http.StatusInternalServerError {
		h.log.Error("serve", "err", err)
	}
	writeError(w, status, err.Error())
}

// decode reads a JSON body of at most maxBodyBytes into v, refusing
// unknown fields.
func decode(w http.ResponseWriter, r *http.Request, v any) bool {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("body over %d bytes", maxBodyBytes))
			return false
		}
		writeError(w, http.StatusBadRequest, "body: "+err.Error())
		return false
	}
	if dec.More() {
		writeError(w, http.StatusBadRequest, "body: more than one JSON value")
		return false
	}
	return true
}

// resultParams reads how a group's result is shaped: ?steps=full|prefix|none
// and ?images=refs|inline|attempt.
func resultParams(w http.ResponseWriter, r *http.Request) (rl.ResultOptions, bool) {
	steps, err := rl.ParseStepsMode(r.URL.Query().Get("steps"))
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return rl.ResultOptions{}, false
	}
	opts := rl.ResultOptions{Steps: steps}
	switch v := r.URL.Query().Get("images"); v {
	case "", "refs":
	case "inline":
		opts.InlineImages = true
	case "attempt":
		opts.AttemptImages = true
	default:
		writeError(w, http.StatusBadRequest, fmt.Sprintf("images=%q: want refs (legato-image:// references), inline (data URLs in the messages) or attempt (each image once, in the attempt's images)", v))
		return rl.ResultOptions{}, false
	}
	return opts, true
}

// waitParam reads ?wait=SECONDS.
func waitParam(w http.ResponseWriter, r *http.Request) (time.Duration, bool) {
	s := r.URL.Query().Get("wait")
	if s == "" {
		return 0, true
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || !(v >= 0 && v <= maxWait.Seconds()) { // NaN too
		writeError(w, http.StatusBadRequest, fmt.Sprintf("wait=%q: want seconds from 0 to %.0f", s, maxWait.Seconds()))
		return 0, false
	}
	return time.Duration(v * float64(time.Second)), true
}

func intParam(w http.ResponseWriter, r *http.Request, name string) (int, bool) {
	s := r.URL.Query().Get(name)
	if s == "" {
		return 0, true
	}
	v, err := strconv.Atoi(s)
	if err != nil || v < 0 {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("%s=%q: want a whole number ≥ 0", name, s))
		return 0, false
	}
	return v, true
}

// submitRequest is POST /v1/groups' body. group_size, when given, must
// be a size: 0 is refused as -1 is, the service's default is had by
// leaving it out.
type submitRequest struct {
	rl.GroupRequest
	Size *int `json:"group_size"`
}

func (h *handler) submit(w http.ResponseWriter, r *http.Request) {
	var body submitRequest
	if !decode(w, r, &body) {
		return
	}
	req := body.GroupRequest
	if body.Size != nil {
		// 0 is the Go API's "the default": on the wire, leaving the field
		// out says that; Submit checks every other size.
		if *body.Size == 0 {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("group_size 0: want 1 to %d, or leave it out for the service's default", rl.MaxGroup))
			return
		}
		req.Size = *body.Size
	}
	// The key of a group's own model server travels in a header, never in
	// the body a proxy might log.
	req.APIKey = r.Header.Get(policyKeyHeader)
	if req.APIKey != "" && req.Policy == nil {
		writeError(w, http.StatusBadRequest, policyKeyHeader+" without \"policy\": the key is for a group's own model server")
		return
	}
	info, created, err := h.svc.Submit(req)
	if err != nil {
		h.serviceError(w, err)
		return
	}
	status := http.StatusOK
	if created {
		status = http.StatusCreated
	}
	writeJSON(w, status, info)
}

// group answers the group, with its attempts once it ended; ?wait=S waits
// up to S seconds for it to end.
func (h *handler) group(w http.ResponseWriter, r *http.Request) {
	wait, ok := waitParam(w, r)
	if !ok {
		return
	}
	opts, ok := resultParams(w, r)
	if !ok {
		return
	}
	id := r.PathValue("id")
	ctx, cancel := context.WithTimeout(r.Context(), wait)
	defer cancel()
	if _, err := h.svc.Wait(ctx, id); err != nil {
		h.serviceError(w, err)
		return
	}
	res, err := h.svc.Result(id, opts)
	if err != nil {
		h.serviceError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, res)
}

func (h *handler) cancel(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 30*time.Second)
	defer cancel()
	info, err := h.svc.Cancel(ctx, r.PathValue("id"))
	if err != nil {
		h.serviceError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, info)
}

// streamLine is one line of the stream.
type streamLine struct {
	Cursor int             `json:"cursor"`
	Group  *rl.GroupResult `json:"group"`
}

// stream writes ended groups after ?after=CURSOR as JSON lines, in the
// order they ended, then each group as it ends, until ?limit=N lines were
// written, ?wait=S seconds pass with none, the caller goes away or the
// service stops. A trainer that restarts reads on from the last cursor it
// handled: no group is lost or repeated.
func (h *handler) stream(w http.ResponseWriter, r *http.Request) {
	after, ok := intParam(w, r, "after")
	if !ok {
		return
	}
	limit, ok := intParam(w, r, "limit")
	if !ok {
		return
	}
	idle, ok := waitParam(w, r)
	if !ok {
		return
	}
	opts, ok := resultParams(w, r)
	if !ok {
		return
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	_ = rc.Flush()
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	sent := 0
	for {
		for _, id := range h.svc.Ended(after, 0) {
			res, err := h.svc.Result(id, opts)
			if err != nil {
				// The client sees the stream end early and reads on from
				// its cursor; the log says why.
				h.log.Error("stream", "group", id, "err", err)
				return
			}
			if err := enc.Encode(streamLine{Cursor: res.Cursor, Group: res}); err != nil {
				return
			}
			_ = rc.Flush()
			after = res.Cursor
			sent++
			if limit > 0 && sent >= limit {
				return
			}
		}
		ctx, cancel := r.Context(), context.CancelFunc(func() {})
		if idle > 0 {
			ctx, cancel = context.WithTimeout(ctx, idle)
		}
		more := h.svc.WaitEnded(ctx, after)
		cancel()
		if !more {
			return
		}
	}
}

// policyRequest is POST /v1/policy's body.
type policyRequest struct {
	Version string `json:"version"`
	State   string `json:"state"`
	// BaseURLs move the model calls to these servers (replicas of the
	// same weights).
	BaseURLs []string `json:"base_urls"`
	// Force puts a version in force that does not come after the
	// current one: going back on purpose.
	Force bool `json:"force"`
	// Drain, with state paused, answers once no model call is in
	// flight: every call sent under the old weights has come back.
	Drain bool `json:"drain"`
}

// policyAnswer is the policy's state on the wire.
type policyAnswer struct {
	Version  string    `json:"version"`
	State    string    `json:"state"`
	Since    time.Time `json:"since"`
	Held     int       `json:"held_calls"`
	InFlight int       `json:"in_flight"`
	Servers  []string  `json:"servers"`
}

func answerPolicy(st rl.PolicyState) policyAnswer {
	state := "serving"
	if st.Paused {
		state = "paused"
	}
	return policyAnswer{Version: st.Version, State: state, Since: st.Since, Held: st.Held, InFlight: st.InFlight, Servers: st.Servers}
}

func (h *handler) policy(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, answerPolicy(h.svc.Policy()))
}

func (h *handler) setPolicy(w http.ResponseWriter, r *http.Request) {
	var req policyRequest
	if !decode(w, r, &req) {
		return
	}
	if req.State != "paused" && req.State != "serving" {
		writeError(w, http.StatusBadRequest, fmt.Sprintf(`state %q: want "paused" or "serving"`, req.State))
		return
	}
	if req.Drain && req.State != "paused" {
		writeError(w, http.StatusBadRequest, `drain: goes with "state": "paused" (calls would keep starting while serving)`)
		return
	}
	set := h.svc.SetPolicy
	if req.Force {
		set = h.svc.ResetPolicy
	}
	st, err := set(req.Version, req.State == "paused", req.BaseURLs...)
	if errors.Is(err, rl.ErrVersionOrder) {
		err = fmt.Errorf(`%w; give a version after it, or "force": true to go back on purpose`, err)
	}
	if err != nil {
		h.serviceError(w, err)
		return
	}
	if req.Drain {
		// As long as the calls in flight take, at most maxWait.
		ctx, cancel := context.WithTimeout(r.Context(), maxWait)
		defer cancel()
		if err := h.svc.Drain(ctx); err != nil {
			if errors.Is(err, context.DeadlineExceeded) {
				writeError(w, http.StatusGatewayTimeout, fmt.Sprintf("drain: model calls still in flight after %v; the policy stays paused: ask again", maxWait))
				return
			}
			h.serviceError(w, err)
			return
		}
		st = h.svc.Policy()
	}
	writeJSON(w, http.StatusOK, answerPolicy(st))
}

func (h *handler) blob(w http.ResponseWriter, r *http.Request) {
	data, ctype, err := h.svc.Blob(r.PathValue("sha"))
	if err != nil {
		h.serviceError(w, err)
		return
	}
	w.Header().Set("Content-Type", ctype)
	w.Header().Set("Cache-Control", "public, max-age=31536000, immutable") // content-addressed
	_, _ = w.Write(data)
}

// maxBatchBlobs bounds a batch fetch: the screenshots of a few attempts'
// histories, tens of megabytes of base64 at most.
const maxBatchBlobs = 256

// blobsRequest is a batch fetch of blobs by hash.
type blobsRequest struct {
	SHA256 []string `json:"sha256"`
}

// blobs answers several blobs at once, {"blobs": {sha256: base64}}, for a
// trainer that needs a group's screenshots without a round trip each.
func (h *handler) blobs(w http.ResponseWriter, r *http.Request) {
	var req blobsRequest
	if !decode(w, r, &req) {
		return
	}
	if len(req.SHA256) == 0 || len(req.SHA256) > maxBatchBlobs {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("sha256: %d hashes; want 1 to %d", len(req.SHA256), maxBatchBlobs))
		return
	}
	out := make(map[string][]byte, len(req.SHA256))
	for _, sha := range req.SHA256 {
		if _, ok := out[sha]; ok {
			continue
		}
		data, _, err := h.svc.Blob(sha)
		if err != nil {
			h.serviceError(w, err)
			return
		}
		out[sha] = data // encoding/json writes []byte as base64
	}
	writeJSON(w, http.StatusOK, map[string]any{"blobs": out})
}

func (h *handler) status(w http.ResponseWriter, r *http.Request) {
	st := h.svc.Status()
	writeJSON(w, http.StatusOK, struct {
		rl.ServiceStatus
		Policy policyAnswer `json:"policy"`
	}{st, answerPolicy(st.Policy)})
}

// metrics writes the Prometheus text format.
func (h *handler) metrics(w http.ResponseWriter, r *http.Request) {
	st := h.svc.Status()
	w.Header().Set("Content-Type", "text/plain; version=0.0.4")
	gauge := func(name, help string, v float64) {
		metricHead(w, name, "gauge", help)
		fmt.Fprintf(w, "%s %g\n", name, v)
	}
	paused := 0.0
	if st.Policy.Paused {
		paused = 1
	}
	gauge("legato_desktops", "Desktops the service runs attempts on.", float64(st.Desktops))
	gauge("legato_attempts_running", "Attempts on desktops now.", float64(st.Running))
	gauge("legato_model_calls_in_flight", "Model calls in flight now.", float64(st.InFlight))
	gauge("legato_policy_paused", "1 while the policy is paused.", paused)
	gauge("legato_policy_held_calls", "Model calls waiting for the policy to serve.", float64(st.Policy.Held))
	gauge("legato_stream_cursor", "Groups ended so far: the stream's last cursor.", float64(st.Cursor))
	metricHead(w, "legato_groups", "gauge", "Groups by state.")
	labelled(w, "legato_groups", "state", st.Groups)
	metricHead(w, "legato_records_total", "counter", "Records written, by status.")
	labelled(w, "legato_records_total", "status", st.Counts)
	metricHead(w, "legato_phase_seconds_total", "counter", "Seconds attempts spent per phase.")
	labelled(w, "legato_phase_seconds_total", "phase", st.PhaseSeconds)
}

// metricHead writes a metric's HELP and TYPE lines.
func metricHead(w io.Writer, name, typ, help string) {
	fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, typ)
}

// labelled writes one sample of name per key of m, labelled label, in key
// order.
func labelled[K ~string, V int | float64](w io.Writer, name, label string, m map[K]V) {
	for _, k := range sortedKeys(m) {
		fmt.Fprintf(w, "%s{%s=%q} %v\n", name, label, k, float64(m[K(k)]))
	}
}

func sortedKeys[K ~string, V any](m map[K]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, string(k))
	}
	slices.Sort(out)
	return out
}
