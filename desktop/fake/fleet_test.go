package fake_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"

	"legato/rl/desktop"
	"legato/rl/desktop/fake"
)

func TestFleetNamesAndSeeds(t *testing.T) {
	ctx := t.Context()
	task := feasibleTask(t)
	// rewardsBySlot creates desktops for slots 0, 1, 0 (a replacement) and
	// returns their names and 32 rewards of each.
	rewardsBySlot := func() ([]string, [][]float64) {
		f := fake.NewFleet(fake.Config{Width: 64, Height: 64, Seed: 3, DefaultReward: fake.Reward{P: 0.5}})
		var rs [][]float64
		for _, slot := range []int{0, 1, 0} {
			d, err := f.New(ctx, slot)
			if err != nil {
				t.Fatal(err)
			}
			rs = append(rs, rewards(t, d, task, 32))
			d.Close()
		}
		var names []string
		for _, d := range f.Desktops() {
			names = append(names, d.Name())
		}
		return names, rs
	}
	names, rs := rewardsBySlot()
	if diff := cmp.Diff([]string{"fake-0", "fake-1", "fake-0.1"}, names); diff != "" {
		t.Errorf("names (-want +got):\n%s", diff)
	}
	for i := range rs {
		for j := range i {
			if cmp.Equal(rs[i], rs[j]) {
				t.Errorf("desktops %s and %s drew the same rewards: seeds not distinct", names[j], names[i])
			}
		}
	}
	if _, again := rewardsBySlot(); !cmp.Equal(rs, again) {
		t.Error("a second fleet with the same config drew other rewards")
	}
}

func TestFleetFaultsAndStats(t *testing.T) {
	ctx := t.Context()
	f := fake.NewFleet(fake.Config{
		Width: 64, Height: 64,
		Faults: []fake.Fault{
			// The first desktop of slot 0 crashes; its replacement works.
			{Phase: fake.PhaseReset, Kind: fake.FaultCrash, OnCall: 1, Desktop: "fake-0"},
			// The third creation fails.
			{Phase: fake.PhaseCreate, Kind: fake.FaultError, OnCall: 3},
		},
	})
	task := feasibleTask(t)
	d0, err := f.New(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := d0.Reset(ctx, task); !errors.Is(err, fake.ErrCrashed) {
		t.Fatalf("Reset on fake-0: %v, want ErrCrashed", err)
	}
	d0.Close()
	d1, err := f.New(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	attempt(t, d1, task, desktop.DoneAction)
	d1.Close()
	_, err = f.New(ctx, 0)
	if !errors.Is(err, fake.ErrInjected) || !desktop.IsFailure(ctx, err) {
		t.Errorf("third New: %v, want an injected desktop failure", err)
	}
	if _, err := f.New(ctx, -1); err == nil {
		t.Error("New(slot -1) succeeded")
	}

	if got := len(f.Desktops()); got != 2 {
		t.Errorf("%d desktops remembered, want 2 (failed creations are not)", got)
	}
	want := fake.Stats{Resets: 2, WaitAfterResets: 1, Observes: 1, Acts: 1, WaitBeforeEvals: 1, Evaluates: 1, Closes: 2}
	if diff := cmp.Diff(want, f.Stats()); diff != "" {
		t.Errorf("fleet Stats (-want +got):\n%s", diff)
	}
}

func TestFleetInvalidConfig(t *testing.T) {
	newDesktop := fake.Factory(fake.Config{Width: 5})
	if _, err := newDesktop(t.Context(), 0); err == nil {
		t.Error("factory of an invalid config made a desktop")
	}
}

func TestFleetCapabilities(t *testing.T) {
	d, err := fake.Factory(fake.Config{ReadyWaiter: true})(t.Context(), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if _, ok := d.(desktop.ReadyWaiter); !ok {
		t.Error("desktop of a ReadyWaiter config does not implement desktop.ReadyWaiter")
	}
}

func TestFleetCreateLatency(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := fake.NewFleet(fake.Config{Latency: fake.Latencies{Create: fake.Latency{Fixed: 30 * time.Second}}})
		start := time.Now()
		d, err := f.New(t.Context(), 0)
		if err != nil {
			t.Fatal(err)
		}
		d.Close()
		if took := time.Since(start); took != 30*time.Second {
			t.Errorf("New took %v, want 30s", took)
		}
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		if _, err := f.New(ctx, 1); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("New with a 1s deadline: %v, want DeadlineExceeded", err)
		}
	})
}
