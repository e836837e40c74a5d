package server

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"sync"
	"time"

	"k8s.io/utils/clock"
)

// ServingIssuer issues the TLS certificate of the CA's own endpoint. It
// returns the leaf and the certificates above it, up to (not including) the
// root.
type ServingIssuer interface {
	IssueServing(ctx context.Context, pub crypto.PublicKey, dnsNames []string, ttl time.Duration) (*x509.Certificate, []*x509.Certificate, error)
	// SigningCert is the certificate the issuer signs with now; when it
	// changes (rotation, reload) the serving certificate is renewed, so it
	// keeps chaining to roots clients still trust.
	SigningCert() *x509.Certificate
}

// ServingCertConfig configures the serving certificate.
type ServingCertConfig struct {
	Issuer   ServingIssuer
	DNSNames []string
	// TTL is the requested lifetime (default 24h). The certificate is renewed
	// once two thirds of its actual lifetime have passed.
	TTL time.Duration
	// RenewRetry is how long a failed renewal waits before the next try
	// (default 5s); handshakes meanwhile get the current certificate, or
	// the renewal's error once it has expired.
	RenewRetry time.Duration
	Clock      clock.PassiveClock
}

// ServingCert keeps a TLS serving certificate issued by our CA and renews it
// on the first handshake after renewal is due: two thirds into its life, or
// as soon as the CA signs with another certificate.
type ServingCert struct {
	cfg ServingCertConfig

	mu       sync.Mutex
	cert     *tls.Certificate
	renewAt  time.Time
	issuedBy *x509.Certificate
	// retryAt is when a failed renewal may be tried again, and renewErr
	// why it failed.
	retryAt  time.Time
	renewErr error
}

// NewServingCert issues the first certificate, so a misconfigured CA fails
// at start-up rather than on the first handshake.
func NewServingCert(ctx context.Context, cfg ServingCertConfig) (*ServingCert, error) {
	if cfg.Issuer == nil || len(cfg.DNSNames) == 0 {
		return nil, errors.New("serving certificate: issuer and DNS names are required")
	}
	if cfg.TTL <= 0 {
		cfg.TTL = 24 * time.Hour
	}
	if cfg.RenewRetry <= 0 {
		cfg.RenewRetry = 5 * time.Second
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	s := &ServingCert{cfg: cfg}
	if err := s.renew(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

// GetCertificate is tls.Config.GetCertificate. A renewal that fails is
// retried after RenewRetry, not on every handshake: the issuer may be a
// slow KMS, and the renewal holds the lock every handshake takes.
func (s *ServingCert) GetCertificate(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.cfg.Clock.Now()
	due := !now.Before(s.renewAt) || s.cfg.Issuer.SigningCert() != s.issuedBy
	if due && !now.Before(s.retryAt) {
		ctx := context.Background()
		if hello != nil {
			ctx = hello.Context()
		}
		s.renewErr = s.renew(ctx)
		if s.renewErr != nil {
			s.retryAt = s.cfg.Clock.Now().Add(s.cfg.RenewRetry)
		}
	}
	if due && s.renewErr != nil && !now.Before(s.cert.Leaf.NotAfter) {
		// Keep serving the old certificate while it is valid.
		return nil, s.renewErr
	}
	return s.cert, nil
}

// Current returns the certificate now served.
func (s *ServingCert) Current() *tls.Certificate {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cert
}

// renew issues a new certificate with a new key. Callers hold mu or own s.
func (s *ServingCert) renew(ctx context.Context) error {
	issuedBy := s.cfg.Issuer.SigningCert()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("serving certificate key: %w", err)
	}
	leaf, chain, err := s.cfg.Issuer.IssueServing(ctx, key.Public(), s.cfg.DNSNames, s.cfg.TTL)
	if err != nil {
		return fmt.Errorf("serving certificate: %w", err)
	}
	cert := &tls.Certificate{Certificate: [][]byte{leaf.Raw}, PrivateKey: key, Leaf: leaf}
	for _, c := range chain {
		cert.Certificate = append(cert.Certificate, c.Raw)
	}
	s.cert, s.issuedBy = cert, issuedBy
	s.renewAt = leaf.NotBefore.Add(leaf.NotAfter.Sub(leaf.NotBefore) * 2 / 3)
	return nil
}
