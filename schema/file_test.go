package schema

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

func TestCheckOutput(t *testing.T) {
	base := t.TempDir()
	run := filepath.Join(base, "run")
	mustCreate(t, run).Close()
	if err := os.WriteFile(filepath.Join(run, BatchFile), []byte("{}\n"), 0o666); err != nil {
		t.Fatal(err)
	}
	// A second name for the run directory.
	link := filepath.Join(base, "latest")
	if err := os.Symlink("run", link); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		path    string
		wantErr string // "" for none; ErrRunFile for an own file
	}{
		{"records", filepath.Join(run, RecordsFile), RecordsFile},
		{"manifest", filepath.Join(run, BatchFile), BatchFile},
		{"summary not written yet", filepath.Join(run, SummaryFile), SummaryFile},
		{"a message", filepath.Join(run, MessagesDir, strings.Repeat("ab", 32)), MessagesDir},
		{"the images directory", filepath.Join(run, ImagesDir), ImagesDir},
		{"a chunk of prompt token ids", filepath.Join(run, TokensDir, strings.Repeat("cd", 32)), TokensDir},
		{"in a new directory under images", filepath.Join(run, ImagesDir, "x", "y.png"), ImagesDir},
		{"through a symlinked run directory", filepath.Join(link, BatchFile), BatchFile},
		{"with dot-dot", run + "/sub/../" + RecordsFile, RecordsFile},
		{"relative", relTo(t, filepath.Join(run, SummaryFile)), SummaryFile},
		{"the run directory", run, "run directory itself"},
		{"a new file in the run", filepath.Join(run, "profile.html"), ""},
		{"a new file in a new directory of the run", filepath.Join(run, "reports", "p.html"), ""},
		{"a name that starts like an own file", filepath.Join(run, "rollouts.jsonl.bak"), ""},
		{"outside", filepath.Join(base, "train.jsonl"), ""},
		{"a sibling named like the run", filepath.Join(base, "run2", RecordsFile), ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := CheckOutput(run, tt.path)
			switch {
			case tt.wantErr == "" && err != nil:
				t.Errorf("CheckOutput(%q) = %v, want nil", tt.path, err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Errorf("CheckOutput(%q) = %v, want an error naming %q", tt.path, err, tt.wantErr)
			case tt.wantErr != "" && tt.wantErr != "run directory itself" && !errors.Is(err, ErrRunFile):
				t.Errorf("CheckOutput(%q) = %v, want it to wrap ErrRunFile", tt.path, err)
			}
		})
	}
}

// relTo returns path relative to the working directory.
func relTo(t *testing.T, path string) string {
	t.Helper()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	rel, err := filepath.Rel(wd, path)
	if err != nil {
		t.Fatal(err)
	}
	return rel
}

func TestRunWriteFile(t *testing.T) {
	dir := t.TempDir()
	r := mustCreate(t, dir)
	if err := r.WriteFile(BatchFile, []byte("one\n")); err != nil {
		t.Fatal(err)
	}
	if err := r.WriteFile(BatchFile, []byte("two\n")); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, BatchFile)); err != nil || string(b) != "two\n" {
		t.Errorf("batch.json = %q, %v; want %q", b, err, "two\n")
	}
	for _, name := range []string{"", RecordsFile, SummaryFile, MessagesDir, ImagesDir, TokensDir, "sub/x.json", "../x.json", tempPrefix + "x"} {
		if err := r.WriteFile(name, []byte("x")); err == nil {
			t.Errorf("WriteFile(%q) = nil, want an error", name)
		}
	}
	if got := names(t, dir); len(got) != 5 {
		t.Errorf("run directory holds %q, want rollouts.jsonl, messages, images, tokens and batch.json", got)
	}
	r.Close()
	if err := r.WriteFile(BatchFile, nil); !errors.Is(err, ErrClosed) {
		t.Errorf("WriteFile after Close = %v, want ErrClosed", err)
	}
}

// TestWriteFileAtomicFailure checks that a failed write leaves neither the
// file nor its temp file, and returns write's error as it is.
func TestWriteFileAtomicFailure(t *testing.T) {
	dir := t.TempDir()
	errWrite := errors.New("disk on fire")
	_, err := WriteFileAtomic(filepath.Join(dir, "out.jsonl"), func(w io.Writer) error {
		io.WriteString(w, "half")
		return errWrite
	})
	if err != errWrite {
		t.Errorf("WriteFileAtomic = %v, want write's error unchanged", err)
	}
	if got := names(t, dir); len(got) != 0 {
		t.Errorf("a failed write left %q", got)
	}
	if _, err := WriteFileAtomic(filepath.Join(dir, "missing", "out.jsonl"), func(io.Writer) error { return nil }); err == nil || !strings.Contains(err.Error(), "out.jsonl") {
		t.Errorf("WriteFileAtomic into a missing directory = %v, want an error naming the file", err)
	}
	n, err := WriteFileAtomic(filepath.Join(dir, "out.jsonl"), func(w io.Writer) error {
		_, err := io.WriteString(w, "12345")
		return err
	})
	if err != nil || n != 5 {
		t.Errorf("WriteFileAtomic = %d, %v; want 5 bytes", n, err)
	}
}

// TestWriteFileAtomicSameOutputTogether has writers write one output at
// once, as desktops keeping the same end state do: each write must land,
// though each sweeps the temp files of the output that no live writer
// holds. (A writer that let go of its temp file before renaming it lost it
// to the other's sweep.)
func TestWriteFileAtomicSameOutputTogether(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.json")
	const writers, writes = 4, 300
	errs := make(chan error, writers*writes)
	var wg sync.WaitGroup
	for range writers {
		wg.Go(func() {
			for range writes {
				if _, err := WriteFileAtomic(path, writeBytes([]byte("same"))); err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("a write of an output another writer also writes failed: %v", err)
	}
	if got := names(t, filepath.Dir(path)); len(got) != 1 {
		t.Errorf("left %q, want only the output", got)
	}
}
