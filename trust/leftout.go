package trust

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"

	"github.com/workload-ca/workload-ca/trust/rootset"
)

// LeftOutReport logs and reports the federated trust domains whose roots
// a destination leaves out when that list changes, not on every
// reconcile.
type LeftOutReport struct {
	dest   string
	notify func([]rootset.LeftOut)
	log    *slog.Logger
	mu     sync.Mutex
	last   string
}

// NewLeftOutReport returns the report of destination dest (named in the
// logs); notify, if not nil, is told each new list.
func NewLeftOutReport(dest string, notify func([]rootset.LeftOut), log *slog.Logger) *LeftOutReport {
	return &LeftOutReport{dest: dest, notify: notify, log: log}
}

// Report takes the list of one reconcile.
func (r *LeftOutReport) Report(ctx context.Context, left []rootset.LeftOut) {
	var b strings.Builder
	for _, l := range left {
		fmt.Fprintf(&b, "%s\x00%s\x00%v\n", l.TrustDomain, l.Reason, l.Err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if b.String() == r.last {
		return
	}
	r.last = b.String()
	for _, l := range left {
		r.log.WarnContext(ctx, "leaving a federated trust domain's roots out of "+r.dest,
			"trustDomain", l.TrustDomain.Name(), "reason", l.Reason, "error", l.Err)
	}
	if len(left) == 0 {
		r.log.InfoContext(ctx, "every federated trust domain's roots held are in "+r.dest)
	}
	if r.notify != nil {
		r.notify(left)
	}
}
