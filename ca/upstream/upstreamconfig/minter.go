package upstreamconfig

import (
	"crypto/x509"
	"log/slog"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"k8s.io/client-go/dynamic"

	"github.com/workload-ca/workload-ca/ca/upstream"
	"github.com/workload-ca/workload-ca/ca/upstream/certmanager"
	"github.com/workload-ca/workload-ca/ca/upstream/vault"
)

// Wiring is what the Minter takes besides the file: the client of
// cert-manager's CertificateRequests, the intermediates the CA wants, and
// where their outcome goes.
type Wiring struct {
	// Client writes cert-manager's CertificateRequests (a Vault upstream
	// needs none).
	Client      dynamic.Interface
	TrustDomain spiffeid.TrustDomain
	KeyType     string
	Lifetime    time.Duration
	// Current returns the anchors the CA trusts now (upstream.Config).
	Current  func() []*x509.Certificate
	Observer upstream.Observer
	Logger   *slog.Logger
}

// Minter returns the Minter of the configured upstream.
func (c *Config) Minter(w Wiring) (*upstream.Minter, error) {
	var auth upstream.Authority
	var err error
	if c.CertManager != nil {
		cc := *c.CertManager
		cc.Client, cc.Logger = w.Client, w.Logger.With("component", "upstream")
		auth, err = certmanager.New(cc)
	} else {
		auth, err = vault.New(*c.Vault)
	}
	if err != nil {
		return nil, err
	}
	return upstream.New(upstream.Config{Authority: auth, TrustDomain: w.TrustDomain, KeyType: w.KeyType,
		Lifetime: w.Lifetime, NameConstraints: c.NameConstraints, AnyPathLength: c.CertManager != nil, Timeout: c.Timeout,
		Observer: w.Observer, TrustAnchors: c.TrustAnchors, AllowAnchorChange: c.AllowAnchorChange, Current: w.Current,
		Logger: w.Logger.With("component", "upstream", "upstream", c.Describe())})
}
