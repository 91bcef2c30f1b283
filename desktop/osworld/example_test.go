package osworld_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"

	rl "legato/rl"
	"legato/rl/desktop/osworld"
)

// A batch on OSWorld guests that already run (here two Docker containers
// publishing their guest servers and DevTools ports on loopback).
func ExampleNewPool() {
	ctx := context.Background()
	pool, err := osworld.NewPool(ctx, osworld.Config{
		Guests: []osworld.GuestAddr{
			{URL: "http://127.0.0.1:5000", DevToolsPort: 9222},
			{URL: "http://127.0.0.1:5001", DevToolsPort: 9223},
		},
		Grade:  osworld.GradeConfig{OSWorldDir: "/home/me/OSWorld"},
		Logger: slog.New(slog.NewTextHandler(os.Stderr, nil)),
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pool.Close()
	tasks, err := rl.LoadTasks("/home/me/OSWorld/evaluation_examples/test_small.json", rl.LoadOptions{})
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := pool.CheckTasks(tasks); err != nil {
		fmt.Println(err) // refuse these tasks, or stop
		return
	}
	_, err = rl.Collect(ctx, tasks, rl.PolicyConfig{BaseURL: "http://127.0.0.1:8000/v1", Model: "Qwen/Qwen3-VL-8B", Version: "step-1"},
		rl.CollectOptions{Out: "runs/step-1", NewDesktop: pool.New, Desktops: pool.Config().Slots()})
	fmt.Println(err)
}
