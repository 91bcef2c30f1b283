package pystr

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

// Fuzz targets comparing each operation with CPython on the same string:
//
//	go test -run '^$' -fuzz FuzzLower ./desktop/osworld/grade/pystr/

// pythonStr turns fuzz bytes into a Python str: bytes that are not UTF-8
// (nor an encoded surrogate) become the Greek and Coptic letters at
// U+0380 + byte, where the final sigma rule lives.
func pythonStr(data string) string {
	var b []byte
	for i := 0; i < len(data); {
		r, n := DecodeRune(data[i:])
		if invalid(r, n) {
			r = 0x300 + rune(data[i])
		}
		b = AppendRune(b, r)
		i += n
	}
	return string(b)
}

func seeds(f *testing.F) {
	for _, s := range generated(7, 64, 10) {
		f.Add(s)
	}
}

func FuzzLower(f *testing.F) {
	seeds(f)
	o := startOracle(f)
	f.Fuzz(func(t *testing.T, data string) {
		s := pythonStr(data)
		if got, want := Lower(s), o.strings(t, "lower", []string{s})[0]; got != want {
			t.Fatalf("Lower(%s) = %s, python gives %s", quote(s), quote(got), quote(want))
		}
	})
}

func FuzzStrip(f *testing.F) {
	seeds(f)
	o := startOracle(f)
	f.Fuzz(func(t *testing.T, data string) {
		s := pythonStr(data)
		if got, want := Strip(s), o.strings(t, "strip", []string{s})[0]; got != want {
			t.Fatalf("Strip(%s) = %s, python gives %s", quote(s), quote(got), quote(want))
		}
	})
}

func FuzzSplitLines(f *testing.F) {
	seeds(f)
	o := startOracle(f)
	f.Fuzz(func(t *testing.T, data string) {
		s := pythonStr(data)
		got := SplitLines(s)
		if got == nil {
			got = []string{}
		}
		if diff := cmp.Diff(o.lists(t, "splitlines", []string{s})[0], got); diff != "" {
			t.Fatalf("SplitLines(%s) (-python +go):\n%s", quote(s), diff)
		}
	})
}

func FuzzRepr(f *testing.F) {
	seeds(f)
	o := startOracle(f)
	f.Fuzz(func(t *testing.T, data string) {
		s := pythonStr(data)
		if got, want := Repr(s), o.strings(t, "repr", []string{s})[0]; got != want {
			t.Fatalf("Repr(%s) = %s, python gives %s", quote(s), quote(got), quote(want))
		}
	})
}
