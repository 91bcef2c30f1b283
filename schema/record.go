package schema

import (
	"encoding/json"
	"fmt"
	"slices"
	"time"
)

// Version is the value of every record's "schema" field.
const Version = "legato.rollout/v0"

// Status is the outcome of one try of an attempt. Each record has exactly one.
type Status string

const (
	// StatusOK: the agent ended the attempt or --max-steps was reached; graded.
	StatusOK Status = "ok"
	// StatusTruncated: --rollout-timeout was hit; stepping stopped, graded.
	StatusTruncated Status = "truncated"
	// StatusCancelled: the group closed while this attempt was stepping.
	StatusCancelled Status = "cancelled"
	// StatusSkipped: the group closed before this attempt started.
	StatusSkipped Status = "skipped"
	// StatusSurplus: the attempt was grading when its group closed; graded.
	StatusSurplus Status = "surplus"
	// StatusRetried: the desktop failed; the attempt was re-queued.
	StatusRetried Status = "retried"
	// StatusError: the attempt failed for good; see Record.Error.Kind.
	StatusError Status = "error"
)

// Finished reports whether s counts toward closing a group (ok, truncated).
func (s Status) Finished() bool { return s == StatusOK || s == StatusTruncated }

// Graded reports whether a record with status s carries a reward.
func (s Status) Graded() bool { return s.Finished() || s == StatusSurplus }

// Error kinds.
const (
	ErrorPolicy = "policy" // the model call failed after its retries
	ErrorEnv    = "env"    // the desktop failed after the env retries
	// ErrorStale marks a retried record of an attempt that finished with
	// steps of a policy too many versions old; it ran again.
	ErrorStale = "stale"
)

// Record is one line of rollouts.jsonl: one try of one attempt.
type Record struct {
	Schema    string     `json:"schema"`
	RolloutID string     `json:"rollout_id"`
	TaskID    string     `json:"task_id"`
	Domain    string     `json:"domain"`
	GroupID   string     `json:"group_id"`
	Attempt   int        `json:"attempt"`
	Policy    Policy     `json:"policy"`
	Status    Status     `json:"status"`
	Reward    *float64   `json:"reward"`
	Error     *ErrorInfo `json:"error"`
	NSteps    int        `json:"n_steps"`
	Timing    Timing     `json:"timing"`
	Steps     []Step     `json:"steps"`
	Desktop   int        `json:"desktop"`
	StartedAt Time       `json:"started_at"`
	EndedAt   Time       `json:"ended_at"`
	// Env is what the desktop said it did for the attempt (which reset,
	// how it graded), when it says.
	Env *EnvReport `json:"env,omitempty"`
	// TaskSHA is the SHA-256 of the task's config the attempt ran (the
	// task as read, see rl.TaskSHA): a replay or a re-grade checks it runs
	// the same task. Absent in records written before it was recorded.
	TaskSHA string `json:"task_sha256,omitempty"`
	// Try counts the earlier tries of this attempt that a desktop failure
	// ended (desktop.Attempt.Try), so that a replay runs as the same try.
	Try int `json:"try,omitempty"`
	// SecondGrade is the evaluator's second grade of the same end state
	// (collect --grade-twice), when one ran.
	SecondGrade *SecondGrade `json:"second_grade,omitempty"`
	// EndState is the attempt's end state kept before its grade (collect
	// --keep-end-states), which legato rl regrade grades again.
	EndState *EndStateRef `json:"end_state,omitempty"`
}

// EndStateRef names a kept end state (desktop.EndState) and its size, or
// says why none was kept.
type EndStateRef struct {
	Ref   string `json:"ref,omitempty"`
	Bytes int64  `json:"bytes,omitempty"`
	Error string `json:"error,omitempty"`
}

// SecondGrade is a second grade of an attempt's end state.
type SecondGrade struct {
	// Reward is the second grade's reward, null when it failed (Error
	// says why).
	Reward *float64 `json:"reward"`
	Error  string   `json:"error,omitempty"`
	// Agrees is set when Reward equals the record's reward: a grader that
	// disagrees with itself on one end state gives rewards no one can
	// trust.
	Agrees bool `json:"agrees"`
}

// EnvReport is what a desktop said about an attempt (desktop.Reporter).
type EnvReport struct {
	Reset    string `json:"reset,omitempty"`
	ResetWhy string `json:"reset_why,omitempty"`
	// Golden is the key of the golden state the attempt started from,
	// when its reset loaded or built one.
	Golden  string      `json:"golden,omitempty"`
	Grading []MetricRun `json:"grading,omitempty"`
	// Host names the machine the desktop ran on when the backend spreads
	// desktops over several, and VM the desktop there.
	Host string `json:"host,omitempty"`
	VM   string `json:"vm,omitempty"`
	// Ended lists the processes the reset ended in the guest, and Spared
	// those started since its clean state that it left running because
	// they are not the desktop user's: a reader can see what a reset did
	// to a machine.
	Ended  []Process `json:"ended,omitempty"`
	Spared []Process `json:"spared,omitempty"`
	// UnsettledStart is set when the wait after the reset reached its
	// bound before the screen settled: the first step's screenshot may
	// show the screen mid-change.
	UnsettledStart bool `json:"unsettled_start,omitempty"`
}

// Process is a process in a desktop's guest.
type Process struct {
	PID  int    `json:"pid"`
	Name string `json:"name"`
	UID  int    `json:"uid"`
}

// MetricRun is one metric of a grade and how it ran: "native" or "python".
// ResultSHA256 and ExpectedSHA256 are digests of the values the metric was
// given (see desktop.MetricRun); empty when there were none, in records
// written before they existed too.
type MetricRun struct {
	Metric         string `json:"metric"`
	Via            string `json:"via"`
	ResultSHA256   string `json:"result_sha256,omitempty"`
	ExpectedSHA256 string `json:"expected_sha256,omitempty"`
}

// Policy identifies the weights that produced a record, and how they were
// sampled: a trainer computing importance ratios needs the temperature and
// top-p the tokens were drawn with.
type Policy struct {
	Model   string `json:"model"`
	Version string `json:"version"`
	// Temperature and TopP are what every request of the record sent;
	// absent when they were left to the server (its defaults, or the
	// model's generation config on vLLM and SGLang).
	Temperature *float64 `json:"temperature,omitempty"`
	TopP        *float64 `json:"top_p,omitempty"`
	// MaxTokens caps generated tokens per call; absent when unset.
	MaxTokens int `json:"max_tokens,omitempty"`
}

// ErrorInfo says why an attempt ended in StatusError (or was retried).
type ErrorInfo struct {
	Kind    string `json:"kind"`
	Message string `json:"message"`
}

// Timing is seconds spent per phase of an attempt. The phases do not overlap,
// so their sum is at most TotalS.
type Timing struct {
	ResetS          float64 `json:"reset_s"`
	WaitAfterResetS float64 `json:"wait_after_reset_s"`
	QueueS          float64 `json:"queue_s"`
	ModelS          float64 `json:"model_s"`
	ActS            float64 `json:"act_s"`
	WaitS           float64 `json:"wait_s"`
	ObsS            float64 `json:"obs_s"`
	WaitBeforeEvalS float64 `json:"wait_before_eval_s"`
	EvalS           float64 `json:"eval_s"`
	TotalS          float64 `json:"total_s"`
	// ServerDownS is the time the attempt's model calls waited for an
	// absent model server to answer again (not part of model_s).
	ServerDownS float64 `json:"server_down_s,omitempty"`
	// PausedS is the time the attempt's model calls were held while its
	// service's policy was paused (a trainer swapping weights; not part of
	// model_s).
	PausedS float64 `json:"paused_s,omitempty"`
}

// Step is one policy call and the actions its reply produced.
type Step struct {
	// Request is the prompt as message hashes (see Run.PutMessages).
	Request []string `json:"request"`
	// PromptTokenChunks are the prompt's token ids as the server counted
	// them, as chunk hashes (see Run.PutTokenIDs and
	// MessageStore.PromptTokenIDs); absent when the server did not return
	// them.
	PromptTokenChunks []string `json:"prompt_token_chunks,omitempty"`
	// PromptTokenCount is how many ids the chunks hold, which a reader
	// checks; absent without ids and in records written before it existed.
	PromptTokenCount int `json:"prompt_token_count,omitempty"`
	// PolicyVersion is the version of the weights that generated the
	// response: the server's own (SGLang's weight_version) when it says,
	// else the version in force when the call was sent. Empty in records
	// written before it existed: the record's Policy.Version then holds.
	PolicyVersion string `json:"policy_version,omitempty"`
	// StartedAt is when the step's model call was issued (after any
	// queueing for --max-inflight).
	StartedAt Time           `json:"started_at"`
	Response  Response       `json:"response"`
	Model     ModelCall      `json:"model"`
	Actions   []ActionRecord `json:"actions"`
	// ParseError is set when the reply did not parse into actions.
	ParseError string `json:"parse_error,omitempty"`
	// Warnings flags data problems, e.g. "logprobs_token_ids_mismatch"
	// (see LogprobDefect for the ones that make a step untrainable).
	Warnings []string `json:"warnings,omitempty"`
	// ServerDownS is the time the step's model call waited for an absent
	// model server to answer again.
	ServerDownS float64 `json:"server_down_s,omitempty"`
}

// Step warnings that make a step's logprobs unusable for training: a
// trainer computing importance ratios or a KL term from them would be
// silently wrong. Export refuses such steps unless told otherwise.
const (
	// WarnNonFiniteLogprobs: the server sent some logprobs as null (how
	// vLLM and SGLang send NaN), NaN or ±Inf. Response.Logprobs is then
	// null rather than holding zeros or gaps: a 0.0 would read as
	// probability 1, and a shorter array would misalign with the ids.
	WarnNonFiniteLogprobs = "nonfinite_logprobs"
	// WarnLogprobsMismatch: the server sent a number of logprobs other
	// than the number of generated token ids; both are kept as they came,
	// but no logprob can be matched to its token.
	WarnLogprobsMismatch = "logprobs_token_ids_mismatch"
)

// LogprobDefect returns the warning that makes s's logprobs unusable
// (WarnNonFiniteLogprobs, then WarnLogprobsMismatch), or "" when they are
// usable or absent. A length mismatch of exact ids and logprobs counts even
// without its warning, so records written before the warning existed are
// judged the same.
func (s *Step) LogprobDefect() string {
	if slices.Contains(s.Warnings, WarnNonFiniteLogprobs) {
		return WarnNonFiniteLogprobs
	}
	r := &s.Response
	if slices.Contains(s.Warnings, WarnLogprobsMismatch) ||
		(r.TokenIDsSource.Exact() && r.Logprobs != nil && len(r.Logprobs) != len(r.TokenIDs)) {
		return WarnLogprobsMismatch
	}
	return ""
}

// Response is what the model generated.
type Response struct {
	Content   string `json:"content"`
	Reasoning string `json:"reasoning"`
	// TokenIDs are the generated ids, the stop token included (servers
	// count it in completion_tokens and leave it out of Content). Empty
	// when the server gave no exact ids: Tokens then holds the token
	// strings, which are lossy (a character split across tokens shows as
	// U+FFFD in each).
	TokenIDs []int64   `json:"token_ids"`
	Logprobs []float64 `json:"logprobs"`
	Tokens   []string  `json:"tokens"`
	// TokenIDsSource says how the ids came; a trainer keeps the steps whose
	// source is Exact. Empty in records written before it existed.
	TokenIDsSource TokenIDSource `json:"token_ids_source,omitempty"`
	FinishReason   string        `json:"finish_reason"`
}

// TokenIDSource is how a response's generated token ids came from the
// server.
type TokenIDSource string

const (
	// SourceReturnTokenIDs: the server's token_ids field, asked for with
	// return_token_ids (vLLM 0.10.2 and later, SGLang since mid-2026).
	SourceReturnTokenIDs TokenIDSource = "return_token_ids"
	// SourceTokensAsIDs: logprob token strings of the form "token_id:N",
	// asked for with vLLM's return_tokens_as_token_ids (vLLM 0.10.1 and
	// earlier releases that lack return_token_ids).
	SourceTokensAsIDs TokenIDSource = "tokens_as_ids"
	// SourceMetaInfo: SGLang's meta_info.output_token_logprobs, entries
	// [logprob, id, text], asked for with return_meta_info (SGLang
	// releases before return_token_ids).
	SourceMetaInfo TokenIDSource = "meta_info"
	// SourceStrings: no exact ids; Tokens holds the logprob token
	// strings, which a trainer would have to re-tokenize.
	SourceStrings TokenIDSource = "strings"
)

// Exact reports whether ids from s are the ids the server generated.
func (s TokenIDSource) Exact() bool {
	return s == SourceReturnTokenIDs || s == SourceTokensAsIDs || s == SourceMetaInfo
}

// ModelCall is the cost of one model call.
type ModelCall struct {
	Seconds          float64 `json:"seconds"`
	QueueS           float64 `json:"queue_s"`
	Attempts         int     `json:"attempts"`
	PromptTokens     int     `json:"prompt_tokens"`
	CompletionTokens int     `json:"completion_tokens"`
	// CachedTokens is the prompt tokens the server's prefix cache served;
	// null when the answer did not say. Servers leave it out when cache
	// reporting is off, and some also when nothing was cached (vLLM from
	// 0.9 to mid-2026 sends null at 0; SGLang sends 0 with image counts
	// even with reporting off), so null is not 0.
	CachedTokens *int `json:"cached_tokens"`
	// Replica is the base URL of the server that answered, when the batch
	// spread its calls over several.
	Replica string `json:"replica,omitempty"`
}

// ActionRecord is one action sent to the desktop and the time around it.
type ActionRecord struct {
	// Action is exactly what was sent: pyautogui code, WAIT, DONE or FAIL.
	Action string `json:"action"`
	// Call is the parsed tool call the action came from.
	Call   json.RawMessage `json:"call,omitempty"`
	ActS   float64         `json:"act_s"`
	WaitS  float64         `json:"wait_s"`
	ReadyS float64         `json:"ready_s"`
	ObsS   float64         `json:"obs_s"`
	// CaptureS, EncodeS and TransferS split obs_s where the screenshot
	// was taken in the guest with the wait (one round trip per step):
	// the capture from the X server, its encoding as PNG, and the rest,
	// the round trip of the step's request and answer. Absent otherwise.
	// With ShotInWait the screenshot was taken while the wait ran (the
	// screen was quiet and stayed so until it counted as settled): its
	// capture and encoding are then part of wait_s, and obs_s is all
	// transfer.
	CaptureS   float64 `json:"capture_s,omitempty"`
	EncodeS    float64 `json:"encode_s,omitempty"`
	TransferS  float64 `json:"transfer_s,omitempty"`
	ShotInWait bool    `json:"shot_in_wait,omitempty"`
	// Unsettled is set when the wait after the action reached its bound
	// while the screen was still changing: the next observation may show
	// it mid-change (an animation, a progress bar, a blinking element).
	Unsettled bool `json:"unsettled,omitempty"`
}

// TimeLayout is RFC 3339 with milliseconds, the layout of every time field.
const TimeLayout = "2006-01-02T15:04:05.000Z07:00"

// Time is a time written as RFC 3339 with milliseconds, in UTC.
type Time struct{ time.Time }

// MarshalJSON implements json.Marshaler.
func (t Time) MarshalJSON() ([]byte, error) {
	if t.IsZero() {
		return []byte("null"), nil
	}
	return []byte(`"` + t.UTC().Format(TimeLayout) + `"`), nil
}

// UnmarshalJSON implements json.Unmarshaler.
func (t *Time) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		t.Time = time.Time{}
		return nil
	}
	s, ok := plainString(b)
	if !ok {
		if err := json.Unmarshal(b, &s); err != nil {
			return fmt.Errorf("time: %w", err)
		}
	}
	v, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return err
	}
	t.Time = v
	return nil
}

// plainString returns the string the JSON text b holds when b is a
// string of printable ASCII without escapes, what legato writes for a
// time: json.Unmarshal, which every other string takes, was a twentieth
// of reading a record.
func plainString(b []byte) (string, bool) {
	if len(b) < 2 || b[0] != '"' || b[len(b)-1] != '"' {
		return "", false
	}
	for _, c := range b[1 : len(b)-1] {
		if !plainByte(c) {
			return "", false
		}
	}
	return string(b[1 : len(b)-1]), true
}

// Version returns the policy version that generated the step's response,
// rec's when the step does not say (records written before steps did).
func (s *Step) Version(rec *Record) string {
	if s.PolicyVersion != "" {
		return s.PolicyVersion
	}
	return rec.Policy.Version
}
