package podindex

import (
	"fmt"
	"strings"
	"testing"
)

func TestParseUUID(t *testing.T) {
	tests := []struct {
		in   string
		ok   bool
		want uidKey
	}{
		{"00112233-4455-6677-8899-aabbccddeeff", true,
			uidKey{0x00, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0x99, 0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0xff}},
		{"00112233-4455-6677-8899-AABBCCDDEEFF", false, uidKey{}}, // apiserver UIDs are lower case
		{"00112233-4455-6677-8899_aabbccddeeff", false, uidKey{}},
		{"00112233-4455-6677-8899-aabbccddeef", false, uidKey{}},
		{"0011223g-4455-6677-8899-aabbccddeeff", false, uidKey{}},
		{"", false, uidKey{}},
	}
	for _, tc := range tests {
		got, ok := parseUUID(tc.in)
		if ok != tc.ok || got != tc.want {
			t.Errorf("parseUUID(%q) = %x, %v; want %x, %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}

func TestKeyOfDistinguishesSpellings(t *testing.T) {
	lower := "00112233-4455-6677-8899-aabbccddeeff"
	if keyOf(lower) == keyOf(strings.ToUpper(lower)) {
		t.Error("upper-case spelling maps to the canonical key")
	}
	if keyOf("a") == keyOf("b") {
		t.Error("distinct non-UUID uids share a key")
	}
}

func FuzzKeyOf(f *testing.F) {
	for _, s := range []string{"00112233-4455-6677-8899-aabbccddeeff", "x", "", "--------------------------------xxxx"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if keyOf(s) != keyOf(strings.Clone(s)) {
			t.Fatal("keyOf is not deterministic")
		}
		k, ok := parseUUID(s)
		if !ok {
			return
		}
		b := fmt.Sprintf("%x", k[:])
		if back := b[:8] + "-" + b[8:12] + "-" + b[12:16] + "-" + b[16:20] + "-" + b[20:]; back != s {
			t.Fatalf("parseUUID(%q) round-trips to %q", s, back)
		}
	})
}

func TestInternerReusesIDs(t *testing.T) {
	in := newInterner(strings.Clone)
	a := in.acquire("node-a")
	if in.acquire("node-a") != a {
		t.Fatal("second acquire of node-a got a new id")
	}
	b := in.acquire("node-b")
	in.release(a)
	if _, ok := in.lookup("node-a"); !ok {
		t.Fatal("node-a forgotten while still referenced")
	}
	in.release(a)
	if _, ok := in.lookup("node-a"); ok {
		t.Fatal("node-a kept after its last release")
	}
	if c := in.acquire("node-c"); c != a {
		t.Errorf("node-c got id %d, want reused id %d", c, a)
	}
	if in.key(b) != "node-b" || in.len() != 2 {
		t.Errorf("table = %v (len %d)", in.keys, in.len())
	}
}
