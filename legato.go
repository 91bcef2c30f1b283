// Package rl runs the rollout side of reinforcement learning for
// computer-use agents.
//
// A trainer owns the weights and a model server (vLLM, SGLang, a provider)
// serves them over an OpenAI-compatible API. legato sits between that server
// and a set of desktops: for every task it runs a group of attempts, each on
// one desktop,
//
//	reset → wait until ready → [screenshot → model call → actions → wait]* → grade
//
// and writes every attempt to a run directory in the legato.rollout/v0
// format: the exact prompts, the generated token ids and logprobs, the
// reward from the task's OSWorld evaluator and the policy version. Export
// turns a run into one training sample per model call with GRPO group
// advantages.
//
// Collect runs a batch; ExportSteps writes training samples; LoadRequest
// rebuilds the prompt of a recorded step. Desktops implement
// desktop.Desktop: desktop/osworld runs OSWorld tasks in libvirt VMs,
// desktop/fake runs none for tests and for wiring up a trainer.
package rl

import (
	"legato/rl/desktop"
	"legato/rl/export"
	"legato/rl/schema"
)

// Domain types, defined next to the contracts that need them and named here
// for users of the root package.
type (
	Task        = desktop.Task
	Observation = desktop.Observation
	Action      = desktop.Action
	ActResult   = desktop.ActResult
	Desktop     = desktop.Desktop

	Record  = schema.Record
	Step    = schema.Step
	Status  = schema.Status
	Summary = schema.Summary
	Message = schema.Message
)

// Rollout statuses.
const (
	StatusOK        = schema.StatusOK
	StatusTruncated = schema.StatusTruncated
	StatusCancelled = schema.StatusCancelled
	StatusSkipped   = schema.StatusSkipped
	StatusSurplus   = schema.StatusSurplus
	StatusRetried   = schema.StatusRetried
	StatusError     = schema.StatusError
)

// Batch states, as Summary.State says them.
const (
	StateRunning     = schema.StateRunning
	StateComplete    = schema.StateComplete
	StateIncomplete  = schema.StateIncomplete
	StateInterrupted = schema.StateInterrupted
	StateStopped     = schema.StateStopped
)

// ExportOptions configures ExportSteps; ExportStats reports what it wrote.
type (
	ExportOptions = export.Options
	ExportStats   = export.Stats
)

// ExportSteps writes one training sample per model call of every finished
// (ok, truncated) attempt of the run in runDir to outPath as JSON lines, with
// GRPO group advantages. It streams: memory stays flat however large the
// run.
func ExportSteps(runDir, outPath string, opts ExportOptions) (ExportStats, error) {
	return export.ExportSteps(runDir, outPath, opts)
}

// LoadRequest rebuilds the exact prompt of a recorded step, with images as
// PNG data URLs.
func LoadRequest(runDir string, step Step) ([]Message, error) {
	return schema.LoadRequest(runDir, step, schema.LoadOptions{})
}
