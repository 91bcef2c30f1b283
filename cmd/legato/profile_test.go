package main

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"legato/rl/export/profile"
	"legato/rl/schema"
)

func TestProfileCommand(t *testing.T) {
	html := filepath.Join(t.TempDir(), "profile.html")
	var stdout, stderr bytes.Buffer
	if err := new(profileCommand).Run(t.Context(), []string{fixedRun, "--html", html}, &stdout, &stderr); err != nil {
		t.Fatalf("profile: %v\nstderr: %s", err, stderr.String())
	}
	rep, err := profile.Build(fixedRun)
	if err != nil {
		t.Fatal(err)
	}
	var report bytes.Buffer
	if err := profile.WriteText(&report, rep); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(report.String()+"wrote "+html+"\n", stdout.String()); diff != "" {
		t.Errorf("stdout (-want +got):\n%s", diff)
	}
	if fi, err := os.Stat(html); err != nil || fi.Size() == 0 {
		t.Errorf("HTML file: %v", err)
	}
}

func TestProfileCommandErrors(t *testing.T) {
	for _, tt := range []struct {
		args    []string
		wantMsg string
	}{
		{nil, "missing run directory"},
		{[]string{fixedRun, "extra"}, "want one run directory"},
		{[]string{"--svg", "x", fixedRun}, "flag provided but not defined: -svg"},
	} {
		err := new(profileCommand).Run(t.Context(), tt.args, &bytes.Buffer{}, &bytes.Buffer{})
		var usage *usageError
		if !errors.As(err, &usage) || !strings.Contains(err.Error(), tt.wantMsg) {
			t.Errorf("profile %q = %v, want a usage error saying %q", tt.args, err, tt.wantMsg)
		}
	}
	// A run directory that does not exist is a failure, not a usage error.
	err := new(profileCommand).Run(t.Context(), []string{filepath.Join(t.TempDir(), "none")}, &bytes.Buffer{}, &bytes.Buffer{})
	var usage *usageError
	if err == nil || errors.As(err, &usage) || !strings.Contains(err.Error(), "rollouts.jsonl") {
		t.Errorf("profile of a missing dir = %v, want a failure naming rollouts.jsonl", err)
	}
}

// TestProfileRefusesRunFiles: --html never replaces one of the run's own
// files (a usage error, exit status 2), while a new page inside the run
// directory is written.
func TestProfileRefusesRunFiles(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "run")
	if err := os.CopyFS(dir, os.DirFS(fixedRun)); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{schema.BatchFile, schema.RecordsFile, schema.SummaryFile,
		filepath.Join(schema.MessagesDir, "x.html"), schema.ImagesDir} {
		path := filepath.Join(dir, name)
		before, _ := os.ReadFile(path)
		var stdout bytes.Buffer
		err := new(profileCommand).Run(t.Context(), []string{dir, "--html", path}, &stdout, &bytes.Buffer{})
		var usage *usageError
		if !errors.As(err, &usage) || !strings.Contains(err.Error(), "is one of the run's own files") {
			t.Errorf("profile --html %s = %v, want a usage error", name, err)
		}
		if after, _ := os.ReadFile(path); !bytes.Equal(before, after) {
			t.Errorf("a refused profile changed %s", name)
		}
		if stdout.Len() > 0 {
			t.Errorf("profile --html %s printed %q, want nothing", name, stdout.String())
		}
	}
	page := filepath.Join(dir, "profile.html")
	if err := new(profileCommand).Run(t.Context(), []string{dir, "--html", page}, &bytes.Buffer{}, &bytes.Buffer{}); err != nil {
		t.Errorf("profile --html into a new file of the run: %v", err)
	}
	if _, err := os.Stat(page); err != nil {
		t.Error(err)
	}
}
