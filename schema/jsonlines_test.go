package schema

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A torn last line (no newline, or not decoding) is what a crash
// mid-append leaves: it is not counted, and opening for an append cuts it.
// A line before the last that does not decode is damage.
func TestJSONLines(t *testing.T) {
	decode := func(line []byte) error {
		var v struct{ N int }
		if err := json.Unmarshal(line, &v); err != nil {
			return err
		}
		if v.N == 0 {
			return errors.New("no n")
		}
		return nil
	}
	for _, tt := range []struct {
		name, text string
		good       int64
		damaged    bool
	}{
		{"whole", "{\"N\":1}\n\n{\"N\":2}\n", 17, false},
		{"torn, no newline", "{\"N\":1}\n{\"N\":2}", 8, false},
		{"torn, cut inside", "{\"N\":1}\n{\"N\":\n", 8, false},
		{"damaged inside", "{\"N\":1}\n{\"N\":\n{\"N\":3}\n", 0, true},
		{"not one", "{\"M\":1}\n{\"N\":3}\n", 0, true},
	} {
		good, err := ReadJSONLines(strings.NewReader(tt.text), decode)
		if good != tt.good || errors.Is(err, ErrDamagedLine) != tt.damaged {
			t.Errorf("%s: %d whole bytes, %v; want %d, damaged %v", tt.name, good, err, tt.good, tt.damaged)
		}
	}

	path := filepath.Join(t.TempDir(), "f.jsonl")
	if err := os.WriteFile(path, []byte("{\"N\":1}\n{\"N\":"), 0o644); err != nil {
		t.Fatal(err)
	}
	f, good, err := OpenJSONLines(path, decode)
	if err != nil || good != 8 {
		t.Fatalf("open: %d, %v", good, err)
	}
	if _, err := f.WriteString("{\"N\":2}\n"); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if b, _ := os.ReadFile(path); string(b) != "{\"N\":1}\n{\"N\":2}\n" {
		t.Errorf("after an append past a torn line: %q", b)
	}
}

// Regrades appended after a crash left a torn line are all read back.
func TestRegradesAfterTornLine(t *testing.T) {
	dir := t.TempDir()
	one, two := 1.0, 0.0
	if err := AppendRegrades(dir, []Regrade{{RolloutID: "a", Reward: &one, Regraded: &one}}); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(filepath.Join(dir, RegradeFile), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString(`{"rollout_id": "b", "rew`)
	f.Close()
	if got, err := LatestRegrades(dir); err != nil || len(got) != 1 {
		t.Fatalf("with a torn last line: %v, %v; want a's regrade", got, err)
	}
	if err := AppendRegrades(dir, []Regrade{{RolloutID: "b", Reward: &one, Regraded: &two}}); err != nil {
		t.Fatal(err)
	}
	got, err := LatestRegrades(dir)
	if err != nil || len(got) != 2 || *got["b"].Regraded != 0 {
		t.Errorf("after an append: %v, %v; want a's and b's regrades", got, err)
	}
}
