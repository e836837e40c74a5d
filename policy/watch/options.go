package watch

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"

	"github.com/workload-ca/workload-ca/internal/cliflag"
	"github.com/workload-ca/workload-ca/policy"
)

// Options are the flags of issuance policies.
type Options struct {
	Enabled        bool
	StatusInterval time.Duration
}

// AddFlags defines the flags in the section Authorization: the policies
// decide after the node rule.
func (o *Options) AddFlags(fs *cliflag.FlagSet) {
	fs.Section("Authorization")
	fs.BoolVar(&o.Enabled, "issuance-policies", false, "decide requests by the IssuancePolicy resources (their CRD must be installed): CEL rules that refuse requests or cap certificate lifetimes; every replica reads them, their namespaces' and nodes' labels, and adds its decisions to their status")
	fs.DurationVar(&o.StatusInterval, "issuance-policy-status-interval", DefaultStatusInterval, "how often each replica adds the decisions it made to the issuance policies' status")
}

// Validate checks the flags.
func (o *Options) Validate() error {
	if o.StatusInterval < time.Second {
		return fmt.Errorf("--issuance-policy-status-interval %v: at least 1s", o.StatusInterval)
	}
	return nil
}

// Wiring is what the watcher gets from the rest of the process.
type Wiring struct {
	// Checks checks, before the CA serves, that the resource is served
	// and its permissions granted (Check).
	Checks   kubernetes.Interface
	Policies dynamic.Interface
	Metadata metadata.Interface
	Cluster  string
	Observer Observer
	TTL      func(time.Duration) time.Duration
	Logger   *slog.Logger
}

// Build checks the API server, then returns the watcher every replica
// runs (Run, Ready).
func (o *Options) Build(ctx context.Context, w Wiring) (*Watcher, error) {
	if err := Check(ctx, w.Checks); err != nil {
		return nil, err
	}
	compiler, err := policy.NewCompiler()
	if err != nil {
		return nil, err
	}
	return New(Config{Policies: w.Policies, Metadata: w.Metadata, Cluster: w.Cluster, Compiler: compiler,
		Observer: w.Observer, TTL: w.TTL, Logger: w.Logger, StatusInterval: o.StatusInterval})
}
