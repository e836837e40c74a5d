package clustertrustbundle

// Observer receives the outcome of reconciles, for metrics. Implementations
// must be safe for concurrent use and fast.
type Observer interface {
	// Published is called after each reconcile of one signer's bundles
	// with one of the Result* values (a bounded set, safe as a label).
	Published(result string)
}

// Outcomes of one reconcile, as passed to Observer.Published.
const (
	// ResultCreated: the desired bundle did not exist and was created.
	ResultCreated = "created"
	// ResultUpdated: the desired bundle's content or labels were wrong
	// (edited, or a fixed-name bundle with new roots) and were replaced.
	ResultUpdated = "updated"
	// ResultRepaired: someone else had changed the content we last wrote
	// (another publisher of the bundle, such as istiod's with
	// IstioCompatible); it was restored and the other writer logged.
	ResultRepaired = "repaired"
	// ResultDeferred: someone else changed the content again within
	// Config.RepairInterval of our last repair; it is restored when the
	// interval ends, so that two publishers do not rewrite the bundle back
	// and forth as fast as the API server allows.
	ResultDeferred = "deferred"
	// ResultUnchanged: the desired bundle was already right. Stale bundles
	// may still have been deleted.
	ResultUnchanged = "unchanged"
	// ResultError: invalid roots or an API error; the reconcile is retried.
	ResultError = "error"
)

type nopObserver struct{}

func (nopObserver) Published(string) {}
