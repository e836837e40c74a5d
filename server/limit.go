package server

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"
)

// errOverloaded is returned when CPU-bound work waited its whole queue
// time for a slot.
var errOverloaded = errors.New("overloaded")

// cpuIdleExit is how long a goroutine of the cpuLimiter waits for work
// before it exits.
const cpuIdleExit = 10 * time.Second

// yieldBelow is the number of queued callers below which a goroutine of
// the cpuLimiter yields after each step.
const yieldBelow = 32

// cpuLimiter bounds the CPU-bound steps of a request (CSR checks, signing)
// to about the number of cores. Excess requests queue briefly, then fail
// fast with Unavailable (clients retry with backoff) instead of piling up
// goroutines and memory behind a saturated CPU.
//
// The steps run on the limiter's own goroutines, at most n of them, not on
// the requests' goroutines. Those are hundreds in flight, their idle stacks
// shrunk by every garbage collection: the steps grew a stack of tens of
// KiB again, by copying, for most requests (1.6% of the CA's CPU at the
// maximum rate), and the limiter's few busy goroutines keep theirs.
//
// While few callers queue, a goroutine yields after each step, so the
// short work of the server (reading requests, sending answers: each a few
// microseconds) runs before the next step (hundreds): otherwise a caller
// whose step is done waits behind the steps queued after its own. Under
// overload (yieldBelow callers queued or more) the steps run back to back
// and the answers they leave go out together, in fewer writes. (Yielding
// there too: ratio to the crypto floor median 0.69 over 19 bench runs,
// against 0.78 over 9.)
//
// A goroutine idle for cpuIdleExit exits.
type cpuLimiter struct {
	n    int
	wait time.Duration
	// jobs hands a job to an idle goroutine; unbuffered, so a caller that
	// sends has been taken, and callers blocked on it are served in order.
	jobs chan *cpuJob
	pool sync.Pool // of *cpuJob

	mu      sync.Mutex
	workers int // goroutines running, at most n
	// waiting counts the callers that found all n busy and may send on
	// jobs; raised under mu.
	waiting atomic.Int64
}

// cpuJob is one step, and where its result goes.
type cpuJob struct {
	f    func() error
	done chan cpuResult // buffered: the goroutine never waits on its caller
}

type cpuResult struct {
	err      error
	panicked *stepPanic // re-raised on the caller's goroutine
	exited   bool       // f called runtime.Goexit; so does the caller
}

// stepPanic is a panic of a step, with the stack of the goroutine it ran on.
type stepPanic struct {
	value any
	stack []byte
}

func (p *stepPanic) Error() string {
	return fmt.Sprintf("%v\n\non the CPU limiter's goroutine:\n%s", p.value, p.stack)
}

func newCPULimiter(n int, wait time.Duration) *cpuLimiter {
	l := &cpuLimiter{n: n, wait: wait, jobs: make(chan *cpuJob)}
	l.pool.New = func() any { return &cpuJob{done: make(chan cpuResult, 1)} }
	return l
}

// do runs f on one of the limiter's goroutines and returns its error. It
// waits at most l.wait for a goroutine (errOverloaded after that), and
// stops waiting when ctx ends. Once f started, do waits for it to finish.
// A panic in f is raised again here, as a *stepPanic; runtime.Goexit in f
// exits this goroutine too.
func (l *cpuLimiter) do(ctx context.Context, f func() error) error {
	j := l.pool.Get().(*cpuJob)
	j.f = f
	var r cpuResult
	if r.err = l.submit(ctx, j); r.err == nil {
		r = <-j.done
	}
	j.f = nil
	l.pool.Put(j)
	switch {
	case r.panicked != nil:
		panic(r.panicked)
	case r.exited:
		runtime.Goexit()
	}
	return r.err
}

// submit hands j to an idle goroutine, or to a new one while fewer than n
// run, or else queues for one for at most l.wait.
func (l *cpuLimiter) submit(ctx context.Context, j *cpuJob) error {
	select {
	case l.jobs <- j:
		return nil
	default:
	}
	l.mu.Lock()
	if l.workers < l.n {
		l.workers++
		l.mu.Unlock()
		go l.work(j)
		return nil
	}
	// Counted before the lock is released: a goroutine that finds no
	// work does not exit while a caller may still send it some.
	l.waiting.Add(1)
	l.mu.Unlock()
	defer l.waiting.Add(-1)
	t := time.NewTimer(l.wait)
	defer t.Stop()
	select {
	case l.jobs <- j:
		return nil
	case <-t.C:
		return errOverloaded
	case <-ctx.Done():
		return ctx.Err()
	}
}

// work runs j, then the jobs that come, until none came for cpuIdleExit.
func (l *cpuLimiter) work(j *cpuJob) {
	idle := time.NewTimer(cpuIdleExit)
	defer idle.Stop()
	for j != nil {
		l.run(j)
		if l.waiting.Load() < yieldBelow {
			runtime.Gosched()
		}
		j = l.next(idle)
	}
}

// run calls j.f and sends j its result. A panic becomes a result; so does
// runtime.Goexit, which ends this goroutine: it is no longer counted.
func (l *cpuLimiter) run(j *cpuJob) {
	returned := false
	defer func() {
		if returned {
			return
		}
		if p := recover(); p != nil {
			j.done <- cpuResult{panicked: &stepPanic{value: p, stack: debug.Stack()}}
			return
		}
		l.mu.Lock()
		l.workers--
		l.mu.Unlock()
		j.done <- cpuResult{exited: true}
	}()
	err := j.f()
	returned = true
	j.done <- cpuResult{err: err}
}

// next returns the next job, or nil once none came for cpuIdleExit and no
// caller is queued; the goroutine is then no longer counted.
func (l *cpuLimiter) next(idle *time.Timer) *cpuJob {
	select {
	case j := <-l.jobs:
		return j
	default:
	}
	for {
		idle.Reset(cpuIdleExit)
		select {
		case j := <-l.jobs:
			return j
		case <-idle.C:
		}
		l.mu.Lock()
		if l.waiting.Load() == 0 {
			l.workers--
			l.mu.Unlock()
			return nil
		}
		l.mu.Unlock()
	}
}
