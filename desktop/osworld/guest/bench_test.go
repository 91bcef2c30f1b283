package guest_test

import (
	"context"
	"testing"

	"legato/rl/desktop/osworld/guest"
	"legato/rl/desktop/osworld/guest/guesttest"
)

// Benchmarks against the guest server on the host (1280×720 Xvfb). They
// measure the host's costs; a TCG guest is 5–20× slower (see KVM.md).

func BenchmarkScreenshot(b *testing.B) {
	g := guesttest.Start(b, guesttest.Options{})
	ctx := context.Background()
	for b.Loop() {
		if _, err := g.Client.Screenshot(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkRunPyautogui(b *testing.B) {
	g := guesttest.Start(b, guesttest.Options{})
	ctx := context.Background()
	for b.Loop() {
		res, err := g.Client.RunPyautogui(ctx, "pyautogui.moveTo(100, 100)")
		if err != nil || res.ReturnCode != 0 {
			b.Fatal(err, res)
		}
	}
}

func BenchmarkExecuteTrue(b *testing.B) {
	g := guesttest.Start(b, guesttest.Options{})
	ctx := context.Background()
	for b.Loop() {
		if _, err := g.Client.Execute(ctx, guest.Argv("true")); err != nil {
			b.Fatal(err)
		}
	}
}
