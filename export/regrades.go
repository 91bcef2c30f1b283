package export

import (
	"fmt"

	"legato/rl/schema"
)

// readRegrades returns, with Options.Rewards "regraded", the latest
// regraded reward of each attempt; nil otherwise.
func readRegrades(runDir string, opts Options) (map[string]float64, error) {
	switch opts.Rewards {
	case "", RewardsRecorded:
		return nil, nil
	case RewardsRegraded:
	default:
		return nil, fmt.Errorf("rewards %q: want %q or %q", opts.Rewards, RewardsRecorded, RewardsRegraded)
	}
	latest, err := schema.LatestRegrades(runDir)
	if err != nil {
		return nil, err
	}
	out := make(map[string]float64, len(latest))
	for id, r := range latest {
		out[id] = *r.Regraded
	}
	return out, nil
}
