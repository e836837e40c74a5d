package main

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestHandlingTimes(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	log := `{"time":"2026-12-01T10:00:00.5Z","msg":"certificate issued","took_seconds":0.009}
{"time":"2026-12-01T10:00:01Z","msg":"certificate issued","took_seconds":0.003}
{"time":"2026-12-01T10:00:01.5Z","msg":"certificate request refused","took_seconds":0.001}
{"time":"2026-12-01T10:00:02Z","msg":"certificate issued","took_seconds":0.002}
{"time":"2026-12-01T10:00:03Z","msg":"certificate issued","took_seconds":0.007}
`
	if err := os.WriteFile(path, []byte(log), 0o600); err != nil {
		t.Fatal(err)
	}
	from := time.Date(2026, 12, 1, 10, 0, 1, 0, time.UTC)
	got, err := handlingTimes(path, from, from.Add(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	want := []time.Duration{time.Millisecond, 2 * time.Millisecond, 3 * time.Millisecond}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] {
		t.Fatalf("handlingTimes = %v, want %v (the window's records, sorted)", got, want)
	}
	for _, tt := range []struct {
		q    float64
		want time.Duration
	}{{0.5, 2 * time.Millisecond}, {0.99, 3 * time.Millisecond}, {0, time.Millisecond}} {
		if q := quantile(got, tt.q); q != tt.want {
			t.Errorf("quantile(%v) = %v, want %v", tt.q, q, tt.want)
		}
	}
	if _, err := handlingTimes(path, from.Add(time.Hour), from.Add(2*time.Hour)); err == nil {
		t.Error("an empty window: no error")
	}
}
