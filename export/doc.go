// Package export turns a run directory into what a trainer and a person
// read: one training sample per model call with GRPO group advantages
// (ExportSteps), and the batch's summary (SummaryBuilder, Summarize), which
// `legato rl collect` writes to summary.json and `legato rl profile` prints.
//
// Everything here streams rollouts.jsonl: memory grows with the number of
// attempts (a few numbers each), never with the number of steps or the
// size of the prompts.
//
// # Advantages
//
// A sample's advantage is (reward − mean) / std over the rewards of its
// group's finished attempts (status ok or truncated), where std is the
// population standard deviation (divide by n) or, when the batch recorded
// it (schema.SampleStd, collect --advantage-std sample) or
// Options.AdvantageStd says so, the sample one (divide by n−1, as slime
// and SkyRL compute theirs). Advantages computes it, for every caller.
// When every finished reward of a group is equal, including a group with
// one finished attempt, the advantages are 0: such a group carries no GRPO
// signal. Cancelled, skipped, surplus, retried and error records never
// enter the statistics, and only finished attempts are exported. A group
// that never ended (schema.GroupEnded: fewer finished attempts than
// batch.json's group while some attempts have no final record, as a
// stopped collect leaves it) is left out, its advantages over the attempts
// it has being another group's, unless Options.PartialGroups.
//
// An export writes each attempt's samples as it reads its record, before
// the rest of its group is read: the advantage gets advantageWidth bytes,
// spaces then the number, written once every record is read. JSON allows
// whitespace before a value, so a reader gets the number encoding/json
// writes; an export that drops constant groups reads the records twice
// and writes the same bytes.
//
// # Server idle time
//
// Summary.ServerIdleS says, for each phase, how much of the batch's wall time
// the model server had no call in flight while at least one desktop was in
// that phase: the time a faster desktop phase would give back to the GPUs.
// It is computed from the records' timestamps (see Timeline for how an
// attempt's phases are laid out). The figures are approximations: a record
// stores each phase's duration, not its start, so phases other than the
// model call are placed back to back from the attempt's start and from each
// step's model-call start; time covered by no recorded phase (scheduling,
// harness work) belongs to no phase. Two desktops in different phases at
// the same moment count for both phases, so the per-phase figures may sum
// to more than ServerIdleS["total"], the wall time with no call in flight.
package export
