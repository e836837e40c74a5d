package server

import (
	"context"
	"fmt"
	"runtime"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/workload-ca/workload-ca/authz"
)

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
// Callers queue in order, within bounds that keep one caller from taking
// the queue and the queue from taking the memory: at most maxQueued in
// all and maxPerFlow of one flow (the node a request comes from), and
// none whose turn would come after its deadline (as the steps have been
// completing lately). Beyond them a caller is refused at once, told when
// to come back (authz.OverloadError), before any of its work is done. A
// caller without a deadline (ztunnel sends none) waits up to wait. A request's
// second step goes before anyone's first (urgent): work already started
// is finished first, and a request in progress holds memory.
//
// A goroutine idle for cpuIdleExit exits.
type cpuLimiter struct {
	n          int
	wait       time.Duration
	maxQueued  int
	maxPerFlow int
	// jobs hands a job to an idle goroutine; unbuffered, so a caller that
	// sends has been taken, and callers blocked on it are served in order.
	// urgent does the same for second steps, which goroutines take first.
	jobs, urgent chan *cpuJob
	pool         sync.Pool // of *cpuJob
	// intervalNanos is a moving average of the time between two steps
	// completing while callers wait: what the queue drains at, for the
	// wait a queued caller can expect. lastDone is when the last step
	// completed (UnixNano).
	intervalNanos atomic.Int64
	lastDone      atomic.Int64

	mu      sync.Mutex
	workers int // goroutines running, at most n
	// waiting counts the callers that found all n busy and may send on
	// jobs; raised under mu.
	waiting atomic.Int64
	// flows counts the waiting callers of each flow; under mu.
	flows map[string]int
}

// limiterConfig sizes a cpuLimiter.
type limiterConfig struct {
	n          int           // steps at once
	wait       time.Duration // longest wait for a goroutine
	maxQueued  int           // callers waiting, in all
	maxPerFlow int           // callers waiting, of one flow
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

func newCPULimiter(cfg limiterConfig) *cpuLimiter {
	l := &cpuLimiter{n: cfg.n, wait: cfg.wait, maxQueued: cfg.maxQueued, maxPerFlow: cfg.maxPerFlow,
		jobs: make(chan *cpuJob), urgent: make(chan *cpuJob), flows: map[string]int{}}
	l.pool.New = func() any { return &cpuJob{done: make(chan cpuResult, 1)} }
	l.intervalNanos.Store(int64(100 * time.Microsecond / time.Duration(max(1, cfg.n))))
	return l
}

// do runs f, a step of a request from flow, on one of the limiter's
// goroutines and returns its error. urgent marks a request's later step,
// which goes before the first steps of others. do refuses at once a caller
// that would wait beyond the limiter's bounds (an *authz.OverloadError),
// waits at most l.wait for a goroutine, and stops waiting when ctx ends.
// Once f started, do waits for it to finish. A panic in f is raised again
// here, as a *stepPanic; runtime.Goexit in f exits this goroutine too.
func (l *cpuLimiter) do(ctx context.Context, flow string, urgent bool, f func() error) error {
	j := l.pool.Get().(*cpuJob)
	j.f = f
	var r cpuResult
	if r.err = l.submit(ctx, flow, urgent, j); r.err == nil {
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
// run, or else queues for one, within the bounds.
func (l *cpuLimiter) submit(ctx context.Context, flow string, urgent bool, j *cpuJob) error {
	ch := l.jobs
	if urgent {
		ch = l.urgent
	}
	select {
	case ch <- j:
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
	if err := l.admit(ctx, flow); err != nil {
		l.mu.Unlock()
		return err
	}
	// Counted before the lock is released: a goroutine that finds no
	// work does not exit while a caller may still send it some.
	l.waiting.Add(1)
	l.flows[flow]++
	l.mu.Unlock()
	defer l.leave(flow)
	t := time.NewTimer(l.wait)
	defer t.Stop()
	select {
	case ch <- j:
		return nil
	case <-t.C:
		return &authz.OverloadError{RetryAfter: l.expectedWait(int(l.waiting.Load())),
			Detail: fmt.Sprintf("no signing slot within %v", l.wait)}
	case <-ctx.Done():
		return ctx.Err()
	}
}

// admit checks, under l.mu, that a caller of flow may wait: the queue and
// the flow have room, and its turn comes before its deadline.
func (l *cpuLimiter) admit(ctx context.Context, flow string) error {
	queued := int(l.waiting.Load())
	wait := l.expectedWait(queued + 1)
	d, hasDeadline := ctx.Deadline()
	bound := time.Until(d)
	switch {
	case queued >= l.maxQueued:
		return &authz.OverloadError{RetryAfter: wait, Detail: fmt.Sprintf("%d requests wait for a signing slot already", queued)}
	case l.flows[flow] >= l.maxPerFlow:
		return &authz.OverloadError{RetryAfter: wait,
			Detail: fmt.Sprintf("%d requests of %s wait for a signing slot already", l.flows[flow], flow)}
	case hasDeadline && wait > bound:
		return &authz.OverloadError{RetryAfter: wait,
			Detail: fmt.Sprintf("a signing slot would come in %v, after the request's deadline (%v)",
				wait.Round(time.Millisecond), bound.Round(time.Millisecond))}
	}
	return nil
}

// leave uncounts a caller of flow that stopped waiting.
func (l *cpuLimiter) leave(flow string) {
	l.mu.Lock()
	if l.flows[flow]--; l.flows[flow] <= 0 {
		delete(l.flows, flow)
	}
	l.mu.Unlock()
	l.waiting.Add(-1)
}

// expectedWait is how long until the queued-th waiting caller's turn, at
// the rate steps have been completing.
func (l *cpuLimiter) expectedWait(queued int) time.Duration {
	return time.Duration(int64(queued) * l.intervalNanos.Load())
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
	l.completed()
	j.done <- cpuResult{err: err}
}

// completed records that a step completed. While callers wait, the time
// since the previous completion is how fast the queue drains, whatever
// else shares the CPU: a moving average over about 64 steps (races between
// goroutines lose an update now and then, which does not matter).
func (l *cpuLimiter) completed() {
	now := time.Now().UnixNano()
	prev := l.lastDone.Swap(now)
	if prev == 0 || l.waiting.Load() == 0 {
		return
	}
	d, avg := now-prev, l.intervalNanos.Load()
	l.intervalNanos.Store(avg + (d-avg)/64)
}

// next returns the next job, or nil once none came for cpuIdleExit and no
// caller is queued; the goroutine is then no longer counted.
func (l *cpuLimiter) next(idle *time.Timer) *cpuJob {
	select {
	case j := <-l.urgent:
		return j
	default:
	}
	select {
	case j := <-l.jobs:
		return j
	default:
	}
	for {
		idle.Reset(cpuIdleExit)
		select {
		case j := <-l.urgent:
			return j
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
