package vm

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"net"
	"path/filepath"
	"testing"
	"time"
)

// fakeQMP serves one QMP connection: the greeting, then answers by
// command name; "hang" is never answered.
func fakeQMP(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "qmp.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { ln.Close(); <-done })
	go func() {
		defer close(done)
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		c.Write([]byte(`{"QMP": {"version": {}, "capabilities": []}}` + "\n"))
		r := bufio.NewReader(c)
		for {
			line, err := r.ReadBytes('\n')
			if err != nil {
				return
			}
			var req struct {
				Execute string `json:"execute"`
			}
			json.Unmarshal(line, &req)
			switch req.Execute {
			case "qmp_capabilities":
				c.Write([]byte(`{"return": {}}` + "\n"))
			case "query-status":
				// An event may come before the reply.
				c.Write([]byte(`{"event": "RESUME", "timestamp": {}}` + "\n" + `{"return": {"running": true, "status": "running"}}` + "\n"))
			case "hang":
			default:
				c.Write([]byte(`{"error": {"class": "CommandNotFound", "desc": "The command ` + req.Execute + ` has not been found"}}` + "\n"))
			}
		}
	}()
	return path
}

func TestQMP(t *testing.T) {
	ctx := t.Context()
	q, err := dialQMP(ctx, fakeQMP(t))
	if err != nil {
		t.Fatal(err)
	}
	defer q.close()
	var st struct {
		Running bool `json:"running"`
	}
	if err := q.run(ctx, "query-status", nil, &st); err != nil || !st.Running {
		t.Fatalf("query-status: %+v, %v", st, err)
	}
	var qe *qmpError
	if err := q.run(ctx, "nonsense", nil, nil); !errors.As(err, &qe) || qe.Class != "CommandNotFound" || qe.Command != "nonsense" {
		t.Fatalf("unknown command: %v", err)
	}
	// A QEMU that does not answer holds the caller only until its ctx ends.
	hctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if err := q.run(hctx, "hang", nil, nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("hanging command: %v, want the deadline", err)
	}
	// The connection it cut off is closed: nothing reads a late reply
	// as the next command's.
	if err := q.run(ctx, "query-status", nil, &st); err == nil {
		t.Fatal("a command on the connection a timeout closed worked")
	}
}
