package hostdns

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"legato/rl/desktop/osworld/hostdns/dnstest"
	"legato/rl/desktop/osworld/vm"
)

// eventWait bounds each wait for the watcher: generous, the machine is
// shared.
const eventWait = time.Minute

// logEvents is a slog handler that passes each message on a channel.
type logEvents chan string

func (l logEvents) Enabled(context.Context, slog.Level) bool { return true }
func (l logEvents) Handle(ctx context.Context, r slog.Record) error {
	select {
	case l <- r.Message:
	default: // nobody waits for it
	}
	return nil
}
func (l logEvents) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l logEvents) WithGroup(string) slog.Handler      { return l }

func labels(specs []vm.HostSpec) []string {
	var out []string
	for _, s := range specs {
		out = append(out, s.Name)
	}
	return out
}

// A watcher sees a host join and one leave; a lookup that fails (or finds
// no record) keeps the hosts it had, with a warning, until the name
// resolves again.
func TestWatcher(t *testing.T) {
	dns := dnstest.Start(t)
	const name = "hosts.legato.test"
	dns.SetA(name, "10.0.0.1", "10.0.0.2")
	events := make(logEvents, 16)
	src := Source{Name: name, User: "root", Desktops: 2, Every: MinEvery, Resolver: dns.Resolver()}

	if _, err := Watch(t.Context(), Source{Name: "nothing.legato.test", Resolver: dns.Resolver()}, nil); !errors.Is(err, ErrNoRecords) {
		t.Fatalf("Watch of a name without records: %v; want ErrNoRecords", err)
	}
	w, err := Watch(t.Context(), src, slog.New(events))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	hosts, changed := w.Hosts()
	if diff := cmp.Diff([]string{"10.0.0.1", "10.0.0.2"}, labels(hosts)); diff != "" {
		t.Fatalf("first lookup (-want +got):\n%s", diff)
	}
	if hosts[0].Desktops != 2 || hosts[0].URI != "qemu+ssh://root@10.0.0.1:22/system" {
		t.Errorf("first host %+v", hosts[0])
	}
	next := func(what string) []string {
		t.Helper()
		select {
		case <-changed:
		case <-time.After(eventWait):
			t.Fatalf("%s: the watcher saw no change in %v", what, eventWait)
		}
		hosts, changed = w.Hosts()
		return labels(hosts)
	}

	dns.SetA(name, "10.0.0.2", "10.0.0.3")
	if diff := cmp.Diff([]string{"10.0.0.2", "10.0.0.3"}, next("10.0.0.3 joins, 10.0.0.1 leaves")); diff != "" {
		t.Errorf("after a join and a leave (-want +got):\n%s", diff)
	}

	// The server fails, then has no record: each time the hosts stay.
	for _, fail := range []func(){func() { dns.Fail(true) }, func() { dns.Fail(false); dns.SetA(name) }} {
		fail()
		waitWarning(t, events)
		if got, _ := w.Hosts(); !cmp.Equal(labels(got), []string{"10.0.0.2", "10.0.0.3"}) {
			t.Errorf("after a failed lookup: hosts %v; want the last set kept", labels(got))
		}
		select {
		case <-changed:
			t.Errorf("a failed lookup changed the hosts")
		default:
		}
		// Back to the same set: no change, and the next failure warns.
		dns.Fail(false)
		dns.SetA(name, "10.0.0.2", "10.0.0.3")
		waitMessage(t, events, "the hosts' DNS name resolves again")
	}

	dns.SetA(name, "10.0.0.3")
	if diff := cmp.Diff([]string{"10.0.0.3"}, next("10.0.0.2 leaves")); diff != "" {
		t.Errorf("after the name resolved again (-want +got):\n%s", diff)
	}
	w.Close()
	w.Close()
}

func waitWarning(t *testing.T, events logEvents) {
	t.Helper()
	waitMessage(t, events, "the hosts' DNS name does not resolve: keeping the hosts it had; tried again every 1s")
}

func waitMessage(t *testing.T, events logEvents, msg string) {
	t.Helper()
	timeout := time.After(eventWait)
	for {
		select {
		case got := <-events:
			if got == msg {
				return
			}
		case <-timeout:
			t.Fatalf("no log %q in %v", msg, eventWait)
		}
	}
}
