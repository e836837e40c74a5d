// Package testlog gives tests a *slog.Logger that writes through t.Log, so
// a component's logs show up with the test that produced them.
package testlog

import (
	"log/slog"
	"strings"
	"testing"
)

// New returns a debug-level logger writing to t.
func New(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(writer{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type writer struct{ t testing.TB }

func (w writer) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}
