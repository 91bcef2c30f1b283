package export

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"legato/rl/schema"
)

// TestSampleWriterLayout checks that a line written in three pieces
// (sampleHead, the messages, sampleTail) is byte for byte what encoding the
// public Sample gives: the pieces repeat Sample's fields, and a field added
// to one and not the other, renamed or moved, fails here.
func TestSampleWriterLayout(t *testing.T) {
	var head sampleHead
	var tail sampleTail
	fill(t, reflect.ValueOf(&head).Elem(), "h")
	fill(t, reflect.ValueOf(&tail).Elem(), "t")
	msgs := []schema.Message{
		{Role: "system", Content: []schema.Part{schema.TextPart("<tool_call> & co")}},
		{Role: "user", Content: []schema.Part{schema.TextPart("click")}},
	}

	var want Sample
	sv := reflect.ValueOf(&want).Elem()
	covered := map[string]bool{"Messages": true}
	for _, piece := range []reflect.Value{reflect.ValueOf(head), reflect.ValueOf(tail)} {
		for i := range piece.NumField() {
			f := piece.Type().Field(i)
			if !f.IsExported() {
				continue // the writer's own (promptChunks: TestAppendTail)
			}
			sf, ok := sv.Type().FieldByName(f.Name)
			if !ok {
				t.Fatalf("%s.%s is not a field of Sample", piece.Type().Name(), f.Name)
			}
			if sf.Tag.Get("json") != f.Tag.Get("json") {
				t.Errorf("%s: Sample's json tag %q, %s's %q", f.Name, sf.Tag.Get("json"), piece.Type().Name(), f.Tag.Get("json"))
			}
			sv.FieldByName(f.Name).Set(piece.Field(i))
			covered[f.Name] = true
		}
	}
	for i := range sv.NumField() {
		if name := sv.Type().Field(i).Name; !covered[name] {
			t.Errorf("Sample.%s is in neither sampleHead nor sampleTail: the export never writes it", name)
		}
	}
	want.Messages = msgs

	var wantLine bytes.Buffer
	enc := json.NewEncoder(&wantLine)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(&want); err != nil {
		t.Fatal(err)
	}
	var got bytes.Buffer
	sw := newSampleWriter(&got)
	msg := func(k int) ([]byte, error) { return sw.encode(&msgs[k]) }
	if err := sw.write(&head, len(msgs), msg, &tail); err != nil {
		t.Fatal(err)
	}
	// The advantage alone is padded (to advantageWidth, for a one-pass
	// export to write it later): without the whitespace the line is
	// encoding/json's.
	var compact bytes.Buffer
	if err := json.Compact(&compact, got.Bytes()); err != nil || compact.String()+"\n" != wantLine.String() {
		t.Errorf("written line (%v)\n%s\nwant (Sample encoded)\n%s", err, got.String(), wantLine.String())
	}
	if len(sw.advAt) != 1 || sw.advAt[0]+int64(advantageWidth) >= int64(got.Len()) {
		t.Fatalf("advantages at %v in a line of %d bytes, want one", sw.advAt, got.Len())
	}
	at := sw.advAt[0]
	if field, after := got.Bytes()[at:at+int64(advantageWidth)], got.Bytes()[at+int64(advantageWidth)]; strings.TrimLeft(string(field), " ") != string(mustAppendFloat(head.Advantage)) || after != ',' {
		t.Errorf("advantage at %d: %q then %q, want %v in %d bytes", at, field, after, head.Advantage, advantageWidth)
	}
}

// fill sets every field of the struct v to a value that is not zero and
// differs per field, so that a field written in the wrong place shows.
func fill(t *testing.T, v reflect.Value, prefix string) {
	t.Helper()
	for i := range v.NumField() {
		if !v.Type().Field(i).IsExported() {
			continue
		}
		f := v.Field(i)
		s := fmt.Sprintf("%s%d", prefix, i)
		switch f.Kind() {
		case reflect.String:
			f.SetString(s)
		case reflect.Int, reflect.Int64:
			f.SetInt(int64(i + 1))
		case reflect.Float64:
			f.SetFloat(float64(i) + 0.5)
		case reflect.Slice:
			sl := reflect.MakeSlice(f.Type(), 2, 2)
			for j := range 2 {
				e := sl.Index(j)
				switch e.Kind() {
				case reflect.String:
					e.SetString(fmt.Sprintf("%s-%d", s, j))
				case reflect.Int64:
					e.SetInt(int64(100*i + j))
				case reflect.Float64:
					e.SetFloat(-float64(i) - float64(j)/4)
				case reflect.Struct:
					fill(t, e, fmt.Sprintf("%s-%d-", s, j))
				default:
					t.Fatalf("field %s: no filler for slices of %s", v.Type().Field(i).Name, e.Kind())
				}
			}
			f.Set(sl)
		case reflect.Pointer:
			if f.Type().Elem().Kind() != reflect.Array {
				t.Fatalf("field %s: no filler for pointers to %s", v.Type().Field(i).Name, f.Type().Elem().Kind())
			}
			p := reflect.New(f.Type().Elem())
			for j := range p.Elem().Len() {
				p.Elem().Index(j).SetInt(int64(10*i + j))
			}
			f.Set(p)
		default:
			t.Fatalf("field %s: no filler for %s", v.Type().Field(i).Name, f.Kind())
		}
	}
}
