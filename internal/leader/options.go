package leader

import (
	"errors"
	"time"

	"k8s.io/client-go/tools/leaderelection"

	"github.com/workload-ca/workload-ca/internal/cliflag"
)

// Options are the flags of the leader election Lease.
type Options struct {
	Namespace, Name string
	Durations       Durations
}

// AddFlags defines the flags in the section Leader election.
func (o *Options) AddFlags(fs *cliflag.FlagSet) {
	fs.Section("Leader election")
	fs.StringVar(&o.Namespace, "leader-election-namespace", "istio-system", "namespace of the leader election Lease (the CA's own namespace)")
	fs.StringVar(&o.Name, "leader-election-id", "workload-ca", "name of the leader election Lease")
	fs.DurationVar(&o.Durations.Lease, "leader-election-lease-duration", 15*time.Second, "how long a lease is valid without renewal")
	fs.DurationVar(&o.Durations.Renew, "leader-election-renew-deadline", 10*time.Second, "how long the leader retries renewing before it gives up")
	fs.DurationVar(&o.Durations.Retry, "leader-election-retry-period", 2*time.Second, "how often candidates retry")
}

// Validate makes client-go's own checks, with its jitter of the retry
// period (1.2).
func (o *Options) Validate() error {
	d := o.Durations
	if o.Namespace == "" || o.Name == "" || d.Retry <= 0 ||
		float64(d.Renew) <= leaderelection.JitterFactor*float64(d.Retry) || d.Lease <= d.Renew {
		return errors.New("leader election: want a namespace and id, and lease duration > renew deadline > 1.2 × retry period > 0")
	}
	return nil
}
