package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	rl "legato/rl"
	"legato/rl/export/view"
	"legato/rl/internal/httpapi"
)

// A service always requires a bearer token of its callers, on loopback
// too: another user of the machine reaches a loopback port as well, and
// a service hands out the model key to whoever moves its policy. The token
// is httpapi.TokenEnv's (like the model key, never a flag), or one the
// service makes at start and keeps in httpapi.TokenFile in the run
// directory, readable by its owner only.

// runServe is `legato rl serve`.
func runServe(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	stderr = &lockedWriter{w: stderr}
	fs, f := newCollectFlags(stderr)
	fs.Init("legato rl serve", 0)
	addr := fs.String("addr", "127.0.0.1:8300", "address to serve on; beyond loopback it needs --tls-cert, --tls-key and "+httpapi.TokenEnv)
	certFile := fs.String("tls-cert", "", "TLS certificate file (PEM)")
	keyFile := fs.String("tls-key", "", "TLS key file (PEM)")
	var maxStale int
	var stale string
	intVar(fs, &maxStale, "max-staleness", 0, 0, 1<<20, "steps more than K policy versions behind are stale (0: none are); see --stale")
	metricsOpen := fs.Bool("metrics-open", false, "answer GET /metrics without the bearer token (a Prometheus scraper); every other route always needs it")
	choiceVar(fs, &stale, "stale", "drop", []string{"drop", "rerun"}, "with --max-staleness: drop stale steps from a group's result, or rerun an attempt that finished with stale steps (at most twice; then its stale steps are dropped)")
	setUsage(fs, `Usage: legato rl serve --out DIR [--addr HOST:PORT] [flags]

Serves rollouts to a trainer over HTTP while it trains: the trainer submits
groups (POST /v1/groups), reads them as they end (GET /v1/stream, resumable
by cursor), pauses the policy while it swaps weights and serves the new
version (POST /v1/policy). The desktops, the model server and every flag are
collect's; --tasks, when given, are the tasks a group may name by id (the
fake backend knows its demo tasks). DIR is the run directory, in the
legato.rollout/v0 format: serving into it again continues it, stream and
all. The model server's key is read from LEGATO_POLICY_KEY.
--advantage-std sample divides the results' advantages by the sample std
(slime's, SkyRL's) instead of the population std; each ended group's
advantage_std says which, and the journal keeps it for every restart.

The run's pages, as legato rl view serves them, are under /view/ (the third
line of output links them). Every route (but /metrics with --metrics-open)
needs the bearer token
(Authorization: Bearer TOKEN): $`+httpapi.TokenEnv+` when set, else one made at
start, printed on the second line of output and written to DIR/`+httpapi.TokenFile+`
(readable by its owner only; replaced by each start). POST /v1/policy
refuses (409) a version that does not come after the current one: one that
was in force before, or, for two versions that end in a number after the
same text ("step-41", "step-42"), a smaller number; "force": true goes
back on purpose and is journaled so.

`)
	if err := f.parse(fs, args); err != nil {
		return err
	}
	token := os.Getenv(httpapi.TokenEnv)
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
	made := token == ""
	if token, err = serveToken(f.out, token); err != nil {
		_, _ = svc.Close(context.WithoutCancel(ctx))
		return err
	}
	// The run's pages (legato rl view) under /view/, behind the same
	// token: a live run, indexed again as records come.
	pages, err := view.Open(f.out)
	if err != nil {
		_, _ = svc.Close(context.WithoutCancel(ctx))
		return err
	}
	defer pages.Close()
	mux := http.NewServeMux()
	mux.Handle("/view/", http.StripPrefix("/view", view.Handler(pages, token)))
	mux.Handle("/", httpapi.New(svc, httpapi.Options{Token: token, MetricsOpen: *metricsOpen, Logger: log}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
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
	// Once, as Jupyter does: the token is what a caller needs.
	if made {
		fmt.Fprintf(stdout, "callers send Authorization: Bearer %s (also in %s, readable by you only; Client(url, run_dir=%q) of examples/python reads it)\n",
			token, filepath.Join(f.out, httpapi.TokenFile), f.out)
	} else {
		fmt.Fprintf(stdout, "callers send Authorization: Bearer $%s\n", httpapi.TokenEnv)
	}
	if made {
		fmt.Fprintf(stdout, "the run's pages: %s\n", view.URL(scheme+"://"+ln.Addr().String()+"/view", token))
	} else {
		fmt.Fprintf(stdout, "the run's pages: %s://%s/view/?token=$%s\n", scheme, ln.Addr(), httpapi.TokenEnv)
	}
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
	// Every desktop closes before the command returns, however it was
	// stopped: nothing outlives it.
	sum, cerr := svc.Close(context.WithoutCancel(ctx))
	// Streams and long polls end when the service stops; give them a
	// moment to write their last line.
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx)
	if sum != nil {
		fmt.Fprintf(stdout, "%s: stopped; %d records, %d groups ended\n", f.out, sum.Records, len(svc.Ended(0, 0)))
	}
	return errors.Join(runErr, cerr)
}

// newToken makes a bearer token: 32 random bytes, in hex.
func newToken() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("make a bearer token: %w", err)
	}
	return hex.EncodeToString(b), nil
}

// serveToken returns the bearer token of a service in dir: token (from
// $LEGATO_SERVE_TOKEN) when set, else a new random one, written to
// dir/serve.token readable by its owner only. The file is written under a
// temporary name made with O_EXCL and mode 0600, then renamed over the
// last start's: it is never readable by others, even for a moment, and
// never holds a token this start does not take (with token set, a file
// left by an earlier start is removed).
func serveToken(dir, token string) (string, error) {
	path := filepath.Join(dir, httpapi.TokenFile)
	if token != "" {
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return "", fmt.Errorf("remove the token an earlier start left: %w", err)
		}
		return token, nil
	}
	token, err := newToken()
	if err != nil {
		return "", err
	}
	// O_EXCL, 0600; named as the store's temporary files (schema's
	// tempPrefix), which the next start removes if this one is killed.
	tmp, err := os.CreateTemp(dir, ".tmp-"+httpapi.TokenFile+"-*")
	if err != nil {
		return "", fmt.Errorf("write the bearer token: %w", err)
	}
	_, err = tmp.WriteString(token + "\n")
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		os.Remove(tmp.Name())
		return "", fmt.Errorf("write the bearer token to %s: %w", path, err)
	}
	return token, nil
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
		return usageErrorf("--addr %s is beyond loopback: give --tls-cert and --tls-key, and set %s to the bearer token callers must send", addr, httpapi.TokenEnv)
	}
	return nil
}
