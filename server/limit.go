package server

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"runtime/debug"
	"sync"
	"time"
)

// errOverloaded is returned when CPU-bound work waited its whole queue
// time for a slot.
var errOverloaded = errors.New("overloaded")

// cpuLimiter bounds the CPU-bound steps of a request (CSR checks, signing)
// to about the number of cores. Excess requests queue briefly, then fail
// fast with Unavailable (clients retry with backoff) instead of piling up
// goroutines and memory behind a saturated CPU.
//
// The steps run on one long-lived worker per slot rather than on the
// request's goroutine: parsing and signing need a stack of tens of KiB,
// which a fresh goroutine per request grew (by copying) every time.
type cpuLimiter struct {
	work      chan *cpuJob
	wait      time.Duration
	stop      chan struct{}
	closeOnce sync.Once
}

type cpuJob struct {
	f    func() error
	done chan cpuResult
}

type cpuResult struct {
	err      error
	panicked any // a panic of f, raised again on the caller's goroutine
}

// cpuPanic carries a worker's panic and its stack to the caller.
type cpuPanic struct {
	value any
	stack []byte
}

func (p cpuPanic) Error() string { return fmt.Sprintf("%v\n\nworker stack:\n%s", p.value, p.stack) }

// newCPULimiter starts n workers; close stops them.
func newCPULimiter(n int, wait time.Duration) *cpuLimiter {
	l := &cpuLimiter{work: make(chan *cpuJob), wait: wait, stop: make(chan struct{})}
	for range n {
		go l.worker()
	}
	return l
}

func (l *cpuLimiter) worker() {
	for {
		select {
		case j := <-l.work:
			j.done <- run(j.f)
			// Let the caller just woken (and the transport behind it) run
			// before the next job: a worker that went on without blocking
			// would hold its processor until the scheduler preempts it
			// (10ms), and every answer would wait that long.
			runtime.Gosched()
		case <-l.stop:
			return
		}
	}
}

func run(f func() error) (r cpuResult) {
	defer func() {
		if p := recover(); p != nil {
			r.panicked = cpuPanic{value: p, stack: debug.Stack()}
		}
	}()
	return cpuResult{err: f()}
}

// close stops the workers once their current work is done. A later do
// finds no worker and fails as overloaded after its queue time.
func (l *cpuLimiter) close() { l.closeOnce.Do(func() { close(l.stop) }) }

// do runs f on a worker and returns its error; a panic in f is raised
// again here, so the caller's recovery sees it.
func (l *cpuLimiter) do(ctx context.Context, f func() error) error {
	j := &cpuJob{f: f, done: make(chan cpuResult, 1)}
	select {
	case l.work <- j:
	default:
		if err := l.queue(ctx, j); err != nil {
			return err
		}
	}
	r := <-j.done
	if r.panicked != nil {
		panic(r.panicked)
	}
	return r.err
}

// queue waits for a free worker for at most l.wait.
func (l *cpuLimiter) queue(ctx context.Context, j *cpuJob) error {
	t := time.NewTimer(l.wait)
	defer t.Stop()
	select {
	case l.work <- j:
		return nil
	case <-t.C:
		return errOverloaded
	case <-ctx.Done():
		return ctx.Err()
	}
}
