package istiodcert

import (
	"errors"
	"fmt"
	"time"

	"github.com/workload-ca/workload-ca/internal/cliflag"
)

// Options are the flags of istiod's serving certificate the leader keeps.
type Options struct {
	Enabled    bool
	Namespace  string
	SecretName string
	// DNSNames are --istiod-cert-dns-names (none: the default for
	// Namespace; see Names).
	DNSNames cliflag.List
	TTL      time.Duration
}

// AddFlags defines the flags in the section istiod's serving certificate.
func (o *Options) AddFlags(fs *cliflag.FlagSet) {
	fs.Section("istiod's serving certificate (leader only)")
	fs.BoolVar(&o.Enabled, "istiod-cert", false, "keep istiod's serving certificate issued by this CA in the Secret Istio's chart mounts for it (leader only), so that proxies verifying istiod's xDS port with our root can connect")
	fs.StringVar(&o.Namespace, "istiod-namespace", "istio-system", "with --istiod-cert: istiod's namespace, where the Secret is kept")
	fs.StringVar(&o.SecretName, "istiod-cert-secret", DefaultSecretName, "with --istiod-cert: the Secret (kubernetes.io/tls: tls.crt, tls.key, ca.crt) istiod mounts at /var/run/secrets/istiod/tls; one not created by this CA is left alone")
	fs.Var(&o.DNSNames, "istiod-cert-dns-names", "with --istiod-cert: comma-separated DNS names of istiod's certificate (default istiod.<--istiod-namespace>.svc; add istiod-<revision>.<namespace>.svc for revisions, and any name proxies dial)")
	fs.DurationVar(&o.TTL, "istiod-cert-ttl", DefaultTTL, "with --istiod-cert: lifetime of istiod's certificate (clamped to --max-ttl); reissued after two thirds")
	fs.Example("istiod-cert-dns-names", "istiod.istio-system.svc,istiod-canary.istio-system.svc")
}

// Validate checks the flags when --istiod-cert asks for the certificate.
func (o *Options) Validate() error {
	if !o.Enabled {
		return nil
	}
	var errs []error
	if err := CheckNames(o.Namespace, o.SecretName, o.DNSNames); err != nil {
		errs = append(errs, fmt.Errorf("--istiod-namespace, --istiod-cert-secret or --istiod-cert-dns-names: %w", err))
	}
	if o.TTL <= 0 {
		errs = append(errs, fmt.Errorf("--istiod-cert-ttl %v must be positive", o.TTL))
	}
	return errors.Join(errs...)
}

// Names are the names istiod's serving certificate is for:
// --istiod-cert-dns-names, or the default for its namespace.
func (o *Options) Names() []string {
	if len(o.DNSNames) > 0 {
		return o.DNSNames
	}
	return DefaultDNSNames(o.Namespace)
}

// ApplyTo sets the fields of cfg the flags decide.
func (o *Options) ApplyTo(cfg *Config) {
	cfg.Namespace, cfg.SecretName, cfg.DNSNames, cfg.TTL = o.Namespace, o.SecretName, o.DNSNames, o.TTL
}
