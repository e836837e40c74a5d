package federation

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"
)

// Bounds of one fetch from a bundle endpoint.
const (
	// MaxBundleBytes caps a bundle endpoint's body. A JWKS entry of a
	// root is ~1 KiB for P-256 and ~3.5 KiB for RSA-4096 (x5c plus the
	// modulus); MaxMaxRoots (64) RSA-4096 roots and as many JWT keys
	// come to ~300 KiB, real bundles (SPIRE, workload-ca) to a few KiB.
	MaxBundleBytes = 512 << 10
	// maxHeaderBytes caps the response headers.
	maxHeaderBytes = 64 << 10
	// maxStepTimeout bounds the dial, the TLS handshake and the wait for
	// the response headers, each within the fetch timeout.
	maxStepTimeout = 5 * time.Second
)

// errRedirect refuses a redirect: a bundle endpoint is where it is
// configured, not where it points.
var errRedirect = errors.New("redirects are not followed")

// fetcher fetches one peer's bundle from its endpoint over https, within
// bounds: no proxy, no redirect, a timeout for each step and one for the
// whole fetch, and MaxBundleBytes of body.
type fetcher struct {
	td       spiffeid.TrustDomain
	url      string
	timeout  time.Duration
	maxBytes int64
	client   *http.Client
}

// newFetcher returns p's fetcher. With https_spiffe the endpoint's SVID
// is verified with the bundle source holds when the handshake runs.
func newFetcher(p Peer, source x509bundle.Source, maxBytes int64) (*fetcher, error) {
	if u, err := url.Parse(p.URL); err != nil || u.Scheme != "https" || u.Host == "" {
		return nil, fmt.Errorf("url %q: want an https:// URL", p.URL)
	}
	var tc *tls.Config
	switch p.Profile {
	case ProfileSPIFFE:
		tc = tlsconfig.TLSClientConfig(source, tlsconfig.AuthorizeID(p.EndpointSPIFFEID))
	case ProfileWeb:
		var pool *x509.CertPool // nil: the system's roots
		if p.WebRootsFile != "" {
			var err error
			if pool, err = readPool(p.WebRootsFile); err != nil {
				return nil, fmt.Errorf("webRootsFile: %w", err)
			}
		}
		tc = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	default:
		return nil, fmt.Errorf("profile %q, want https_web or https_spiffe", p.Profile)
	}
	step := min(maxStepTimeout, p.FetchTimeout)
	dialer := &net.Dialer{Timeout: step, KeepAlive: -1}
	return &fetcher{td: p.TrustDomain, url: p.URL, timeout: p.FetchTimeout, maxBytes: maxBytes, client: &http.Client{
		Transport: &http.Transport{
			Proxy:                  nil, // never from the environment
			DialContext:            dialer.DialContext,
			TLSClientConfig:        tc,
			TLSHandshakeTimeout:    step,
			ResponseHeaderTimeout:  step,
			MaxResponseHeaderBytes: maxHeaderBytes,
			DisableKeepAlives:      true, // a fetch every few minutes: nothing to reuse
			DisableCompression:     true,
		},
		CheckRedirect: func(req *http.Request, _ []*http.Request) error {
			return fmt.Errorf("%w (to %s)", errRedirect, req.URL.Redacted())
		},
	}}, nil
}

// fetch GETs the bundle; it is parsed, not checked (CheckBundle).
func (f *fetcher) fetch(ctx context.Context) (*spiffebundle.Bundle, error) {
	ctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, f.url, http.NoBody)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/json")
	resp, err := f.client.Do(req)
	if err != nil {
		return nil, err // a *url.Error, which names the URL
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s, want 200 OK", f.url, resp.Status)
	}
	if resp.ContentLength > f.maxBytes {
		return nil, fmt.Errorf("%w: GET %s: %d bytes, at most %d", ErrBundleRefused, f.url, resp.ContentLength, f.maxBytes)
	}
	raw, err := io.ReadAll(io.LimitReader(resp.Body, f.maxBytes+1))
	if err != nil {
		return nil, fmt.Errorf("GET %s: reading the body: %w", f.url, err)
	}
	if int64(len(raw)) > f.maxBytes {
		return nil, fmt.Errorf("%w: GET %s: over %d bytes", ErrBundleRefused, f.url, f.maxBytes)
	}
	return ParseBundle(f.td, raw)
}
