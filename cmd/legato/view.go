package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"legato/rl/export/view"
	"legato/rl/internal/httpapi"
)

// viewCommand is `legato rl view`: a run's pages, served on loopback or
// written as static files.
type viewCommand struct {
	addr, out, cert, key string
}

func (c *viewCommand) flagSet(stderr io.Writer) *flag.FlagSet {
	fs := newFlagSet("legato rl view", stderr)
	fs.StringVar(&c.addr, "addr", "127.0.0.1:8301", "address to serve on; beyond loopback it needs --tls-cert, --tls-key and "+httpapi.TokenEnv)
	fs.StringVar(&c.out, "out", "", "write the pages as static files into `DIR` (new or empty) instead of serving them")
	fs.StringVar(&c.cert, "tls-cert", "", "TLS certificate file (PEM)")
	fs.StringVar(&c.key, "tls-key", "", "TLS key file (PEM)")
	setUsage(fs, `Usage: legato rl view RUN [--addr HOST:PORT] | legato rl view RUN --out DIR

Shows the run directory RUN as web pages: the run (summary, status and reward
histograms, per-task success, attempts filtered by task, domain, status,
reward, policy version, quarantine), a group's attempts side by side, and an
attempt step by step: the screenshot the model saw with its actions drawn on
it, its reasoning and reply, tokens, logprobs, timings, the reset, the grade,
replay and regrade results. Keys: ←/→ steps, j/k attempts; #step-N links a
step. Nothing is loaded from the network; RUN is only read.

Served, every request needs a token: $`+httpapi.TokenEnv+` when set, else one made
at start and printed in the link to open (it sets a cookie). With --out the
same pages are written as files that open from file://, images hard-linked
(or copied) from the run's store.

`)
	return fs
}

// Run parses args and serves the pages until ctx ends or SIGTERM, or, with
// --out, writes them.
func (c *viewCommand) Run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := c.flagSet(stderr)
	dir, err := parseRunDir(fs, args)
	if err != nil {
		return err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if c.out != "" && (set["addr"] || set["tls-cert"] || set["tls-key"]) {
		return usageErrorf("--out writes files and --addr, --tls-cert, --tls-key serve: give one or the other")
	}
	token := os.Getenv(httpapi.TokenEnv)
	if c.out == "" {
		if err := checkServeAddr(c.addr, c.cert, c.key, token); err != nil {
			return err
		}
	}
	run, err := view.Open(dir)
	if errors.Is(err, view.ErrNotRun) {
		return usage(err)
	}
	if err != nil {
		return err
	}
	defer run.Close()
	if c.out != "" {
		st, err := view.WriteStatic(run, c.out)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "wrote %d pages and %d images to %s; open %s/index.html\n", st.Pages, st.Images, c.out, c.out)
		if st.Missing > 0 {
			fmt.Fprintf(stderr, "warning: %d images the pages show are missing from %s's store\n", st.Missing, dir)
		}
		return nil
	}
	if token == "" {
		if token, err = newToken(); err != nil {
			return err
		}
	}
	ln, err := net.Listen("tcp", c.addr)
	if err != nil {
		return usageErrorf("--addr %s: %v", c.addr, err)
	}
	defer ln.Close()
	return serveView(ctx, ln, view.Handler(run, token), token, c.cert, c.key, stdout)
}

// serveView serves h on ln until ctx ends, SIGTERM or a serving error,
// after printing the link to open.
func serveView(ctx context.Context, ln net.Listener, h http.Handler, token, cert, key string, stdout io.Writer) error {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() {
		if cert != "" {
			served <- srv.ServeTLS(ln, cert, key)
		} else {
			served <- srv.Serve(ln)
		}
	}()
	scheme := "http"
	if cert != "" {
		scheme = "https"
	}
	fmt.Fprintf(stdout, "open %s\n", view.URL(scheme+"://"+ln.Addr().String(), token))
	if f, ok := stdout.(*os.File); ok {
		_ = f.Sync()
	}
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM)
	defer signal.Stop(term)
	var err error
	select {
	case <-ctx.Done():
	case <-term:
	case err = <-served:
		err = fmt.Errorf("http: %w", err)
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if serr := srv.Shutdown(sctx); err == nil && serr != nil {
		err = serr
	}
	if err == nil {
		<-served // http.ErrServerClosed: Serve has returned
	}
	return err
}
