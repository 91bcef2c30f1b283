package export

import (
	"path/filepath"

	"legato/rl/schema"
)

// heldTasks are the tasks an export leaves out: those of the run's
// quarantine and of the shared one, unless it includes them.
type heldTasks map[string]schema.QuarantinedTask

func readQuarantines(runDir string, opts Options) (heldTasks, error) {
	if opts.IncludeQuarantined {
		return nil, nil
	}
	held := heldTasks{}
	for _, path := range []string{filepath.Join(runDir, schema.TaskQuarantineFile), opts.QuarantineFile} {
		if path == "" {
			continue
		}
		q, err := schema.ReadQuarantine(path)
		if err != nil {
			return nil, err
		}
		for id, e := range q.Tasks {
			held[id] = e
		}
	}
	return held, nil
}

// holds reports whether rec's task is held: by id and config, or by id
// alone for a record that predates recording its task's config.
func (h heldTasks) holds(rec *schema.Record) bool {
	e, ok := h[rec.TaskID]
	return ok && (rec.TaskSHA == "" || rec.TaskSHA == e.TaskSHA)
}
