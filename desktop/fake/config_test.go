package fake_test

import (
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"legato/rl/desktop/fake"
)

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  fake.Config
		want string // in the error; "" for a valid config
	}{
		{"Zero", fake.Config{}, ""},
		{"Full", fake.Config{
			Width: 1280, Height: 720,
			Latency: fake.Latencies{
				Reset:  fake.Latency{Fixed: time.Second, Min: time.Second, Max: 2 * time.Second},
				Act:    fake.Latency{Median: time.Second, Sigma: 0.3, Cap: time.Minute},
				Settle: fake.Latency{Scale: time.Second, Alpha: 1.1},
			},
			Rewards:       map[string]fake.Reward{"t": {P: 0.5, Value: 1}},
			DefaultReward: fake.Reward{P: 1},
			Faults: []fake.Fault{
				{Phase: fake.PhaseCreate, Kind: fake.FaultError, OnCall: 1},
				{Phase: fake.PhaseWaitReady, Kind: fake.FaultHang, Prob: 0.1, Task: "t"},
			},
		}, ""},
		{"WidthTooSmall", fake.Config{Width: 10}, "Width 10"},
		{"HeightNegative", fake.Config{Height: -1}, "Height -1"},
		{"NegativeLatency", fake.Config{Latency: fake.Latencies{Observe: fake.Latency{Fixed: -1}}}, "Latency.Observe: durations"},
		{"MinWithoutMax", fake.Config{Latency: fake.Latencies{Reset: fake.Latency{Min: time.Second}}}, "Latency.Reset: Min is set without Max"},
		{"MaxBelowMin", fake.Config{Latency: fake.Latencies{Reset: fake.Latency{Min: 2, Max: 1}}}, "Max 1ns is below Min"},
		{"SigmaWithoutMedian", fake.Config{Latency: fake.Latencies{Settle: fake.Latency{Sigma: 1}}}, "Latency.Settle: Sigma is set without Median"},
		{"SigmaNaN", fake.Config{Latency: fake.Latencies{Act: fake.Latency{Median: 1, Sigma: math.NaN()}}}, "Sigma NaN"},
		{"AlphaWithoutScale", fake.Config{Latency: fake.Latencies{Create: fake.Latency{Alpha: 2}}}, "Latency.Create: a Pareto draw needs both"},
		{"RewardP", fake.Config{Rewards: map[string]fake.Reward{"t": {P: 1.5}}}, `Rewards["t"]: P 1.5`},
		{"RewardValue", fake.Config{DefaultReward: fake.Reward{P: 1, Value: 2}}, "DefaultReward: Value 2"},
		{"RewardAtStart", fake.Config{Rewards: map[string]fake.Reward{"t": {AtStart: -1}}}, `Rewards["t"]: AtStart -1 must lie in [0, 1]`},
		{"FaultPhase", fake.Config{Faults: []fake.Fault{{Phase: "boot", Kind: fake.FaultError, OnCall: 1}}}, `Faults[0]: unknown Phase "boot"`},
		{"FaultKind", fake.Config{Faults: []fake.Fault{{Phase: fake.PhaseAct, OnCall: 1}}}, "Faults[0]: unknown Kind"},
		{"FaultNever", fake.Config{Faults: []fake.Fault{{Phase: fake.PhaseAct, Kind: fake.FaultHang}}}, "never fires"},
		{"FaultProb", fake.Config{Faults: []fake.Fault{{Phase: fake.PhaseAct, Kind: fake.FaultHang, Prob: -0.1}}}, "Prob -0.1"},
		{"FaultCreateTask", fake.Config{Faults: []fake.Fault{{Phase: fake.PhaseCreate, Kind: fake.FaultError, OnCall: 1, Task: "t"}}}, "Task has no meaning"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("Validate() = %v, want nil", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("Validate() = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func TestNewPanicsOnInvalidConfig(t *testing.T) {
	defer func() {
		if r := recover(); r == nil || !strings.Contains(r.(string), "Width 1") {
			t.Errorf("New(invalid) recovered %v, want a panic naming Width", r)
		}
	}()
	fake.New(fake.Config{Width: 1})
}

// quantile returns the q-quantile of sorted ds.
func quantile(ds []time.Duration, q float64) time.Duration {
	return ds[int(q*float64(len(ds)-1))]
}

func TestLatencySample(t *testing.T) {
	// within reports whether got is within frac of want.
	within := func(got, want time.Duration, frac float64) bool {
		return math.Abs(float64(got-want)) <= frac*float64(want)
	}
	for _, tc := range []struct {
		name string
		l    fake.Latency
		// check returns what is wrong with the sorted samples.
		check func(ds []time.Duration) string
	}{
		{"Zero", fake.Latency{}, func(ds []time.Duration) string {
			if ds[len(ds)-1] != 0 {
				return "non-zero draw"
			}
			return ""
		}},
		{"Fixed", fake.Latency{Fixed: 3 * time.Second}, func(ds []time.Duration) string {
			if ds[0] != 3*time.Second || ds[len(ds)-1] != 3*time.Second {
				return "a draw other than 3s"
			}
			return ""
		}},
		{"Uniform", fake.Latency{Min: time.Second, Max: 3 * time.Second}, func(ds []time.Duration) string {
			if ds[0] < time.Second || ds[len(ds)-1] >= 3*time.Second {
				return "a draw outside [1s, 3s)"
			}
			if !within(quantile(ds, 0.5), 2*time.Second, 0.05) || !within(quantile(ds, 0.25), 1500*time.Millisecond, 0.05) {
				return "quartiles are not those of a uniform draw"
			}
			return ""
		}},
		{"FixedPlusUniform", fake.Latency{Fixed: time.Second, Max: time.Second}, func(ds []time.Duration) string {
			if ds[0] < time.Second || ds[len(ds)-1] >= 2*time.Second {
				return "a draw outside [1s, 2s)"
			}
			return ""
		}},
		{"LogNormal", fake.Latency{Median: time.Second, Sigma: 0.5}, func(ds []time.Duration) string {
			// Quantiles of exp(0.5·Z): median 1, 84th percentile e^0.5.
			if !within(quantile(ds, 0.5), time.Second, 0.05) || !within(quantile(ds, 0.8413), time.Duration(math.Exp(0.5)*1e9), 0.05) {
				return "quantiles are not those of a log-normal draw"
			}
			return ""
		}},
		{"Pareto", fake.Latency{Scale: 100 * time.Millisecond, Alpha: 1.5}, func(ds []time.Duration) string {
			// Quantile q of a Pareto is xm·(1-q)^(-1/alpha): a heavy tail,
			// the 99th percentile about 21 times the minimum.
			if ds[0] < 100*time.Millisecond {
				return "a draw below the scale"
			}
			if !within(quantile(ds, 0.5), time.Duration(100e6*math.Pow(0.5, -1/1.5)), 0.05) ||
				!within(quantile(ds, 0.99), time.Duration(100e6*math.Pow(0.01, -1/1.5)), 0.15) {
				return "quantiles are not those of a Pareto draw"
			}
			return ""
		}},
		{"Capped", fake.Latency{Scale: time.Second, Alpha: 0.5, Cap: 10 * time.Second}, func(ds []time.Duration) string {
			if ds[len(ds)-1] != 10*time.Second {
				return "the largest draw of an infinite-mean tail is not the cap"
			}
			return ""
		}},
		{"HugeTailDoesNotOverflow", fake.Latency{Scale: time.Hour, Alpha: 0.01}, func(ds []time.Duration) string {
			if ds[0] < time.Hour {
				return "a draw below the scale (overflow?)"
			}
			return ""
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.l.Validate(); err != nil {
				t.Fatal(err)
			}
			r := rand.New(rand.NewPCG(1, 2))
			ds := make([]time.Duration, 20000)
			for i := range ds {
				ds[i] = tc.l.Sample(r)
			}
			slices.Sort(ds)
			if msg := tc.check(ds); msg != "" {
				t.Errorf("%s: min %v, median %v, p99 %v, max %v", msg, ds[0], quantile(ds, 0.5), quantile(ds, 0.99), ds[len(ds)-1])
			}
		})
	}
}
