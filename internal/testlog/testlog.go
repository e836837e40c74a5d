// Package testlog gives tests a *slog.Logger that writes through t.Log, so
// a component's logs show up with the test that produced them.
package testlog

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
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

// Buffer collects log output from any goroutine, for tests that check
// what was logged.
type Buffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns everything written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
