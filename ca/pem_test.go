package ca

import (
	"bytes"
	"encoding/pem"
	"testing"
)

// FuzzEncodeCert proves encodeCert writes exactly what encoding/pem writes,
// for every length around the line boundaries and beyond.
func FuzzEncodeCert(f *testing.F) {
	for _, n := range []int{0, 1, 2, 3, 47, 48, 49, 95, 96, 97, 450, 1200} {
		f.Add(bytes.Repeat([]byte{byte(n)}, n))
	}
	f.Fuzz(func(t *testing.T, der []byte) {
		want := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
		if got := encodeCert(der); got != string(want) {
			t.Fatalf("encodeCert(%d bytes) =\n%s\nwant\n%s", len(der), got, want)
		}
	})
}

func BenchmarkEncodeCert(b *testing.B) {
	der := bytes.Repeat([]byte{0x30}, 520) // a P-256 SVID's size
	b.ReportAllocs()
	for b.Loop() {
		_ = encodeCert(der)
	}
}
