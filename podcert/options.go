package podcert

import (
	"errors"
	"fmt"
	"time"

	"github.com/workload-ca/workload-ca/internal/cliflag"
)

// Options are the flags of the PodCertificateRequests the leader signs.
type Options struct {
	Enabled bool
	Workers int
}

// AddFlags defines the flags in the section Trust distribution, beside the
// signer name they share with the ClusterTrustBundles.
func (o *Options) AddFlags(fs *cliflag.FlagSet) {
	fs.Section("Trust distribution (leader only)")
	fs.BoolVar(&o.Enabled, "pod-certificates", false, "sign the PodCertificateRequests addressed to --signer-name (leader only): pods that mount a podCertificate projected volume get the X.509-SVID of their service account")
	fs.IntVar(&o.Workers, "pod-certificate-workers", 4, "PodCertificateRequests decided at once with --pod-certificates (each waits for its status update)")
}

// Validate checks the flags against maxTTL, the longest certificate
// lifetime the CA issues.
func (o *Options) Validate(maxTTL time.Duration) error {
	var errs []error
	if o.Enabled && maxTTL < time.Hour {
		errs = append(errs, fmt.Errorf("--pod-certificates: --max-ttl %v is under the hour Kubernetes requires of a pod certificate", maxTTL))
	}
	if o.Workers < 1 {
		errs = append(errs, errors.New("--pod-certificate-workers must be at least 1"))
	}
	return errors.Join(errs...)
}

// ApplyTo sets the fields of cfg the flags decide.
func (o *Options) ApplyTo(cfg *Config) { cfg.Workers = o.Workers }
