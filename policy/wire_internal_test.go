package policy

import (
	"encoding/json"
	"math"
	"testing"
)

// FuzzWireLogprob checks that a logprob decodes as finite only when it is
// a finite number on the wire, whatever the server sends in its place.
func FuzzWireLogprob(f *testing.F) {
	for _, s := range []string{`-0.5`, `0`, `null`, `"NaN"`, `"-Infinity"`, `"Inf"`, `-1e999`, `1e308`, `"-0.25"`, `true`, `[]`, `{}`, `""`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		var tok chatTokenLogprob
		if err := json.Unmarshal([]byte(`{"token":"a","logprob":`+in+`}`), &tok); err != nil {
			return
		}
		l := tok.Logprob
		if l.finite && (math.IsNaN(l.v) || math.IsInf(l.v, 0)) {
			t.Errorf("%s decoded as finite %v", in, l.v)
		}
		var want float64
		if json.Unmarshal([]byte(in), &want) == nil && in != "null" && !l.finite {
			t.Errorf("%s, a finite JSON number, decoded as not finite", in)
		}
	})
}
