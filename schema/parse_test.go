package schema

import (
	"bytes"
	"encoding/json"
	"math"
	"math/rand/v2"
	"os"
	"reflect"
	"testing"
	"time"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/google/go-cmp/cmp"
)

// fill sets every field v reaches to a value other than its zero: strings,
// numbers, booleans, one element in each slice and map, every pointer
// allocated, raw JSON an object. seed varies the values.
func fill(v reflect.Value, seed int) {
	switch v.Kind() {
	case reflect.String:
		v.SetString("s<é>\"" + string(rune('a'+seed%26)))
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(int64(seed + 1))
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(uint64(seed + 1))
	case reflect.Float32, reflect.Float64:
		v.SetFloat(float64(seed) + 0.25)
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Pointer:
		v.Set(reflect.New(v.Type().Elem()))
		fill(v.Elem(), seed+1)
	case reflect.Slice:
		if v.Type() == reflect.TypeFor[json.RawMessage]() {
			v.SetBytes([]byte(`{"raw":[1,"x"]}`))
			return
		}
		v.Set(reflect.MakeSlice(v.Type(), 1, 1))
		fill(v.Index(0), seed+1)
	case reflect.Map:
		v.Set(reflect.MakeMap(v.Type()))
		k, e := reflect.New(v.Type().Key()).Elem(), reflect.New(v.Type().Elem()).Elem()
		fill(k, seed+1)
		fill(e, seed+2)
		v.SetMapIndex(k, e)
	case reflect.Struct:
		if v.Type() == reflect.TypeFor[Time]() {
			v.Set(reflect.ValueOf(Time{time.Date(2025, 3, 1, 12, 0, seed, 125_000_000, time.UTC)}))
			return
		}
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				fill(v.Field(i), seed+i)
			}
		}
	case reflect.Interface:
		v.Set(reflect.ValueOf("any"))
	}
}

// TestParseRecordAgrees: parseRecord (encoding/json/v2) reads a record
// encoding/json wrote into the same value encoding/json reads, for a record
// with every field set, fullRecord, and the records of the fixture runs.
func TestParseRecordAgrees(t *testing.T) {
	var every Record
	fill(reflect.ValueOf(&every).Elem(), 0)
	every.Schema = Version
	var lines [][]byte
	for _, rec := range []*Record{&every, fullRecord("r-full")} {
		b, err := json.Marshal(rec)
		if err != nil {
			t.Fatal(err)
		}
		lines = append(lines, b)
	}
	for _, f := range []string{"../export/testdata/run/rollouts.jsonl", "../export/testdata/run-loose/rollouts.jsonl"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		lines = append(lines, bytes.Split(bytes.TrimSpace(b), []byte("\n"))...)
	}
	for i, line := range lines {
		var want Record
		if err := json.Unmarshal(line, &want); err != nil {
			t.Fatal(err)
		}
		got, err := parseRecord(line)
		if err != nil {
			t.Fatalf("line %d: %v", i, err)
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("line %d (-encoding/json +parseRecord):\n%s", i, diff)
		}
	}
	if every.Env == nil || every.Steps[0].Response.TokenIDs == nil {
		t.Fatal("fill left fields empty")
	}
}

// TestNumberArrays holds the record decoding's arrays of ids and logprobs
// to encoding/json: the same values, and an error where it gives one, on
// hand-picked edges (nulls, ranges, fractions in ids, whitespace) and on
// random arrays as encoding/json writes them.
func TestNumberArrays(t *testing.T) {
	type arrays struct {
		I []int64   `json:"i"`
		F []float64 `json:"f"`
	}
	var texts []string
	for _, a := range []string{
		`[]`, `[ ]`, `null`, `[0]`, `[-0]`, `[1,2,3]`, `[ 1 , 2 ]`, "[\n1,\t2\r]",
		`[9223372036854775807]`, `[-9223372036854775808]`, `[9223372036854775808]`,
		`[-9223372036854775809]`, `[18446744073709551616]`, `[99999999999999999999]`,
		`[1.5]`, `[1e3]`, `[1E+2]`, `[-1e-2]`, `[null]`, `[1,null,2]`, `["1"]`, `[[1]]`, `[{}]`,
		`[true]`, `[0.1,0.2]`, `[5e-324]`, `[2.4703282292062328e-324]`, `[1e400]`, `[-1e400]`,
		`[1.7976931348623157e308]`, `[-0.0]`, `[1e-400]`,
	} {
		texts = append(texts, `{"i":`+a+`}`, `{"f":`+a+`}`)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 500 {
		var a arrays
		for range rng.IntN(40) {
			a.I = append(a.I, rng.Int64()>>rng.IntN(64)*int64(1-2*rng.IntN(2)))
			a.F = append(a.F, -rng.ExpFloat64()*math.Pow(10, float64(rng.IntN(40)-20)))
		}
		b, err := json.Marshal(a)
		if err != nil {
			t.Fatal(err)
		}
		texts = append(texts, string(b))
	}
	for _, text := range texts {
		var want, got arrays
		wantErr := json.Unmarshal([]byte(text), &want)
		gotErr := jsonv2.Unmarshal([]byte(text), &got, recordDecoding)
		if (wantErr == nil) != (gotErr == nil) {
			t.Errorf("%s: encoding/json's error %v, record decoding's %v", text, wantErr, gotErr)
			continue
		}
		if wantErr != nil {
			continue
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("%s (-encoding/json +record decoding):\n%s", text, diff)
		}
		for i := range want.F {
			if math.Signbit(want.F[i]) != math.Signbit(got.F[i]) {
				t.Errorf("%s: element %d is %v, encoding/json's %v", text, i, got.F[i], want.F[i])
			}
		}
	}
}
