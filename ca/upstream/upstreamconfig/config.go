package upstreamconfig

import (
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/workload-ca/workload-ca/ca/upstream"
	"github.com/workload-ca/workload-ca/ca/upstream/certmanager"
	"github.com/workload-ca/workload-ca/ca/upstream/vault"
)

// file is the YAML of --ca-upstream-config: the upstream CA that issues
// the CA's intermediates (exactly one kind), and how the CA treats it.
type file struct {
	// Vault is a Vault or OpenBao PKI secrets engine.
	Vault *vaultFile `json:"vault,omitempty"`
	// CertManager is a cert-manager Issuer or ClusterIssuer.
	CertManager *certManagerFile `json:"certManager,omitempty"`
	// NameConstraints asks the upstream to constrain each intermediate to
	// the trust domain's SPIFFE IDs (a URI name constraint).
	NameConstraints bool `json:"nameConstraints,omitempty"`
	// Timeout bounds each request to the upstream (default 1m).
	Timeout *metav1.Duration `json:"timeout,omitempty"`
	// ReadyMargin: a replica is not ready once the active intermediate
	// (or the upstream chain above it) has less than this left (default 1h).
	ReadyMargin *metav1.Duration `json:"readyMargin,omitempty"`
	// TrustAnchorFile is a PEM file of the anchors to pin (one or more CA
	// certificates): an answer must chain to one of them, and the pinned
	// one is the anchor the CA publishes.
	TrustAnchorFile string `json:"trustAnchorFile,omitempty"`
	// AllowAnchorChange, without TrustAnchorFile, adopts an answer under
	// an anchor other than the CA's current one; by default it is refused.
	AllowAnchorChange bool `json:"allowAnchorChange,omitempty"`
}

type vaultFile struct {
	Address    string            `json:"address"`
	CAFile     string            `json:"caFile,omitempty"`
	Namespace  string            `json:"namespace,omitempty"`
	Mount      string            `json:"mount,omitempty"`
	Issuer     string            `json:"issuer,omitempty"`
	TokenFile  string            `json:"tokenFile,omitempty"`
	Kubernetes *vaultK8sAuthFile `json:"kubernetes,omitempty"`
}

type vaultK8sAuthFile struct {
	Role      string `json:"role"`
	Mount     string `json:"mount,omitempty"`
	TokenFile string `json:"tokenFile,omitempty"`
}

type certManagerFile struct {
	IssuerRef struct {
		Name  string `json:"name"`
		Kind  string `json:"kind,omitempty"`
		Group string `json:"group,omitempty"`
	} `json:"issuerRef"`
	// Namespace of the CertificateRequests; default the CA Secret's.
	Namespace string `json:"namespace,omitempty"`
}

// Config is --ca-upstream-config, loaded and checked.
type Config struct {
	Vault *vault.Config
	// CertManager's Client is set when the Minter is built.
	CertManager     *certmanager.Config
	NameConstraints bool
	Timeout         time.Duration
	ReadyMargin     time.Duration
	// TrustAnchors are trustAnchorFile's certificates (none: not pinned).
	TrustAnchors      []*x509.Certificate
	AllowAnchorChange bool
}

// Load reads and checks the file at path; namespace is the CA Secret's,
// where CertificateRequests go by default. Every problem is reported.
func Load(path, namespace string) (*Config, error) {
	raw, err := os.ReadFile(filepath.Clean(path))
	if err != nil {
		return nil, err
	}
	var f file
	if err := yaml.UnmarshalStrict(raw, &f); err != nil {
		return nil, err
	}
	out := &Config{NameConstraints: f.NameConstraints, Timeout: time.Minute, ReadyMargin: time.Hour,
		AllowAnchorChange: f.AllowAnchorChange}
	if f.Timeout != nil {
		out.Timeout = f.Timeout.Duration
	}
	if f.ReadyMargin != nil {
		out.ReadyMargin = f.ReadyMargin.Duration
	}
	var errs []error
	if out.Timeout <= 0 || out.ReadyMargin < 0 {
		errs = append(errs, errors.New("timeout must be positive and readyMargin not negative"))
	}
	errs = append(errs, out.pin(f)...)
	errs = append(errs, out.upstream(f, namespace)...)
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return out, nil
}

// pin reads the anchors of trustAnchorFile, if any.
func (c *Config) pin(f file) []error {
	if f.TrustAnchorFile == "" {
		return nil
	}
	var errs []error
	anchors, err := loadTrustAnchors(f.TrustAnchorFile)
	if err != nil {
		errs = append(errs, err)
	}
	c.TrustAnchors = anchors
	if f.AllowAnchorChange {
		errs = append(errs, errors.New("allowAnchorChange with trustAnchorFile: the pinned anchors decide which changes are adopted; drop one"))
	}
	return errs
}

// upstream checks the one upstream the file names.
func (c *Config) upstream(f file, namespace string) []error {
	var errs []error
	switch v, cm := f.Vault, f.CertManager; {
	case (v == nil) == (cm == nil):
		errs = append(errs, errors.New("name exactly one upstream: vault or certManager"))
	case cm != nil:
		cc := certmanager.Config{Namespace: cm.Namespace, IssuerName: cm.IssuerRef.Name, IssuerKind: cm.IssuerRef.Kind,
			IssuerGroup: cm.IssuerRef.Group}
		if cc.Namespace == "" {
			cc.Namespace = namespace
		}
		cc, err := cc.WithDefaults()
		if err != nil {
			errs = append(errs, err)
		}
		c.CertManager = &cc
	default:
		vc := vault.Config{Address: v.Address, CAFile: v.CAFile, Namespace: v.Namespace, Mount: v.Mount,
			Issuer: v.Issuer, TokenFile: v.TokenFile}
		if vc.Mount == "" {
			vc.Mount = "pki"
		}
		if k := v.Kubernetes; k != nil {
			vc.KubernetesRole, vc.KubernetesMount, vc.KubernetesTokenFile = k.Role, k.Mount, k.TokenFile
			if k.Role == "" {
				errs = append(errs, errors.New("vault.kubernetes.role is required"))
			}
		}
		if _, err := vault.New(vc); err != nil {
			errs = append(errs, err)
		}
		c.Vault = &vc
	}
	return errs
}

// loadTrustAnchors reads trustAnchorFile: PEM CA certificates only.
func loadTrustAnchors(path string) ([]*x509.Certificate, error) {
	raw, err := os.ReadFile(filepath.Clean(path))
	if err != nil {
		return nil, fmt.Errorf("trustAnchorFile: %w", err)
	}
	certs, err := upstream.ParseCertificates(raw)
	if err != nil {
		return nil, fmt.Errorf("trustAnchorFile %s: %w", path, err)
	}
	for i, c := range certs {
		if !c.BasicConstraintsValid || !c.IsCA || c.KeyUsage&x509.KeyUsageCertSign == 0 {
			return nil, fmt.Errorf("trustAnchorFile %s: certificate %d (subject %q) is not a CA certificate allowed to sign certificates",
				path, i, c.Subject.String())
		}
	}
	return certs, nil
}

// Describe names the upstream in logs and in serve --validate.
func (c *Config) Describe() string {
	anchors := "anchor pinned by the CA Secret's state"
	switch {
	case len(c.TrustAnchors) > 0:
		anchors = fmt.Sprintf("%d pinned anchor(s)", len(c.TrustAnchors))
	case c.AllowAnchorChange:
		anchors = "anchor changes allowed"
	}
	if cm := c.CertManager; cm != nil {
		return fmt.Sprintf("cert-manager %s %s (CertificateRequests in %s; %s)", cm.IssuerKind, cm.IssuerName, cm.Namespace, anchors)
	}
	return fmt.Sprintf("Vault PKI %s/%s (%s)", c.Vault.Address, c.Vault.Mount, anchors)
}
