package schema

// SummaryVersion is the value of summary.json's "schema" field.
const SummaryVersion = "legato.summary/v0"

// Summary describes a batch, computed from its run directory. It is written
// as DIR/summary.json during the batch and at its end, and printed by
// `legato rl profile`.
type Summary struct {
	Schema string `json:"schema"`
	Policy Policy `json:"policy"`
	// Final is false while the batch is still running.
	Final bool `json:"final"`
	// State is how the batch stands: running, complete (every group has G
	// finished attempts), incomplete (it ended with groups short, see the
	// error records), interrupted (stopped by its caller: Ctrl-C) or
	// stopped (it could not go on: StopReason says why). Collecting again
	// continues an interrupted, stopped or incomplete batch.
	State      BatchState `json:"state,omitempty"`
	StopReason string     `json:"stop_reason,omitempty"`
	// Warnings name what a trainer should know about the data before using
	// it (steps without logprobs or token ids, ...).
	Warnings []string `json:"warnings,omitempty"`

	Tasks        int `json:"tasks"`
	Groups       int `json:"groups"`
	GroupsClosed int `json:"groups_closed"`
	// Records counts every line of rollouts.jsonl; Counts splits them by
	// status.
	Records int            `json:"records"`
	Counts  map[Status]int `json:"counts"`

	// SuccessRate is the mean reward of finished (ok, truncated) attempts;
	// SolvedShare the share of them with reward 1.
	SuccessRate float64 `json:"success_rate"`
	SolvedShare float64 `json:"solved_share"`
	// GroupsWithVariance counts closed groups whose finished rewards are not
	// all equal (the groups that carry a GRPO signal).
	GroupsWithVariance int `json:"groups_with_variance"`

	// WallS is from the first record's start to the last record's end.
	WallS           float64 `json:"wall_s"`
	RolloutsPerHour float64 `json:"rollouts_per_hour"`
	// PhaseShare is each timing phase's share of the summed attempt time,
	// keyed by the Timing field name ("model_s", "reset_s", ...).
	PhaseShare map[string]float64 `json:"phase_share"`
	// ServerIdleS is, per phase, the seconds of wall time during which no
	// model call was in flight while at least one desktop was in that phase.
	ServerIdleS map[string]float64 `json:"server_idle_s"`

	ModelCalls   int         `json:"model_calls"`
	RetriedCalls int         `json:"retried_calls"`
	ModelLatency Percentiles `json:"model_latency_s"`
	PolicyErrors int         `json:"policy_errors"`
	EnvErrors    int         `json:"env_errors"`
	// ErrorsRerun counts error records a later record of the same attempt
	// replaced: a resume ran the attempt again. They are in Counts, not in
	// PolicyErrors and EnvErrors.
	ErrorsRerun int `json:"errors_rerun"`
	// ServerDownS is the wall time the batch waited for an absent model
	// server (known to collect only; profile leaves it 0).
	ServerDownS float64 `json:"server_down_s"`
	// Outages counts the episodes in which the model server was away
	// (known to collect only). ServerDownS and Outages add up every run of
	// the batch: a resume carries over what the earlier runs' summary.json
	// said.
	Outages int `json:"outages"`
	// Stops lists, earliest first, the runs of the batch that ended before
	// it was done: stopped, interrupted, or ended without a final summary
	// (killed). The last is this run's when it stopped.
	Stops []Stop `json:"stops,omitempty"`
	// PrefixCacheHitRate is cached prompt tokens / prompt tokens, when
	// PrefixCacheReported. A step whose answer gave no count counts as 0
	// cached: servers that report leave the count out at 0.
	PrefixCacheHitRate float64 `json:"prefix_cache_hit_rate"`
	// PrefixCacheReported: some step's answer gave a cached-token count.
	// When false the hit rate is unknown, not 0 (the server does not
	// report cached tokens: vLLM without --enable-prompt-tokens-details,
	// SGLang without --enable-cache-report).
	PrefixCacheReported bool `json:"prefix_cache_reported"`
	// StepsWithLogprobs and StepsWithTokenIDs are shares of steps;
	// StepsWithExactTokenIDs the share whose ids are the generated ones
	// (TokenIDSource.Exact), StepsWithPromptTokenIDs the share with prompt
	// token ids.
	StepsWithLogprobs       float64 `json:"steps_with_logprobs"`
	StepsWithTokenIDs       float64 `json:"steps_with_token_ids"`
	StepsWithExactTokenIDs  float64 `json:"steps_with_exact_token_ids"`
	StepsWithPromptTokenIDs float64 `json:"steps_with_prompt_token_ids"`
	// TokenIDSource is how most steps got their generated ids: the way the
	// client settled on for the server (return_token_ids, tokens_as_ids,
	// meta_info, or strings when the server gives no exact ids); empty
	// before any step. TokenIDSources counts steps per source.
	TokenIDSource  TokenIDSource         `json:"token_id_source"`
	TokenIDSources map[TokenIDSource]int `json:"token_id_sources"`
	// StepsNonFiniteLogprobs counts the steps whose server sent null,
	// NaN or ±Inf logprobs, and StepsLogprobsMismatch those whose logprobs
	// are not one per generated token id (Step.LogprobDefect): a trainer
	// cannot use their logprobs, and export refuses them unless
	// --allow-bad-logprobs.
	StepsNonFiniteLogprobs int `json:"steps_nonfinite_logprobs"`
	StepsLogprobsMismatch  int `json:"steps_logprobs_mismatch"`

	// Grading counts, per metric, the grades that ran natively and through
	// OSWorld's Python ("native", "python"); Resets counts the resets by
	// kind. Both come from the records' env blocks (desktops that say).
	Grading map[string]map[string]int `json:"grading,omitempty"`
	Resets  map[string]int            `json:"resets,omitempty"`
	// Hosts breaks the batch down by the host its desktops ran on, for
	// backends that spread desktops over several (the records' env.host).
	Hosts map[string]HostSummary `json:"hosts,omitempty"`

	// GradedTwice counts the records whose end state was graded a second
	// time (collect --grade-twice); GraderDisagreements counts, per task,
	// those whose second grade gave another reward.
	GradedTwice         int            `json:"graded_twice,omitempty"`
	GraderDisagreements map[string]int `json:"grader_disagreements,omitempty"`
	// QuarantineSkipped names the tasks this batch did not run because a
	// quarantine held them at its start; Quarantined the tasks it put in
	// quarantine, with why, in this run or an earlier one of the batch (a
	// resume): what its directory's quarantine.json holds.
	QuarantineSkipped []string          `json:"quarantine_skipped,omitempty"`
	Quarantined       map[string]string `json:"quarantined,omitempty"`

	// UnsettledWaits counts the post-action waits that reached their bound
	// before the screen settled (ActionRecord.Unsettled).
	UnsettledWaits int `json:"unsettled_waits"`
	// UnsettledStarts counts the attempts whose wait after the reset
	// reached its bound before the screen settled
	// (EnvReport.UnsettledStart).
	UnsettledStarts int `json:"unsettled_starts"`

	// TornLines counts unreadable lines skipped in rollouts.jsonl.
	TornLines int `json:"torn_lines"`
}

// Stop is one run of a batch that ended before the batch was done.
type Stop struct {
	State  BatchState `json:"state"`
	Reason string     `json:"reason,omitempty"`
}

// HostSummary is one host's part of a batch.
type HostSummary struct {
	// Desktops counts the desktops (VMs) that ran tries on the host.
	Desktops int `json:"desktops"`
	// Attempts counts the tries (records) that ran on the host; Finished
	// those that ended ok or truncated; Failures those that ended in a
	// desktop failure (retried elsewhere, or an env error).
	Attempts int `json:"attempts"`
	Finished int `json:"finished"`
	Failures int `json:"failures"`
	// PhaseS sums the tries' seconds per timing phase ("reset_s", ...),
	// and AttemptS their whole time.
	PhaseS   map[string]float64 `json:"phase_s"`
	AttemptS float64            `json:"attempt_s"`
}

// Percentiles are latency percentiles in seconds.
type Percentiles struct {
	P50 float64 `json:"p50"`
	P95 float64 `json:"p95"`
	P99 float64 `json:"p99"`
}

// BatchState is Summary.State.
type BatchState string

// Batch states.
const (
	StateRunning     BatchState = "running"
	StateComplete    BatchState = "complete"
	StateIncomplete  BatchState = "incomplete"
	StateInterrupted BatchState = "interrupted"
	StateStopped     BatchState = "stopped"
)
