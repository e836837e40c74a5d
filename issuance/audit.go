package issuance

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

// Bounds of the caller-supplied strings in audit records and logs (see
// Clip). A cluster id is a short name; a SPIFFE ID is at most 2048 bytes
// (the SPIFFE ID specification's bound on its URI), and the error of a
// refusal names at most one with some words around it.
const (
	MaxHeaderValue   = 128
	maxRecordedID    = 2048
	maxRecordedError = maxRecordedID + 1024
	maxSampleError   = 1024
)

// Clip returns s if it is at most n bytes long, or else its first n bytes
// or fewer (whole UTF-8 characters) and a marker saying it was cut and how
// long it was: a caller who sends 16 KiB of header does not get 16 KiB
// into every record.
func Clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…[cut: " + strconv.Itoa(len(s)) + " bytes]"
}

// The messages of audit records, the same for every door.
const (
	msgIssued  = "certificate issued"
	msgRefused = "certificate request refused"
	msgSummary = "certificate requests refused (summary)"
)

// refusals summarizes the refusals that decide nothing: a request refused
// because the CA is overloaded, not ready or cannot reach Kubernetes, or
// that its caller gave up; and the refusals of callers who did not
// authenticate, whom nothing identifies. Each gets a counter (the
// Observer) but not an audit record of its own: under overload they would
// come by the hundred thousand, costing the CPU they were refused to save,
// and would bury the records that matter; and anyone who can reach the
// port could fill the audit volume with them, after which no certificate
// is handed out (an issuance needs its record). Instead, one record per
// door, cluster, caller, reason and answer and interval says how many
// there were, with the first error as a sample. The key holds no
// caller-supplied string an unauthenticated caller can vary: its cluster
// is one the CA serves (a claimed cluster it does not serve is only in
// the sample) and its caller is empty. Issued and denied requests keep
// one record each.
type refusals struct {
	mu     sync.Mutex
	counts map[refusalKey]*refusalCount
	other  refusalCount // refusals beyond maxRefusalKeys distinct keys
}

type refusalKey struct {
	door, cluster, caller, node, result, reason, code string
}

type refusalCount struct {
	n           int
	first, last time.Time
	sample      string // the first error
}

func (c *refusalCount) add(at time.Time, err string) {
	if c.n == 0 {
		c.first, c.sample = at, Clip(err, maxSampleError)
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
			slog.String("door", k.door),
			slog.String("decision", k.result),
			slog.String("caller", k.caller),
			slog.String("node", k.node),
			slog.String("reason", k.reason),
			slog.String("code", k.code),
		}
		if k.cluster != "" {
			attrs = append(attrs, slog.String("cluster", k.cluster))
		}
		write(slog.LevelWarn, msgSummary, append(attrs, c.attrs()...))
	}
	if other.n > 0 {
		write(slog.LevelWarn, msgSummary, append([]slog.Attr{
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

// RunAudit writes the summaries of the refusals that decide nothing every
// interval (DefaultRefusalSummaryInterval if not positive) until ctx ends,
// and once more then.
func (p *Pipeline) RunAudit(ctx context.Context, interval time.Duration) {
	if interval <= 0 {
		interval = DefaultRefusalSummaryInterval
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			p.FlushAudit()
			return
		case <-t.C:
			p.FlushAudit()
		}
	}
}

// FlushAudit writes the summaries of the refusals counted so far.
func (p *Pipeline) FlushAudit() {
	p.refused.flush(func(level slog.Level, msg string, attrs []slog.Attr) {
		if err := p.writeAudit(context.Background(), level, msg, attrs); err != nil {
			p.auditFailed(context.Background(), err)
		}
	})
}

// auditFailed logs, at most once a second, that an audit record could not
// be written.
func (p *Pipeline) auditFailed(ctx context.Context, err error) {
	if p.auditErrLog.AllowN(p.clock.Now(), 1) {
		p.log.ErrorContext(ctx, "audit record not written; certificates are refused until it can be", "error", err.Error())
	}
}

// writeAudit hands one record to the audit handler. Unlike Logger.LogAttrs
// it does not capture the caller's program counter (a stack walk per
// certificate): the record's source is always this function.
func (p *Pipeline) writeAudit(ctx context.Context, level slog.Level, msg string, attrs []slog.Attr) error {
	h := p.audit.Handler()
	if !h.Enabled(ctx, level) {
		return nil
	}
	r := slog.NewRecord(p.clock.Now(), level, msg, 0)
	r.AddAttrs(attrs...)
	return h.Handle(ctx, r)
}
