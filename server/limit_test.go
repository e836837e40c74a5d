package server

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc/codes"
)

func TestCPULimiterQueuesThenFailsFast(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := newCPULimiter(1, time.Second)
		release := make(chan struct{})
		go func() { _ = l.do(context.Background(), func() error { <-release; return nil }) }()
		synctest.Wait() // the slot is taken

		// A request queues and gets the slot once it frees within the wait.
		done := make(chan error, 1)
		go func() { done <- l.do(context.Background(), func() error { return nil }) }()
		time.Sleep(500 * time.Millisecond)
		close(release)
		if err := <-done; err != nil {
			t.Fatalf("queued request: %v", err)
		}

		// With the slot held past the wait, a request fails as overloaded.
		hold := make(chan struct{})
		go func() { _ = l.do(context.Background(), func() error { <-hold; return nil }) }()
		synctest.Wait()
		start := time.Now()
		err := l.do(context.Background(), func() error { t.Fatal("ran without a slot"); return nil })
		if !errors.Is(err, errOverloaded) || time.Since(start) != time.Second {
			t.Fatalf("do() = %v after %v, want overloaded after 1s", err, time.Since(start))
		}
		if o := classify(err); o.code != codes.Unavailable || o.reason != "overloaded" {
			t.Fatalf("classify(overloaded) = %+v", o)
		}

		// A cancelled caller stops waiting at once.
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if err := l.do(ctx, func() error { return nil }); !errors.Is(err, context.Canceled) {
			t.Fatalf("do(cancelled) = %v", err)
		}
		close(hold)
	})
}
