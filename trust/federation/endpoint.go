package federation

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/federation"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// ServerConfig configures the bundle endpoint server.
type ServerConfig struct {
	TrustDomain spiffeid.TrustDomain
	// Roots are our trust bundle now (the authority's roots: during a
	// rotation the next root too, before it signs).
	Roots       func() []*x509.Certificate
	RefreshHint time.Duration
	// Listener is where to serve, over TLS with GetCertificate.
	Listener       net.Listener
	GetCertificate func(*tls.ClientHelloInfo) (*tls.Certificate, error)
	Logger         *slog.Logger
}

// Server serves our bundle at a SPIFFE bundle endpoint, on every path.
type Server struct {
	cfg  ServerConfig
	http *http.Server
}

// NewServer returns the bundle endpoint server.
func NewServer(cfg ServerConfig) (*Server, error) {
	if cfg.Roots == nil || cfg.Listener == nil || cfg.GetCertificate == nil {
		return nil, errors.New("federation: the bundle endpoint needs roots, a listener and a certificate")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	h, err := federation.NewHandler(cfg.TrustDomain, BundleSource(cfg.TrustDomain, cfg.Roots, cfg.RefreshHint))
	if err != nil {
		return nil, err
	}
	return &Server{cfg: cfg, http: &http.Server{
		Handler:           h,
		TLSConfig:         &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: cfg.GetCertificate},
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      10 * time.Second,
		IdleTimeout:       time.Minute,
		MaxHeaderBytes:    16 << 10,
		ErrorLog:          slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelDebug),
	}}, nil
}

// Run serves until ctx ends.
func (s *Server) Run(ctx context.Context) error {
	errc := make(chan error, 1)
	go func() { errc <- s.http.ServeTLS(s.cfg.Listener, "", "") }()
	s.cfg.Logger.Info("serving the SPIFFE bundle endpoint", "addr", s.cfg.Listener.Addr().String(), "trust_domain", s.cfg.TrustDomain.String())
	select {
	case err := <-errc:
		return fmt.Errorf("federation: bundle endpoint: %w", err)
	case <-ctx.Done():
	}
	shut, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_ = s.http.Shutdown(shut)
	return nil
}

// BundleSource is our bundle as a spiffebundle.Source: the X.509
// authorities roots returns, refresh hint hint, and a sequence number
// that grows with every change a rotation makes (see Sequence).
func BundleSource(td spiffeid.TrustDomain, roots func() []*x509.Certificate, hint time.Duration) spiffebundle.Source {
	return bundleSource{td: td, roots: roots, hint: hint}
}

type bundleSource struct {
	td    spiffeid.TrustDomain
	roots func() []*x509.Certificate
	hint  time.Duration
}

func (s bundleSource) GetBundleForTrustDomain(td spiffeid.TrustDomain) (*spiffebundle.Bundle, error) {
	if td != s.td {
		return nil, fmt.Errorf("federation: not a bundle of trust domain %s", td)
	}
	roots := s.roots()
	b := spiffebundle.FromX509Authorities(td, roots)
	b.SetRefreshHint(s.hint)
	b.SetSequenceNumber(Sequence(roots))
	return b, nil
}

// Sequence is the spiffe_sequence of a bundle of roots, the same on every
// replica without any state: the newest root's NotBefore in seconds,
// times 8, plus 7 less the number of roots (at most 7). A rotation adds
// a newer root (the first term grows) and later removes the old one (the
// count falls, the second term grows), so each step raises it.
func Sequence(roots []*x509.Certificate) uint64 {
	var newest time.Time
	for _, r := range roots {
		if r.NotBefore.After(newest) {
			newest = r.NotBefore
		}
	}
	if newest.Unix() <= 0 {
		return 0
	}
	return uint64(newest.Unix())*8 + uint64(7-min(len(roots), 7))
}

// FileCertificate serves the certificate and key in certFile and keyFile
// (PEM), read again when either file changes (cert-manager and kubelet
// replace them in place), for tls.Config.GetCertificate.
type FileCertificate struct {
	certFile, keyFile string

	mu      sync.Mutex
	cert    *tls.Certificate
	modTime [2]time.Time
}

// NewFileCertificate reads the pair, so a bad pair fails at start.
func NewFileCertificate(certFile, keyFile string) (*FileCertificate, error) {
	f := &FileCertificate{certFile: filepath.Clean(certFile), keyFile: filepath.Clean(keyFile)}
	if _, err := f.GetCertificate(nil); err != nil {
		return nil, err
	}
	return f, nil
}

// GetCertificate returns the pair, re-read if a file changed; a pair that
// no longer loads keeps the last good one.
func (f *FileCertificate) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var mt [2]time.Time
	for i, p := range []string{f.certFile, f.keyFile} {
		if st, err := os.Stat(p); err == nil {
			mt[i] = st.ModTime()
		}
	}
	if f.cert != nil && mt == f.modTime {
		return f.cert, nil
	}
	c, err := tls.LoadX509KeyPair(f.certFile, f.keyFile)
	switch {
	case err != nil && f.cert == nil:
		return nil, fmt.Errorf("federation: endpoint certificate: %w", err)
	case err != nil:
		return f.cert, nil
	}
	f.cert, f.modTime = &c, mt
	return f.cert, nil
}
