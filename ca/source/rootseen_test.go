package source

import (
	"crypto/x509"
	"testing"
	"time"

	"github.com/workload-ca/workload-ca/ca/castate"
	"github.com/workload-ca/workload-ca/internal/testca"
)

func TestRootsSeen(t *testing.T) {
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(h int) time.Time { return t0.Add(time.Duration(h) * time.Hour) }
	roots := testca.RootCerts(t, 3)
	a, b, c := roots[0], roots[1], roots[2]
	var seen rootsSeen
	seen.observe([]*x509.Certificate{a}, at(0))
	seen.observe([]*x509.Certificate{a, b}, at(1))
	seen.observe([]*x509.Certificate{b}, at(2))
	seen.observe([]*x509.Certificate{a, b}, at(3))
	tests := []struct {
		name string
		root *x509.Certificate
		want time.Time
	}{
		{"kept in the bundle: its first sighting", b, at(1)},
		{"left the bundle and came back: counts again", a, at(3)},
		{"never in the bundle: counts from now", c, at(4)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := seen.since(tt.root, at(4)); !got.Equal(tt.want) {
				t.Errorf("since = %v, want %v", got, tt.want)
			}
		})
	}
}

// The leader's record wins over this process's sightings, for the roots
// it holds; a root outside it keeps its own sighting.
func TestRootsSeenAdopt(t *testing.T) {
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	roots := testca.RootCerts(t, 2)
	a, b := roots[0], roots[1]
	var seen rootsSeen
	seen.observe([]*x509.Certificate{a, b}, t0.Add(time.Hour))
	seen.adopt(map[castate.RootDigest]time.Time{castate.DigestOf(a): t0})
	if got := seen.since(a, t0.Add(2*time.Hour)); !got.Equal(t0) {
		t.Errorf("a: since %v, want the record's %v", got, t0)
	}
	if got := seen.since(b, t0.Add(2*time.Hour)); !got.Equal(t0.Add(time.Hour)) {
		t.Errorf("b: since %v, want its own sighting", got)
	}
	var empty rootsSeen
	empty.adopt(map[castate.RootDigest]time.Time{castate.DigestOf(b): t0})
	if got := empty.since(b, t0.Add(time.Hour)); !got.Equal(t0) {
		t.Errorf("record before any sighting: since %v, want %v", got, t0)
	}
}
