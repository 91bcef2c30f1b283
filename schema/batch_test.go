package schema

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestParseAdvantageStd(t *testing.T) {
	for _, k := range AdvantageStds {
		if got, err := ParseAdvantageStd(string(k)); err != nil || got != k {
			t.Errorf("ParseAdvantageStd(%q) = %q, %v", k, got, err)
		}
	}
	for _, bad := range []string{"", "Sample", "unbiased", "n-1"} {
		if _, err := ParseAdvantageStd(bad); err == nil || !strings.Contains(err.Error(), "want population or sample") {
			t.Errorf("ParseAdvantageStd(%q): %v, want an error listing the kinds", bad, err)
		}
	}
	if got := AdvantageStd("").OrDefault(); got != PopulationStd {
		t.Errorf(`"".OrDefault() = %q, want population`, got)
	}
}

// TestRecordedAdvantageStd reads a batch's advantage std from batch.json
// or a service's journal: population when neither records one (a batch
// older than the setting), an error naming the file for a kind this
// legato does not know or a journal that does not start with settings.
func TestRecordedAdvantageStd(t *testing.T) {
	tests := []struct {
		name    string
		files   map[string]string
		want    AdvantageStd
		wantErr string
	}{
		{name: "nothing", want: PopulationStd},
		{name: "batch.json without it", files: map[string]string{BatchFile: `{"group": 4}`}, want: PopulationStd},
		{name: "batch.json sample", files: map[string]string{BatchFile: `{"group": 4, "advantage_std": "sample"}`}, want: SampleStd},
		{name: "batch.json population", files: map[string]string{BatchFile: `{"advantage_std": "population"}`}, want: PopulationStd},
		{name: "batch.json unknown", files: map[string]string{BatchFile: `{"advantage_std": "unbiased"}`},
			wantErr: `batch.json: advantage std "unbiased": want population or sample`},
		{name: "journal sample", files: map[string]string{ServiceFile: `{"op":"service","manifest":{"group":2,"advantage_std":"sample"}}` + "\n" + `{"op":"group"}` + "\n"},
			want: SampleStd},
		{name: "journal without it", files: map[string]string{ServiceFile: `{"op":"service","manifest":{"group":2}}` + "\n"}, want: PopulationStd},
		// The service cuts a torn first line and writes its settings again.
		{name: "journal torn first line", files: map[string]string{ServiceFile: `{"op":"service","manif`}, want: PopulationStd},
		{name: "journal unknown", files: map[string]string{ServiceFile: `{"op":"service","manifest":{"advantage_std":"n-1"}}` + "\n"},
			wantErr: `service.jsonl: advantage std "n-1"`},
		{name: "journal not settings first", files: map[string]string{ServiceFile: `{"op":"group","id":"g-1"}` + "\n"},
			wantErr: "not a service journal"},
		{name: "journal damaged", files: map[string]string{ServiceFile: "{\"op\":\n"}, wantErr: "service.jsonl: first line"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			for name, text := range tt.files {
				if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			got, err := RecordedAdvantageStd(dir)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Errorf("RecordedAdvantageStd = %q, %v; want an error saying %q", got, err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Errorf("RecordedAdvantageStd = %q, %v; want %q", got, err, tt.want)
			}
		})
	}
}
