// Package schema defines legato's on-disk run format, legato.rollout/v0: the
// attempt records of rollouts.jsonl, the content-addressed message and image
// stores, and the summary.
//
// It is also the run directory's storage engine: how legato writes the
// directory and reads it back. The two share one package; each file is one
// or the other.
//
// # Format
//
// What a trainer or another tool reads, and the rules for reading it:
//
//	record.go      a line of rollouts.jsonl: Record, Step, Response, Timing, Status
//	message.go     a prompt's messages (Message, Part), images as legato-image:// references
//	batch.go       batch.json (Batch, Sampling, Environment), ReadBatch and Run.WriteBatch
//	summary.go     summary.json (Summary, HostSummary, Percentiles)
//	attempts.go    the rule every reader takes each attempt's record by (AttemptRule, GroupEnded)
//	regrade.go     a line of regrades.jsonl (Regrade), appended and read (LatestRegrades)
//	quarantine.go  quarantine.json, the tasks not to train on (Quarantine), read and added to
//
// # Storage
//
// How legato writes the run directory and reads it back:
//
//	run.go         Run, the directory's one writer (its lock, grouped appends to rollouts.jsonl, summary.json); the directory's names
//	store.go       Run.PutMessages: messages and images into the content store
//	pack.go        pack files, which hold the small objects (messages, token chunks), written and indexed
//	tokens.go      prompt token ids stored as chunks shared between steps, and read back
//	load.go        MessageStore: messages, images and token chunks read back through caches
//	lru.go         the cost-bounded LRU cache of a MessageStore
//	read.go        reading rollouts.jsonl: ReadRecords and its variants, ReadStats, torn lines
//	fastparse.go   a record line's big arrays parsed without the JSON decoder
//	numbers.go     number arrays decoded without reflection; RecordText, logprobs kept as text
//	jsonlines.go   reading an append-only JSON lines file whose last line may be torn
//	repair.go      Run.Repair: unreadable lines and second final records moved to rollouts.quarantine.jsonl
//	file.go        the run's own files (CheckOutput), file modes, atomic writes of outputs
//	outtemp.go     outputs' locked temp files, and the removal of those dead writers left
//	lock_unix.go   the directory's flock (lock_other.go: none where flock is missing)
//	errors.go      the sentinel errors, ObjectError (a store object), LineError (a line of rollouts.jsonl)
package schema
