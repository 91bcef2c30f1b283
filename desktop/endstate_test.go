package desktop

import (
	"bytes"
	"testing"
)

// TestEndStateRef: the names EndStateRef gives are the ones IsEndStateRef
// takes, and nothing else is: another backend's prefix, a short or long
// suffix, a character outside hex, a path.
func TestEndStateRef(t *testing.T) {
	sum := bytes.Repeat([]byte{0xab, 0x01}, 16)
	ref := EndStateRef("fake-end-", sum)
	if ref != "fake-end-ab01ab01ab01ab01ab01ab01ab01ab01" {
		t.Fatalf("EndStateRef = %q", ref)
	}
	if !IsEndStateRef("fake-end-", ref) {
		t.Errorf("IsEndStateRef refuses %q, which EndStateRef gave", ref)
	}
	for _, bad := range []string{
		"", "fake-end-", ref[:len(ref)-1], ref + "0", "osworld-end-ab01ab01ab01ab01ab01ab01ab01ab01",
		"fake-end-ab01ab01ab01ab01ab01ab01ab01ab0g", "fake-end-../../../../../../../../etc/passwd",
		"fake-end-ab01ab01ab01ab01ab01ab01ab01a/.", "../fake-end-ab01ab01ab01ab01ab01ab01ab01ab01",
	} {
		if IsEndStateRef("fake-end-", bad) {
			t.Errorf("IsEndStateRef takes %q", bad)
		}
	}
}
