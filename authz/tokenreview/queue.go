package tokenreview

import (
	"container/list"
	"context"
	"crypto/sha256"
	"fmt"
	"sync"
	"time"

	"golang.org/x/time/rate"
	"k8s.io/utils/clock"

	"github.com/workload-ca/workload-ca/authz"
)

// unverifiedFlow is the flow of the tokens no listed key verified: their
// claims could be anyone's, so they share one flow, which may hold at
// most half of the queue.
const unverifiedFlow = "unverified"

// reviewQueue runs the TokenReviews of the tokens the cache does not
// hold:
//   - one review per token at a time, shared by all its waiters;
//   - detached from them: once queued, a review runs to completion (within
//     the review timeout) and its answer is cached even if every waiter
//     has left, so that their retries are cache hits;
//   - at most rate per second, shared fairly between flows (a flow is the
//     node a token is bound to, or its service account): reviews wait in
//     a queue per flow, taken round-robin, so a node whose callers present
//     many new tokens delays itself, not the others;
//   - bounded: at most maxPending reviews wait in all, and maxPerFlow of
//     one flow; beyond that a new token is refused at once, saying when
//     to come back.
//
// A cache hit never comes here.
type reviewQueue struct {
	timeout    time.Duration
	limiter    *rate.Limiter
	clock      clock.Clock
	maxPending int
	maxPerFlow int
	maxWorkers int

	mu      sync.Mutex
	pending map[[sha256.Size]byte]*pendingReview // queued or running
	flows   map[string]*list.Element             // of ring, by flow
	ring    list.List                            // of *flowQueue with reviews queued, in turn
	queued  int                                  // reviews queued, not yet running
	workers int
}

// flowQueue is one flow's queued reviews, oldest first.
type flowQueue struct {
	flow    string
	reviews []*pendingReview
}

// pendingReview is a review queued or running, and where its answer goes.
type pendingReview struct {
	key  [sha256.Size]byte
	run  func(ctx context.Context) (*entry, error)
	done chan struct{} // closed when e and err are set
	e    *entry
	err  error
}

type queueConfig struct {
	timeout    time.Duration
	rate       float64
	burst      int
	maxPending int
	maxPerFlow int
	workers    int
	clock      clock.Clock
}

func newReviewQueue(cfg queueConfig) *reviewQueue {
	return &reviewQueue{
		timeout: cfg.timeout, clock: cfg.clock,
		limiter:    rate.NewLimiter(rate.Limit(cfg.rate), cfg.burst),
		maxPending: cfg.maxPending, maxPerFlow: cfg.maxPerFlow, maxWorkers: cfg.workers,
		pending: map[[sha256.Size]byte]*pendingReview{}, flows: map[string]*list.Element{},
	}
}

// wait returns the answer of the review of a token (key is its hash),
// joining the review under way or queueing run, the review, in flow. It
// refuses a new review whose turn would come after deadline (if not
// zero), and stops waiting when ctx ends; the review goes on.
func (q *reviewQueue) wait(ctx context.Context, key [sha256.Size]byte, flow string, deadline time.Time,
	run func(context.Context) (*entry, error),
) (*entry, error) {
	p, err := q.join(key, flow, deadline, run)
	if err != nil {
		return nil, err
	}
	select {
	case <-p.done:
		return p.e, p.err
	case <-ctx.Done():
		return nil, fmt.Errorf("%w: waiting for a token review: %w", authz.ErrUnavailable, context.Cause(ctx))
	}
}

// join returns the review of key, queueing it in flow if there is none.
// It refuses a new review when the queue or the flow is full, or when the
// caller's deadline would pass before the review's turn.
func (q *reviewQueue) join(key [sha256.Size]byte, flow string, deadline time.Time,
	run func(context.Context) (*entry, error),
) (*pendingReview, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if p, ok := q.pending[key]; ok {
		return p, nil
	}
	if err := q.admit(flow, deadline); err != nil {
		return nil, err
	}
	p := &pendingReview{key: key, run: run, done: make(chan struct{})}
	q.pending[key] = p
	el, ok := q.flows[flow]
	if !ok {
		el = q.ring.PushBack(&flowQueue{flow: flow})
		q.flows[flow] = el
	}
	fq := el.Value.(*flowQueue)
	fq.reviews = append(fq.reviews, p)
	q.queued++
	if q.workers < q.maxWorkers {
		q.workers++
		go q.work()
	}
	return p, nil
}

// admit checks, under q.mu, that one more review of flow fits.
func (q *reviewQueue) admit(flow string, deadline time.Time) error {
	inFlow := 0
	if el, ok := q.flows[flow]; ok {
		inFlow = len(el.Value.(*flowQueue).reviews)
	}
	wait := q.expectedWait(q.queued + 1)
	limit, perFlow := q.maxPending, q.maxPerFlow
	if flow == unverifiedFlow {
		perFlow = q.maxPending / 2
	}
	switch {
	case q.queued >= limit:
		return &authz.OverloadError{RetryAfter: wait, Detail: fmt.Sprintf("%d token reviews are queued already", q.queued)}
	case inFlow >= perFlow:
		return &authz.OverloadError{RetryAfter: q.expectedWait(inFlow * max(1, q.ring.Len())),
			Detail: fmt.Sprintf("%d token reviews of %s are queued already", inFlow, flow)}
	}
	if !deadline.IsZero() && deadline.Sub(q.clock.Now()) < wait {
		return &authz.OverloadError{RetryAfter: wait,
			Detail: fmt.Sprintf("the request's deadline comes before a token review's turn (%v)", wait)}
	}
	return nil
}

// expectedWait is how long n queued reviews take at the review rate.
func (q *reviewQueue) expectedWait(n int) time.Duration {
	r := float64(q.limiter.Limit())
	if r <= 0 {
		return time.Minute
	}
	return time.Duration(float64(n) / r * float64(time.Second))
}

// work runs queued reviews, paced by the limiter, until none is queued.
func (q *reviewQueue) work() {
	for {
		p := q.take()
		if p == nil {
			return
		}
		now := q.clock.Now()
		if d := q.limiter.ReserveN(now, 1).DelayFrom(now); d > 0 {
			<-q.clock.After(d)
		}
		ctx, cancel := context.WithTimeout(context.Background(), q.timeout)
		e, err := p.run(ctx)
		cancel()
		q.finish(p, e, err)
	}
}

// take removes the next review from the flow whose turn it is, or
// returns nil (and the worker stops) when none is queued.
func (q *reviewQueue) take() *pendingReview {
	q.mu.Lock()
	defer q.mu.Unlock()
	el := q.ring.Front()
	if el == nil {
		q.workers--
		return nil
	}
	fq := el.Value.(*flowQueue)
	p := fq.reviews[0]
	fq.reviews[0] = nil
	fq.reviews = fq.reviews[1:]
	if len(fq.reviews) == 0 {
		q.ring.Remove(el)
		delete(q.flows, fq.flow)
	} else {
		q.ring.MoveToBack(el)
	}
	q.queued--
	return p
}

// finish hands a review's answer to its waiters.
func (q *reviewQueue) finish(p *pendingReview, e *entry, err error) {
	q.mu.Lock()
	delete(q.pending, p.key)
	q.mu.Unlock()
	p.e, p.err = e, err
	close(p.done)
}

// len is the number of reviews queued or running.
func (q *reviewQueue) len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.pending)
}
