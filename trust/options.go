package trust

import (
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/clock"

	"github.com/workload-ca/workload-ca/internal/contest"
)

// DefaultResyncPeriod is how often a publisher reconciles without a
// trigger.
const DefaultResyncPeriod = 10 * time.Minute

// Options are the settings every publisher has. TrustDomain and Roots are
// required; zero values of the other fields take the defaults.
type Options struct {
	// TrustDomain names the published objects' trust-domain label.
	TrustDomain spiffeid.TrustDomain
	// Roots returns the current roots. It is called on every reconcile,
	// must be safe for concurrent use, and must not block.
	Roots func() []*x509.Certificate
	// Observer, if set, is told the outcome of every reconcile.
	Observer Observer
	Logger   *slog.Logger
	// Clock drives the periodic resync and the workqueue's retry delays.
	Clock clock.WithTicker
	// ResyncPeriod is how often every key is reconciled without a
	// trigger. Default DefaultResyncPeriod.
	ResyncPeriod time.Duration
	// RepairInterval is the least time between two repairs of one object
	// after someone else changed its content. Default
	// contest.DefaultInterval.
	RepairInterval time.Duration
}

// WithDefaults checks o and returns it with the defaults filled in.
func (o Options) WithDefaults() (Options, error) {
	switch {
	case o.Roots == nil:
		return o, errors.New("missing Roots")
	case o.TrustDomain.IsZero():
		return o, errors.New("missing TrustDomain")
	case o.ResyncPeriod < 0 || o.RepairInterval < 0:
		return o, fmt.Errorf("ResyncPeriod %v or RepairInterval %v is negative", o.ResyncPeriod, o.RepairInterval)
	}
	if errs := validation.IsValidLabelValue(o.TrustDomain.Name()); len(errs) > 0 {
		return o, fmt.Errorf("trust domain %q cannot be a label value: %v", o.TrustDomain.Name(), errs)
	}
	if o.Observer == nil {
		o.Observer = nopObserver{}
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	if o.ResyncPeriod == 0 {
		o.ResyncPeriod = DefaultResyncPeriod
	}
	if o.RepairInterval == 0 {
		o.RepairInterval = contest.DefaultInterval
	}
	return o, nil
}

// Observer receives the outcome of reconciles, for metrics.
// Implementations must be safe for concurrent use and fast.
type Observer interface {
	// Published is called after each reconcile of one key with one of the
	// Result* values (a bounded set, safe as a label; the key is
	// deliberately not passed, as a namespace would make an unbounded
	// one).
	Published(result string)
}

// Outcomes of one reconcile, as passed to Observer.Published.
const (
	// ResultCreated: the object did not exist and was created.
	ResultCreated = "created"
	// ResultUpdated: the object's content or our labels were wrong
	// (edited, adopted from another publisher, or new roots) and were
	// replaced.
	ResultUpdated = "updated"
	// ResultRepaired: someone else had changed the content we last wrote
	// (another publisher, such as istiod's, writing the same object); it
	// was restored and the other writer logged.
	ResultRepaired = "repaired"
	// ResultDeferred: someone else changed the content again within
	// Options.RepairInterval of our last repair; it is restored when the
	// interval ends, so that two publishers do not rewrite the object back
	// and forth as fast as the API server allows.
	ResultDeferred = "deferred"
	// ResultUnchanged: the object was already right. Stale objects may
	// still have been deleted.
	ResultUnchanged = "unchanged"
	// ResultSkipped: there is nothing to publish for the key (a namespace
	// gone, being deleted, or not selected); nothing was written.
	ResultSkipped = "skipped"
	// ResultRequeued: the object changed between the cache read and our
	// write (deleted or edited meanwhile); the key is reconciled again
	// shortly.
	ResultRequeued = "requeued"
	// ResultError: invalid roots or an API error; the reconcile is retried.
	ResultError = "error"
)

type nopObserver struct{}

func (nopObserver) Published(string) {}

// HasLabels reports whether have holds every label in want, with its value.
func HasLabels(have, want map[string]string) bool {
	for k, v := range want {
		if got, ok := have[k]; !ok || got != v {
			return false
		}
	}
	return true
}
