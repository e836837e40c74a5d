package configmap

// Observer receives the outcome of reconciles, for metrics. Implementations
// must be safe for concurrent use and fast.
type Observer interface {
	// Published is called after each reconcile of one namespace with one
	// of the Result* values (a bounded set, safe as a label; the namespace
	// is deliberately not passed, as it would make an unbounded one).
	Published(result string)
}

// Outcomes of one reconcile, as passed to Observer.Published.
const (
	// ResultCreated: the ConfigMap did not exist and was created.
	ResultCreated = "created"
	// ResultUpdated: the ConfigMap's roots or our labels were wrong
	// (edited, adopted from another publisher, or new roots) and were
	// replaced.
	ResultUpdated = "updated"
	// ResultRepaired: someone else had changed the roots we last wrote
	// (another publisher, such as istiod's, fighting over the
	// ConfigMap); they were restored and the other writer logged.
	ResultRepaired = "repaired"
	// ResultDeferred: someone else changed the roots again within
	// Config.RepairInterval of our last repair; they are restored when it
	// ends, so that two publishers do not rewrite the ConfigMap back and
	// forth as fast as the API server allows.
	ResultDeferred = "deferred"
	// ResultUnchanged: the ConfigMap was already right.
	ResultUnchanged = "unchanged"
	// ResultSkipped: the namespace is gone, being deleted, or not
	// selected; nothing was written.
	ResultSkipped = "skipped"
	// ResultRequeued: the ConfigMap changed between the cache read and our
	// write (deleted or edited meanwhile); the namespace is reconciled
	// again shortly.
	ResultRequeued = "requeued"
	// ResultError: invalid roots or an API error; the reconcile is retried.
	ResultError = "error"
)

type nopObserver struct{}

func (nopObserver) Published(string) {}
