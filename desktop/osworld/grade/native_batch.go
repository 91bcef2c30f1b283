package grade

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
)

// Where OSWorld's getter asks the guest server one command at a time
// (default_video_player: 85 xdg-mime queries), each command is a round trip
// to the guest: under software emulation most of a second each, before the
// command itself runs. A native getter runs such a list in one request
// instead: one Python process in the guest runs the commands as the
// server's /execute runs one and answers with each one's output, error and
// exit code, or the failure the server would have answered. Only commands
// that read the guest are batched, so they may run side by side, one per
// guest CPU (at most 4): under emulation each xdg-mime query is itself
// about a second of starting processes (measured on the real-apps guest,
// 2 vCPUs: four queries side by side in 1.97 s, one after another in
// 2.62 s). The rest of a batch cut short by its time budget goes in the
// next request, and a guest that runs no batch (no python3) takes the
// commands one request each.

// batchScript runs the commands of a batch, given as JSON in argv[1]
// ({"commands": [[arg, ...], ...], "budget": seconds}), as the guest
// server's /execute runs one: "~/" arguments expanded, standard output
// and error decoded as text, 120 s each; as many at once as the guest has
// CPUs, up to 4, taken in order. It starts no command once budget seconds
// have passed (but always the first), so that it answers well within the
// server's own 120 s bound on the batch, and prints {"results": [...]}, in
// the commands' order up to the first one not started: per command,
// {"output", "error", "returncode"}, or {"failed": message} where the
// server would answer with an error.
const batchScript = `import json, os, subprocess, sys, time
from concurrent.futures import ThreadPoolExecutor
req = json.loads(sys.argv[1])
start = time.monotonic()
def run(job):
    i, argv = job
    if i and time.monotonic() - start > req["budget"]:
        return None
    argv = [os.path.expanduser(a) if a.startswith("~/") else a for a in argv]
    try:
        r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
        return {"output": r.stdout, "error": r.stderr, "returncode": r.returncode}
    except Exception as e:
        return {"failed": str(e)}
with ThreadPoolExecutor(max_workers=max(1, min(4, os.cpu_count() or 1))) as pool:
    results = list(pool.map(run, enumerate(req["commands"])))
if None in results:
    results = results[:results.index(None)]
sys.stdout.write(json.dumps({"results": results}))
`

// batchBudget is how long a batch starts commands for, in seconds: the
// guest server stops a request after 120 s, and the last command started
// may take a while.
const batchBudget = 60

// commandResult is one command's outcome: what it produced, or refused
// when the server would have answered it with an error status (OSWorld's
// getters get None then).
type commandResult struct {
	ExecResult
	refused bool
}

// executeEach runs commands that only read the guest (argv lists, no
// shell) and returns each one's result, in order, as one Execute of each
// would: a refused command is marked, not an error; a guest that cannot be
// reached is an error. It takes one request while the batch fits in
// batchBudget, and one request per command where the guest cannot run a
// batch (no python3).
func executeEach(ctx context.Context, g Guest, commands [][]string) ([]commandResult, error) {
	out := make([]commandResult, 0, len(commands))
	for len(out) < len(commands) {
		got, err := executeBatch(ctx, g, commands[len(out):])
		if errors.Is(err, errNoBatch) {
			break
		}
		if err != nil {
			return nil, err
		}
		out = append(out, got...)
	}
	for _, argv := range commands[len(out):] {
		res, err := g.Execute(ctx, argv, false)
		switch {
		case refused(err):
			out = append(out, commandResult{refused: true})
		case err != nil:
			return nil, fmt.Errorf("execute %q: %w", argv, err)
		default:
			out = append(out, commandResult{ExecResult: res})
		}
	}
	return out, nil
}

// errNoBatch means the guest did not run a batch: its commands go one
// request each.
var errNoBatch = errors.New("the guest runs no batch of commands")

// executeBatch runs the first commands in one request: at least one, all
// that batchBudget allows.
func executeBatch(ctx context.Context, g Guest, commands [][]string) ([]commandResult, error) {
	req, err := json.Marshal(map[string]any{"commands": commands, "budget": batchBudget})
	if err != nil {
		return nil, err
	}
	res, err := g.Execute(ctx, []string{"python3", "-c", batchScript, string(req)}, false)
	if refused(err) {
		return nil, fmt.Errorf("%w: %w", errNoBatch, err)
	}
	if err != nil {
		return nil, fmt.Errorf("execute a batch of %d commands: %w", len(commands), err)
	}
	var ans struct {
		Results []struct {
			Output     string  `json:"output"`
			Error      string  `json:"error"`
			ReturnCode int     `json:"returncode"`
			Failed     *string `json:"failed"`
		} `json:"results"`
	}
	if res.ReturnCode != 0 || json.Unmarshal([]byte(res.Output), &ans) != nil || len(ans.Results) == 0 || len(ans.Results) > len(commands) {
		return nil, fmt.Errorf("%w: exit code %d, %.200q", errNoBatch, res.ReturnCode, res.Error)
	}
	out := make([]commandResult, len(ans.Results))
	for i, r := range ans.Results {
		out[i] = commandResult{ExecResult: ExecResult{Output: r.Output, Error: r.Error, ReturnCode: r.ReturnCode}, refused: r.Failed != nil}
	}
	return out, nil
}
