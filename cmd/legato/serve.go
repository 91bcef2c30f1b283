package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	rl "legato/rl"
)

// serveTokenEnv holds the bearer token a service bound beyond loopback
// requires of its callers; like the model key, never a flag.
const serveTokenEnv = "LEGATO_SERVE_TOKEN"

// runServe is `legato rl serve`.
func runServe(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	stderr = &lockedWriter{w: stderr}
	fs, f := newCollectFlags(stderr)
	fs.Init("legato rl serve", 0)
	addr := fs.String("addr", "127.0.0.1:8300", "address to serve on; beyond loopback it needs --tls-cert, --tls-key and "+serveTokenEnv)
	certFile := fs.String("tls-cert", "", "TLS certificate file (PEM)")
	keyFile := fs.String("tls-key", "", "TLS key file (PEM)")
	var maxStale int
	var stale string
	intVar(fs, &maxStale, "max-staleness", 0, 0, 1<<20, "steps more than K policy versions behind are stale (0: none are); see --stale")
	choiceVar(fs, &stale, "stale", "drop", []string{"drop", "rerun"}, "with --max-staleness: drop stale steps from a group's result, or rerun an attempt that finished with stale steps (at most twice; then its stale steps are dropped)")
	setUsage(fs, `Usage: legato rl serve --out DIR [--addr HOST:PORT] [flags]

Serves rollouts to a trainer over HTTP while it trains: the trainer submits
groups (POST /v1/groups), reads them as they end (GET /v1/stream, resumable
by cursor), pauses the policy while it swaps weights and serves the new
version (POST /v1/policy). The desktops, the model server and every flag are
collect's; --tasks, when given, are the tasks a group may name by id (the
fake backend knows its demo tasks). DIR is the run directory, in the
legato.rollout/v0 format: serving into it again continues it, stream and
all. The model server's key is read from LEGATO_POLICY_KEY; the bearer token
callers must send, when one is set, from `+serveTokenEnv+`.

`)
	if err := f.parse(fs, args); err != nil {
		return err
	}
	token := os.Getenv(serveTokenEnv)
	if err := checkServeAddr(*addr, *certFile, *keyFile, token); err != nil {
		return err
	}
	log := f.logger(stderr)
	cleanup, tasks, err := f.setup(ctx, log, stderr, f.backend == "fake")
	defer cleanup()
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return usageErrorf("--addr %s: %v", *addr, err)
	}
	defer ln.Close()

	svc, err := rl.Serve(ctx, f.pol, rl.ServeOptions{CollectOptions: f.opts, Tasks: tasks, OSWorldDir: f.ow.cfg.Grade.OSWorldDir, MaxStaleness: maxStale, StaleRerun: stale == "rerun", Contiguous: f.history == "contiguous", ContiguousHarness: f.contiguous})
	if err != nil {
		if errors.Is(err, rl.ErrInvalidOptions) {
			return usage(err)
		}
		return err
	}
	srv := &http.Server{Handler: newServeHandler(svc, token, log), ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() {
		if *certFile != "" {
			served <- srv.ServeTLS(ln, *certFile, *keyFile)
		} else {
			served <- srv.Serve(ln)
		}
	}()
	scheme := "http"
	if *certFile != "" {
		scheme = "https"
	}
	// The first line on stdout is the address, for a program that started
	// the service on port 0.
	fmt.Fprintf(stdout, "serving %s://%s (run directory %s, policy %s %s)\n", scheme, ln.Addr(), f.out, f.pol.Model, svc.Policy().Version)
	if f, ok := stdout.(*os.File); ok {
		_ = f.Sync()
	}

	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGTERM)
	defer signal.Stop(hup)
	var runErr error
	select {
	case <-ctx.Done():
	case <-hup:
	case <-svc.Done():
		runErr = svc.Err()
	case err := <-served:
		runErr = fmt.Errorf("http: %w", err)
	}
	// Streams and long polls end when the service stops; give them a
	// moment to write their last line.
	sum, cerr := svc.Close()
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx)
	if sum != nil {
		fmt.Fprintf(stdout, "%s: stopped; %d records, %d groups ended\n", f.out, sum.Records, len(svc.Ended(0, 0)))
	}
	return errors.Join(runErr, cerr)
}

// checkServeAddr refuses to serve beyond loopback without TLS and a token:
// a service drives desktops and spends model calls for whoever reaches it.
func checkServeAddr(addr, cert, key, token string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return usageErrorf("--addr %q: %v; want HOST:PORT, e.g. 127.0.0.1:8300", addr, err)
	}
	if (cert == "") != (key == "") {
		return usageErrorf("--tls-cert and --tls-key go together")
	}
	if ip := net.ParseIP(host); host == "localhost" || (ip != nil && ip.IsLoopback()) {
		return nil
	}
	if cert == "" || token == "" {
		return usageErrorf("--addr %s is beyond loopback: give --tls-cert and --tls-key, and set %s to the bearer token callers must send", addr, serveTokenEnv)
	}
	return nil
}
