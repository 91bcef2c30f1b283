package profile_test

import (
	"bytes"
	"strings"
	"testing"

	"legato/rl/export"
	"legato/rl/export/profile"
	"legato/rl/schema"
)

// TestHostsSection: a batch spread over hosts gets a row per host, in the
// text and the HTML report, with its desktops, tries, finished tries,
// failures and the mean seconds per try of each phase any host spent time
// in; a batch on one machine (no host in its records) gets none.
func TestHostsSection(t *testing.T) {
	sum := &schema.Summary{Final: true, Hosts: map[string]schema.HostSummary{
		"lgh2": {Desktops: 1, Attempts: 2, Finished: 1, Failures: 1, PhaseS: map[string]float64{export.PhaseReset: 9, export.PhaseModel: 3}},
		"lgh1": {Desktops: 2, Attempts: 4, Finished: 4, PhaseS: map[string]float64{export.PhaseReset: 8, export.PhaseModel: 2}},
	}}
	rep := &profile.Report{Dir: "run", Summary: sum}
	var text bytes.Buffer
	if err := profile.WriteText(&text, rep); err != nil {
		t.Fatal(err)
	}
	var got []string
	in := false
	for _, line := range strings.Split(text.String(), "\n") {
		switch {
		case strings.HasPrefix(line, "Hosts"):
			in = true
		case in && line == "":
			in = false
		case in:
			got = append(got, strings.Join(strings.Fields(line), " "))
		}
	}
	want := []string{
		"host desktops tries finished failures reset model call",
		"lgh1 2 4 4 0 2.00s 500ms",
		"lgh2 1 2 1 1 4.50s 1.50s",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("hosts section:\n%s\nwant:\n%s\nreport:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"), text.String())
	}
	var html bytes.Buffer
	if err := profile.WriteHTML(&html, rep); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{`id="hosts"`, "<td>lgh1</td><td>2</td><td>4</td><td>4</td><td>0</td><td>2.00s</td><td>500ms</td>", "<td>lgh2</td>"} {
		if !strings.Contains(html.String(), s) {
			t.Errorf("HTML report lacks %q", s)
		}
	}

	rep.Summary = &schema.Summary{Final: true}
	text.Reset()
	html.Reset()
	if err := profile.WriteText(&text, rep); err != nil {
		t.Fatal(err)
	}
	if err := profile.WriteHTML(&html, rep); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(text.String(), "Hosts") || strings.Contains(html.String(), `id="hosts"`) {
		t.Error("a batch without hosts got a hosts section")
	}
}
