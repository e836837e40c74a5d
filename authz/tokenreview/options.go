package tokenreview

import (
	"errors"
	"fmt"
	"time"

	"github.com/workload-ca/workload-ca/internal/cliflag"
)

// Options are the flags of the token checks, the same for every cluster.
type Options struct {
	// Local decides pod-bound tokens of the cluster's issuer without a
	// TokenReview (--token-verification=local).
	Local        bool
	verification string
	Audiences    cliflag.List
	CacheTTL     time.Duration
	KeysRefresh  time.Duration
}

// AddFlags defines the flags in the section Authentication.
func (o *Options) AddFlags(fs *cliflag.FlagSet) {
	o.Audiences = cliflag.List{DefaultAudience}
	fs.Section("Authentication")
	fs.StringVar(&o.verification, "token-verification", "local", "local: decide pod-bound tokens of the cluster's issuer with its published keys and the pod and service account informers, and send the others to a TokenReview; tokenreview: a TokenReview for every new token")
	fs.Var(&o.Audiences, "token-audiences", "comma-separated audiences a bearer token must carry")
	fs.DurationVar(&o.CacheTTL, "token-cache-ttl", DefaultMaxCacheTTL, "upper bound on caching a token review (the token's expiry bounds it too)")
	fs.DurationVar(&o.KeysRefresh, "token-keys-refresh", time.Minute, "how often the service account issuer's keys are fetched again; a token signed with a key the API server no longer lists stops being accepted within this long")
}

// Validate checks the flags, every problem reported.
func (o *Options) Validate() error {
	var errs []error
	switch o.verification {
	case "local":
		o.Local = true
	case "tokenreview":
	default:
		errs = append(errs, fmt.Errorf("--token-verification %q: want local or tokenreview", o.verification))
	}
	if o.KeysRefresh <= 0 {
		errs = append(errs, errors.New("--token-keys-refresh must be positive"))
	}
	if len(o.Audiences) == 0 {
		errs = append(errs, errors.New("--token-audiences must name at least one audience"))
	}
	return errors.Join(errs...)
}
