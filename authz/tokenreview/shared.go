package tokenreview

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/workload-ca/workload-ca/authz"
)

// reviewShared reviews a token not in the cache, sharing one API call among
// concurrent requests for the same token. The call outlives the cancellation
// of the request that started it (its waiters may still want the answer) but
// keeps that request's deadline, so a lone caller's deadline bounds it. A
// waiter whose shared call hit another request's deadline retries once.
func (r *Reviewer) reviewShared(ctx context.Context, key [sha256.Size]byte, token string) (*entry, error) {
	e, started, err := r.waitShared(ctx, key, token)
	if err != nil && !started && ctx.Err() == nil && errors.Is(err, errLeaderDeadline) {
		e, _, err = r.waitShared(ctx, key, token)
	}
	return e, err
}

// waitShared joins or starts the review of key and waits for it or ctx.
// started reports whether this call's ctx bounded the API call.
func (r *Reviewer) waitShared(ctx context.Context, key [sha256.Size]byte, token string) (*entry, bool, error) {
	started := false // written by the call; read only after its result arrives
	ch := r.calls.DoChan(string(key[:]), func() (any, error) {
		started = true
		return r.reviewDetached(ctx, key, token)
	})
	select {
	case res := <-ch:
		if res.Err != nil {
			return nil, started, res.Err
		}
		return res.Val.(*entry), started, nil
	case <-ctx.Done():
		return nil, false, fmt.Errorf("%w: waiting for token review: %w", authz.ErrUnavailable, context.Cause(ctx))
	}
}

// reviewDetached runs one review under a context that keeps ctx's values
// and deadline but not its cancellation, capped at the review timeout.
func (r *Reviewer) reviewDetached(ctx context.Context, key [sha256.Size]byte, token string) (*entry, error) {
	if e, ok := r.cached(key); ok {
		return e, nil // a call that finished while we queued stored it
	}
	deadline := time.Now().Add(r.timeout)
	d, borrowed := ctx.Deadline()
	borrowed = borrowed && d.Before(deadline)
	if borrowed {
		deadline = d
	}
	rctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), deadline)
	defer cancel()
	e, err := r.reviewAndStore(rctx, key, token)
	if err != nil && borrowed && rctx.Err() != nil {
		err = fmt.Errorf("%w (%w)", err, errLeaderDeadline)
	}
	return e, err
}

// reviewAndStore makes the API call, reports it and caches its answer.
// API errors are returned, not cached.
func (r *Reviewer) reviewAndStore(ctx context.Context, key [sha256.Size]byte, token string) (*entry, error) {
	start := r.clock.Now()
	c, result, err := r.review(ctx, token)
	r.obs.ReviewDone(result, r.clock.Since(start))
	r.logReview(ctx, key, result, c, err)
	if result == ResultError {
		return nil, err
	}
	e := &entry{caller: c, err: err}
	r.store(key, e)
	return e, nil
}

func (r *Reviewer) logReview(ctx context.Context, key [sha256.Size]byte, result string, c authz.Caller, err error) {
	if !r.log.Enabled(ctx, slog.LevelDebug) {
		return
	}
	attrs := []slog.Attr{
		slog.String("token_sha256", hex.EncodeToString(key[:6])),
		slog.String("result", result),
	}
	if err != nil {
		attrs = append(attrs, slog.String("error", err.Error()))
	} else {
		attrs = append(attrs, slog.String("caller", c.String()), slog.String("node", c.NodeName),
			slog.Time("expires", c.ExpiresAt))
	}
	r.log.LogAttrs(ctx, slog.LevelDebug, "token reviewed", attrs...)
}
