package istiodcert

import (
	"context"
	"crypto"
	"crypto/x509"
	"errors"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"

	"github.com/workload-ca/workload-ca/internal/rbac"
	"github.com/workload-ca/workload-ca/trust"
)

// Issuer issues the certificate: a TLS server certificate for dnsNames to
// pub, with the certificates above it up to (not including) the root.
type Issuer interface {
	IssueServing(ctx context.Context, pub crypto.PublicKey, dnsNames []string, ttl time.Duration) (*x509.Certificate, []*x509.Certificate, error)
	// SigningCert is the certificate the issuer signs with now; a Secret
	// holding a certificate it did not sign is reissued.
	SigningCert() *x509.Certificate
}

// DefaultTTL is the lifetime asked for by default; the CA clamps it to its
// maximum. istiod reloads the file when the kubelet updates the mounted
// Secret (within about a minute), long before two thirds of a day.
const DefaultTTL = 24 * time.Hour

// Config configures a Publisher. Client, Issuer, Namespace, TrustDomain
// and Roots are required; zero values of the other fields take the
// defaults.
type Config struct {
	Client kubernetes.Interface
	Issuer Issuer
	// Namespace is istiod's namespace, where the Secret is kept.
	Namespace string
	// SecretName is the Secret's name. Default DefaultSecretName.
	SecretName string
	// DNSNames are the certificate's names. Default DefaultDNSNames.
	DNSNames []string
	// TTL is the lifetime asked for. Default DefaultTTL.
	TTL time.Duration
	// Holding, if set, is told the end of the certificate the Secret holds
	// after each reconcile that leaves a usable one, for an alert before
	// istiod's serving certificate runs out.
	Holding func(notAfter time.Time)
	// Options are what every publisher has: TrustDomain labels the Secret,
	// Roots go to ca.crt, Observer is told every reconcile's result.
	trust.Options
}

// kind is how the Secret is named in logs.
var kind = trust.Kind{Name: "istiod serving certificate Secret", Key: "secret"}

// Publisher keeps istiod's serving certificate in its Secret.
type Publisher struct {
	cfg   Config
	opts  trust.Options
	shell *trust.Publisher
}

// New checks cfg and returns a Publisher; Run starts it.
func New(cfg Config) (*Publisher, error) {
	opts, err := cfg.WithDefaults()
	switch {
	case err != nil:
	case cfg.Client == nil:
		err = errors.New("missing Client")
	case cfg.Issuer == nil:
		err = errors.New("missing Issuer")
	case cfg.TTL < 0:
		err = fmt.Errorf("TTL %v is negative", cfg.TTL)
	default:
		err = CheckNames(cfg.Namespace, cfg.SecretName, cfg.DNSNames)
	}
	if err != nil {
		return nil, fmt.Errorf("istiodcert: %w", err)
	}
	if cfg.SecretName == "" {
		cfg.SecretName = DefaultSecretName
	}
	if len(cfg.DNSNames) == 0 {
		cfg.DNSNames = DefaultDNSNames(cfg.Namespace)
	}
	if cfg.TTL == 0 {
		cfg.TTL = DefaultTTL
	}
	if cfg.Holding == nil {
		cfg.Holding = func(time.Time) {}
	}
	return &Publisher{cfg: cfg, opts: opts, shell: trust.NewPublisher(kind, opts)}, nil
}

// DefaultDNSNames are the names of istiod's Service in namespace ns that
// ztunnel and istio-agent dial by default.
func DefaultDNSNames(ns string) []string { return []string{"istiod." + ns + ".svc"} }

// CheckNames checks what New checks of the names: a namespace, and a
// Secret name and DNS names if given (empty: the defaults).
func CheckNames(namespace, secret string, dnsNames []string) error {
	if err := checkName("namespace", namespace, validation.IsDNS1123Label); err != nil {
		return err
	}
	if secret != "" {
		if err := checkName("Secret name", secret, validation.IsDNS1123Subdomain); err != nil {
			return err
		}
	}
	for _, n := range dnsNames {
		if err := checkName("DNS name", n, validation.IsDNS1123Subdomain); err != nil {
			return err
		}
	}
	return nil
}

func checkName(what, v string, valid func(string) []string) error {
	if errs := valid(v); len(errs) > 0 {
		return fmt.Errorf("%s %q: %v", what, v, errs)
	}
	return nil
}

// Run keeps the Secret until ctx ends, then returns nil. It first checks
// permissions; it returns an error wrapping rbac.ErrPermissionDenied, or a
// review error, without retrying. After that, failed reconciles are
// logged, reported to the Observer and retried with backoff. Only the
// leader should run it; Run may be called again after it returns.
func (p *Publisher) Run(ctx context.Context) error {
	return p.shell.Run(ctx, func(ctx context.Context) (trust.Target, error) {
		if err := rbac.Check(ctx, p.cfg.Client, permissions(p.cfg.Namespace, p.cfg.SecretName)...); err != nil {
			return nil, fmt.Errorf("istiodcert: %w", err)
		}
		p.opts.Logger.InfoContext(ctx, "keeping istiod's serving certificate",
			"namespace", p.cfg.Namespace, "secret", p.cfg.SecretName, "dns_names", p.cfg.DNSNames)
		return newRun(p), nil
	})
}

// Trigger asks for a reconcile, e.g. after the CA's material changed. It
// does not block, and does nothing unless Run is running.
func (p *Publisher) Trigger() { p.shell.Trigger() }
