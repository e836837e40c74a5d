// Package component is what the CA's parts hand to the process that runs
// them: named work that runs on every replica or only on the leader, with
// the readiness check it brings. The process adds components; it does not
// know what they hold.
package component

import (
	"context"
	"errors"
)

// Component is one part's work.
type Component struct {
	// Name names it in logs and readiness.
	Name string
	// Leader is set for writers: only the leader runs it, and an error
	// restarts it after a backoff while this replica leads. Otherwise every
	// replica runs it for the life of the process, and an error stops the
	// process.
	Leader bool
	// Run runs until ctx ends. Nil: the component only brings Ready.
	Run func(ctx context.Context) error
	// Ready, if set, is a readiness check: nil when the component is
	// ready to serve (a replica is not ready until every check passes).
	Ready func(ctx context.Context) error
}

// Synced is a readiness check of an informer-backed component: ready once
// hasSynced reports its initial list done.
func Synced(hasSynced func() bool) func(context.Context) error {
	return func(context.Context) error {
		if !hasSynced() {
			return errors.New("initial list not done")
		}
		return nil
	}
}
