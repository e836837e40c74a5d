package server

import (
	"context"
	"log/slog"
	"strconv"
	"sync"
	"time"
	"unicode/utf8"
)

// DefaultRefusalSummaryInterval is how often the refusals that decide
// nothing are summarized in the audit log.
const DefaultRefusalSummaryInterval = 10 * time.Second

// maxRefusalKeys bounds the callers a summary tells apart in one interval;
// beyond them, refusals are counted together under one record.
const maxRefusalKeys = 1024

// refusals summarizes the refusals that decide nothing: a request refused
// because the CA is overloaded, not ready or cannot reach Kubernetes, or
// that its caller gave up; and the refusals of callers who did not
// authenticate, whom nothing identifies. Each gets a counter (the
// Observer) but not an audit record of its own: under overload they would
// come by the hundred thousand, costing the CPU they were refused to save,
// and would bury the records that matter; and anyone who can reach the
// port could fill the audit volume with them, after which no certificate
// is handed out (an issuance needs its record). Instead, one record per
// cluster, caller, reason and code and interval says how many there were,
// with the first error as a sample. The key holds no caller-supplied
// string an unauthenticated caller can vary: its cluster is one the CA
// serves (a claimed cluster it does not serve is only in the sample) and
// its caller is empty. Issued and denied requests keep one record each.
type refusals struct {
	mu     sync.Mutex
	counts map[refusalKey]*refusalCount
	other  refusalCount // refusals beyond maxRefusalKeys distinct keys
}

type refusalKey struct {
	cluster, caller, node, result, reason, code string
}

type refusalCount struct {
	n           int
	first, last time.Time
	sample      string // the first error
}

func (c *refusalCount) add(at time.Time, err string) {
	if c.n == 0 {
		c.first, c.sample = at, clip(err, maxSampleError)
	}
	c.n++
	c.last = at
}

// add counts one refusal.
func (r *refusals) add(k refusalKey, at time.Time, err string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.counts == nil {
		r.counts = map[refusalKey]*refusalCount{}
	}
	c, ok := r.counts[k]
	if !ok {
		if len(r.counts) >= maxRefusalKeys {
			r.other.add(at, err)
			return
		}
		c = &refusalCount{}
		r.counts[k] = c
	}
	c.add(at, err)
}

// flush writes one summary record per key counted since the last flush,
// through write, and forgets them.
func (r *refusals) flush(write func(level slog.Level, msg string, attrs []slog.Attr)) {
	r.mu.Lock()
	counts, other := r.counts, r.other
	r.counts, r.other = nil, refusalCount{}
	r.mu.Unlock()
	for k, c := range counts {
		attrs := []slog.Attr{
			slog.String("decision", k.result),
			slog.String("caller", k.caller),
			slog.String("node", k.node),
			slog.String("reason", k.reason),
			slog.String("code", k.code),
		}
		if k.cluster != "" {
			attrs = append(attrs, slog.String("cluster", k.cluster))
		}
		write(slog.LevelWarn, "certificate requests refused (summary)", append(attrs, c.attrs()...))
	}
	if other.n > 0 {
		write(slog.LevelWarn, "certificate requests refused (summary)", append([]slog.Attr{
			slog.String("caller", "(others)")}, other.attrs()...))
	}
}

func (c *refusalCount) attrs() []slog.Attr {
	return []slog.Attr{
		slog.Int("count", c.n),
		slog.Time("first", c.first),
		slog.Time("last", c.last),
		slog.String("sample_error", c.sample),
	}
}

// summarized reports whether a request's outcome is a refusal that
// decides nothing about the caller, or one of a caller who did not
// authenticate: summarized, not recorded one by one.
func summarized(o outcome) bool {
	return o.result == ResultUnavailable || o.result == ResultCanceled || o.result == ResultUnauthenticated
}

// Bounds of the caller-supplied strings in audit records and logs (see
// clip). A cluster id is a short name; a SPIFFE ID is at most 2048 bytes
// (the SPIFFE ID specification's bound on its URI), and the error of a
// refusal names at most one with some words around it.
const (
	maxHeaderValue   = 128
	maxRecordedID    = 2048
	maxRecordedError = maxRecordedID + 1024
	maxSampleError   = 1024
)

// clip returns s if it is at most n bytes long, or else its first n bytes
// or fewer (whole UTF-8 characters) and a marker saying it was cut and how
// long it was: a caller who sends 16 KiB of header does not get 16 KiB
// into every record.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…[cut: " + strconv.Itoa(len(s)) + " bytes]"
}

// RunAudit writes the summaries of the refusals that decide nothing every
// interval (DefaultRefusalSummaryInterval if not positive) until ctx ends,
// and once more then.
func (s *Service) RunAudit(ctx context.Context, interval time.Duration) {
	if interval <= 0 {
		interval = DefaultRefusalSummaryInterval
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			s.FlushAudit()
			return
		case <-t.C:
			s.FlushAudit()
		}
	}
}

// FlushAudit writes the summaries of the refusals counted so far.
func (s *Service) FlushAudit() {
	s.refused.flush(func(level slog.Level, msg string, attrs []slog.Attr) {
		if err := s.writeAudit(context.Background(), level, msg, attrs); err != nil {
			s.auditFailed(context.Background(), err)
		}
	})
}
