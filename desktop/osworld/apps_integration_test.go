//go:build integration

package osworld

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"image"
	"image/png"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	rl "legato/rl"
	"legato/rl/desktop"
	"legato/rl/desktop/osworld/grade"
	"legato/rl/desktop/osworld/vm"
	"legato/rl/policy/policytest"
	"legato/rl/schema"
)

var itAppsImage = flag.String("osworld.apps-image", envOr("LEGATO_APPS_IMAGE", "/var/tmp/legato-apps-guest"),
	"directory of the real-apps guest image, built there by testdata/apps-image/build.sh if needed")

var (
	appsImageOnce sync.Once
	appsImageErr  error
)

// appsConfig is a desktop configuration for the real-apps guest, booted as
// users boot OSWorld's image: from the disk, through its bootloader.
func appsConfig(t *testing.T, prefix string) Config {
	t.Helper()
	appsImageOnce.Do(func() {
		out, err := exec.Command("bash", filepath.Join("testdata", "apps-image", "build.sh"), *itAppsImage).CombinedOutput()
		if err != nil {
			appsImageErr = fmt.Errorf("build the real-apps guest image (run .ci/libvirt-up.sh first, as root): %v\n%s", err, out)
			return
		}
		t.Logf("real-apps guest image: %s", lastLine(string(out)))
	})
	if appsImageErr != nil {
		t.Fatal(appsImageErr)
	}
	return Config{
		VM: vm.Config{
			NamePrefix: prefix,
			BaseImage:  filepath.Join(*itAppsImage, "base.qcow2"),
			VCPUs:      2,
		},
		BootTimeout: 5 * time.Minute,
		CacheDir:    t.TempDir(),
		Grade:       GradeConfig{Mode: grade.NativeOnly},
		Logger:      slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo})),
	}
}

// appsSolutions plays a known solution of each task of
// testdata/apps-tasks/smoke.json: keyboard shortcuts, which do not depend
// on where a window happens to draw a button.
func appsSolutions(req policytest.Request) string {
	key := func(keys ...string) string {
		b, _ := json.Marshal(map[string]any{"action": "key", "keys": keys})
		return string(b)
	}
	typ := func(text string) string {
		b, _ := json.Marshal(map[string]any{"action": "type", "text": text})
		return string(b)
	}
	var plan []string
	switch in := req.Instruction; {
	case strings.Contains(in, "GIMP is open"):
		plan = []string{key("ctrl", "q")}
	case strings.Contains(in, "Writer document"):
		plan = []string{typ("Hello legato"), key("ctrl", "s")}
	case strings.Contains(in, "titled Two"):
		plan = []string{key("ctrl", "1"), key("ctrl", "w")}
	}
	return planCall(req.Step, plan)
}

// appsNoop ends every attempt at once: each task must then score 0.
func appsNoop(req policytest.Request) string { return planCall(req.Step, nil) }

// firstScreens is a VM desktop that keeps, per task, the first screenshot
// after each reset, and the reset's kind.
type firstScreens struct {
	*VMDesktop
	mu      *sync.Mutex
	pending *string
	shots   map[string][]firstScreen
}

type firstScreen struct {
	reset ResetKind
	png   []byte
}

func (s firstScreen) String() string {
	h := sha256.Sum256(s.png)
	return string(s.reset) + ":" + hex.EncodeToString(h[:8])
}

func (f firstScreens) Reset(ctx context.Context, task desktop.Task) error {
	err := f.VMDesktop.Reset(ctx, task)
	f.mu.Lock()
	*f.pending = task.ID
	f.mu.Unlock()
	return err
}

func (f firstScreens) Observe(ctx context.Context) (desktop.Observation, error) {
	obs, err := f.VMDesktop.Observe(ctx)
	f.mu.Lock()
	defer f.mu.Unlock()
	if id := *f.pending; id != "" && err == nil {
		f.shots[id] = append(f.shots[id], firstScreen{f.LastReset().Kind, obs.Screenshot})
		*f.pending = ""
	}
	return obs, err
}

// Evaluate logs the guest's windows and programs first, for a grade that
// goes wrong.
func (f firstScreens) Evaluate(ctx context.Context, task desktop.Task) (float64, error) {
	if res, err := f.sh.run(ctx, `wmctrl -l; pgrep -a -x 'gimp|gimp-2.10|soffice.bin|chromium'`); err == nil {
		f.log.Info("before grading", "task", task.ID, "guest", res.Output)
	}
	return f.VMDesktop.Evaluate(ctx, task)
}

// TestIntegrationApps runs the real programs of the real-apps guest
// (GRUB-booted, systemd, Xvfb): GIMP, LibreOffice Writer, Chromium driven
// over DevTools. A group of two attempts per task starts from one golden
// state with the same first screen; the known solutions score 1 and
// attempts that do nothing score 0, graded by the tasks' evaluators.
func TestIntegrationApps(t *testing.T) {
	if os.Getenv(crashChildEnv) != "" {
		t.Skip("crash child")
	}
	cfg := appsConfig(t, "legato-itapps-")
	ctx := t.Context()
	p, tasks := itPool(t, cfg, filepath.Join("testdata", "apps-tasks", "smoke.json"))
	for _, run := range []struct {
		name   string
		script func(policytest.Request) string
		reward float64
	}{
		{"solutions", appsSolutions, 1},
		{"no-op", appsNoop, 0},
	} {
		srv := policytest.NewServer(policytest.Options{NoLatency: true, Script: run.script})
		var mu sync.Mutex
		var pending string
		shots := map[string][]firstScreen{}
		factory := func(ctx context.Context, slot int) (desktop.Desktop, error) {
			d, err := p.New(ctx, slot)
			if err != nil {
				return nil, err
			}
			return firstScreens{VMDesktop: d.(*VMDesktop), mu: &mu, pending: &pending, shots: shots}, nil
		}
		start := time.Now()
		sum, err := rl.Collect(ctx, tasks, rl.PolicyConfig{BaseURL: srv.URL(), Model: "scripted", Version: "it-apps"}, rl.CollectOptions{
			Out:        t.TempDir(),
			NewDesktop: factory,
			Desktops:   1,
			Group:      2,
			MaxSteps:   4,
			EnvRetries: -1, // a desktop failure must show, not be retried away
			Logger:     cfg.Logger,
			OnGroup: func(g rl.Group) {
				if !g.Closed || len(g.Finished) != 2 {
					t.Errorf("%s: task %s: group closed %v with %d finished attempts; want 2", run.name, g.TaskID, g.Closed, len(g.Finished))
				}
				for _, r := range g.Finished {
					if r.Status != schema.StatusOK || r.Reward == nil || *r.Reward != run.reward {
						reward := "none"
						if r.Reward != nil {
							reward = fmt.Sprint(*r.Reward)
						}
						t.Errorf("%s: task %s attempt %d: status %s, reward %s; want ok, %v", run.name, r.TaskID, r.Attempt, r.Status, reward, run.reward)
					}
				}
			},
		})
		srv.Close()
		if err != nil {
			t.Fatalf("%s: Collect: %v", run.name, err)
		}
		t.Logf("%s: %d tasks × 2 in %v; counts %+v", run.name, len(tasks), time.Since(start).Round(time.Second), sum.Counts)
		for _, tk := range tasks {
			got := shots[tk.ID]
			t.Logf("%s: task %s: first screens %v", run.name, tk.ID, got)
			if len(got) != 2 {
				t.Errorf("%s: task %s: %d first screenshots; want 2", run.name, tk.ID, len(got))
				continue
			}
			if got[0].reset != ResetGoldenBuild || got[1].reset != ResetGolden {
				t.Errorf("%s: task %s: resets %s, %s; want %s then %s", run.name, tk.ID, got[0].reset, got[1].reset, ResetGoldenBuild, ResetGolden)
			}
			if !bytes.Equal(got[0].png, got[1].png) {
				t.Errorf("%s: task %s: the two attempts' first screenshots differ: %v, pixels in %s", run.name, tk.ID, got, diffBox(got[0].png, got[1].png))
			}
		}
	}
}

// diffBox says where two screenshots differ: the bounding box of the
// pixels that do, so that a failure names what changed (a caret, a clock).
func diffBox(a, b []byte) string {
	ia, err := png.Decode(bytes.NewReader(a))
	if err != nil {
		return err.Error()
	}
	ib, err := png.Decode(bytes.NewReader(b))
	if err != nil {
		return err.Error()
	}
	if ia.Bounds() != ib.Bounds() {
		return fmt.Sprintf("sizes %v and %v", ia.Bounds(), ib.Bounds())
	}
	var box image.Rectangle
	n := 0
	r := ia.Bounds()
	for y := r.Min.Y; y < r.Max.Y; y++ {
		for x := r.Min.X; x < r.Max.X; x++ {
			if ia.At(x, y) != ib.At(x, y) {
				box = box.Union(image.Rect(x, y, x+1, y+1))
				n++
			}
		}
	}
	return fmt.Sprintf("%v (%d pixels)", box, n)
}
