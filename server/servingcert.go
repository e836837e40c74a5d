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
	"log/slog"
	"sync"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
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

// SVIDIssuer issues X.509-SVIDs for the CA's own endpoints; a serving
// certificate with a SPIFFEID needs its issuer to be one.
type SVIDIssuer interface {
	IssueServingSVID(ctx context.Context, pub crypto.PublicKey, id spiffeid.ID, ttl time.Duration) (*x509.Certificate, []*x509.Certificate, error)
}

// ServingCertConfig configures the serving certificate.
type ServingCertConfig struct {
	Issuer ServingIssuer
	// DNSNames are the names of the certificate; or, with SPIFFEID set
	// instead, it is that identity's X.509-SVID.
	DNSNames []string
	SPIFFEID spiffeid.ID
	// TTL is the requested lifetime (default 24h). The certificate is renewed
	// once two thirds of its actual lifetime have passed.
	TTL time.Duration
	// RenewRetry is how long a failed renewal waits before the next try
	// (default 5s); handshakes meanwhile get the current certificate, or
	// the renewal's error once it has expired.
	RenewRetry time.Duration
	Clock      clock.PassiveClock
	// Logger receives a failed renewal (once per distinct error, while it
	// keeps failing) and the renewal that ends the failures. Default:
	// discarded.
	Logger *slog.Logger
}

// ServingCert keeps a TLS serving certificate issued by our CA. Two thirds
// into its life it is renewed in the background while it keeps serving;
// when the CA starts signing with another certificate, or it has expired,
// the next handshake renews it first.
type ServingCert struct {
	cfg ServingCertConfig

	mu       sync.Mutex
	cert     *tls.Certificate
	renewAt  time.Time
	issuedBy *x509.Certificate
	renewing bool // a background renewal runs
	// retryAt is when a failed renewal may be tried again, and renewErr
	// why it failed.
	retryAt  time.Time
	renewErr error
}

// NewServingCert issues the first certificate, so a misconfigured CA fails
// at start-up rather than on the first handshake.
func NewServingCert(ctx context.Context, cfg ServingCertConfig) (*ServingCert, error) {
	if cfg.Issuer == nil || len(cfg.DNSNames) == 0 == cfg.SPIFFEID.IsZero() {
		return nil, errors.New("serving certificate: an issuer, and DNS names or a SPIFFE ID, are required")
	}
	if _, ok := cfg.Issuer.(SVIDIssuer); !cfg.SPIFFEID.IsZero() && !ok {
		return nil, errors.New("serving certificate: the issuer cannot issue SVIDs")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
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
	cert, issuedBy, err := s.issue(ctx)
	if err != nil {
		return nil, err
	}
	s.install(cert, issuedBy)
	return s, nil
}

// renewTimeout bounds one renewal: the issuer may be a KMS or an HSM.
const renewTimeout = 30 * time.Second

// GetCertificate is tls.Config.GetCertificate. A renewal that fails is
// retried after RenewRetry, not on every handshake. Only a renewal that
// cannot wait (the CA signs with another certificate, or the current one
// has expired) runs in the handshake, under the lock every handshake
// takes; it does not use the handshake's context, so a client that hangs
// up does not fail it.
func (s *ServingCert) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.cfg.Clock.Now()
	retry := !now.Before(s.retryAt)
	switch {
	case (s.cfg.Issuer.SigningCert() != s.issuedBy || !now.Before(s.cert.Leaf.NotAfter)) && retry:
		ctx, cancel := context.WithTimeout(context.Background(), renewTimeout)
		defer cancel()
		cert, issuedBy, err := s.issue(ctx)
		s.done(cert, issuedBy, err)
	case !now.Before(s.renewAt) && retry && !s.renewing:
		s.renewing = true
		go s.renewInBackground()
	}
	if !now.Before(s.cert.Leaf.NotAfter) && s.renewErr != nil {
		return nil, s.renewErr
	}
	return s.cert, nil
}

func (s *ServingCert) renewInBackground() {
	ctx, cancel := context.WithTimeout(context.Background(), renewTimeout)
	defer cancel()
	cert, issuedBy, err := s.issue(ctx)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.renewing = false
	s.done(cert, issuedBy, err)
}

// done records a renewal's outcome. Callers hold mu.
func (s *ServingCert) done(cert *tls.Certificate, issuedBy *x509.Certificate, err error) {
	if err != nil {
		if s.renewErr == nil || s.renewErr.Error() != err.Error() {
			// The current certificate serves until current_not_after;
			// after it handshakes fail with this error.
			s.cfg.Logger.Error("serving certificate renewal failed",
				"error", err.Error(), "current_not_after", s.cert.Leaf.NotAfter, "retry_every", s.cfg.RenewRetry)
		}
		s.renewErr, s.retryAt = err, s.cfg.Clock.Now().Add(s.cfg.RenewRetry)
		return
	}
	current := s.cfg.Issuer.SigningCert()
	switch {
	case issuedBy != current:
		// Issued under a signing certificate the CA has left since: the
		// next handshake renews again.
	case s.issuedBy != current || !cert.Leaf.NotAfter.Before(s.cert.Leaf.NotAfter):
		// Also when it ends no later than the current one: both end
		// with the signing certificate, and the new one's later start
		// moves the next renewal on.
		s.install(cert, issuedBy)
		if s.renewErr != nil {
			s.cfg.Logger.Info("serving certificate renewed after failures", "not_after", cert.Leaf.NotAfter)
		}
		s.renewErr = nil
	default:
		s.retryAt = s.cfg.Clock.Now().Add(s.cfg.RenewRetry)
	}
}

// Current returns the certificate now served.
func (s *ServingCert) Current() *tls.Certificate {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cert
}

// issue issues a new certificate with a new key, and returns it with the
// signing certificate it was issued under.
func (s *ServingCert) issue(ctx context.Context) (*tls.Certificate, *x509.Certificate, error) {
	issuedBy := s.cfg.Issuer.SigningCert()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("serving certificate key: %w", err)
	}
	var leaf *x509.Certificate
	var chain []*x509.Certificate
	if s.cfg.SPIFFEID.IsZero() {
		leaf, chain, err = s.cfg.Issuer.IssueServing(ctx, key.Public(), s.cfg.DNSNames, s.cfg.TTL)
	} else {
		leaf, chain, err = s.cfg.Issuer.(SVIDIssuer).IssueServingSVID(ctx, key.Public(), s.cfg.SPIFFEID, s.cfg.TTL)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("serving certificate: %w", err)
	}
	cert := &tls.Certificate{Certificate: [][]byte{leaf.Raw}, PrivateKey: key, Leaf: leaf}
	for _, c := range chain {
		cert.Certificate = append(cert.Certificate, c.Raw)
	}
	return cert, issuedBy, nil
}

// install serves cert from now on. Callers hold mu or own s.
func (s *ServingCert) install(cert *tls.Certificate, issuedBy *x509.Certificate) {
	s.cert, s.issuedBy = cert, issuedBy
	s.renewAt = cert.Leaf.NotBefore.Add(cert.Leaf.NotAfter.Sub(cert.Leaf.NotBefore) * 2 / 3)
}
