package federation

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"golang.org/x/sync/errgroup"
	"k8s.io/utils/clock"
)

// Retry bounds of a failing refresh: the first retry after minRetry,
// doubling to the peer's refresh interval.
const minRetry = time.Second

// ImporterConfig configures an Importer.
type ImporterConfig struct {
	Peers []Peer
	// ZtunnelRoots receives the roots of every peer with Ztunnel set,
	// each time one of them changes (and once all were first read).
	ZtunnelRoots func([]*x509.Certificate)
	// OnChange is called with a trust domain whose bundle changed.
	OnChange func(spiffeid.TrustDomain)
	// ClusterTrustBundles returns the roots of the ClusterTrustBundles
	// sel selects; required when a peer has FromBundles.
	ClusterTrustBundles func(ctx context.Context, sel BundleSelectorFile) ([]*x509.Certificate, error)
	// OwnRoots are our own roots now: a peer bundle holding one of them
	// is refused.
	OwnRoots func() []*x509.Certificate
	Clock    clock.WithTicker
	Logger   *slog.Logger
}

// PeerState is what the importer holds of one trust domain, for metrics.
type PeerState struct {
	TrustDomain string
	// Roots is the number of X.509 authorities in the bundle held.
	Roots int
	// LastSuccess is when the bundle held was last read or confirmed
	// (zero: never); FetchErrors counts failed refreshes.
	LastSuccess time.Time
	FetchErrors uint64
}

// Importer keeps the bundles of the trust domains we federate with.
type Importer struct {
	cfg   ImporterConfig
	peers []*peer
	// notify orders the ZtunnelRoots calls.
	notify sync.Mutex
}

// peer is one trust domain's bundle and its refreshes.
type peer struct {
	cfg Peer

	mu          sync.Mutex
	bundle      *spiffebundle.Bundle // last good, nil: none yet
	lastSuccess time.Time
	fetchErrors uint64
	failing     bool          // the last refresh failed
	retry       time.Duration // the last back-off, 0 after a success
}

// NewImporter reads the bundle file of every peer that has one (the
// bootstrap bundle of an https_spiffe endpoint, or the bundle itself):
// a file that cannot be read, or that CheckBundle refuses, is an error at
// start.
func NewImporter(cfg ImporterConfig) (*Importer, error) {
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	im := &Importer{cfg: cfg}
	var errs []error
	for _, p := range cfg.Peers {
		if p.MaxRoots == 0 {
			p.MaxRoots = DefaultMaxRoots
		}
		if p.FetchTimeout == 0 {
			p.FetchTimeout = DefaultFetchTimeout
		}
		pr := &peer{cfg: p}
		if p.FromBundles != nil && cfg.ClusterTrustBundles == nil {
			errs = append(errs, fmt.Errorf("trust domain %s: fromClusterTrustBundles needs a Kubernetes client", p.TrustDomain))
		}
		if p.BundleFile != "" {
			b, err := ReadBundleFile(p.TrustDomain, p.BundleFile)
			if err == nil {
				b, err = im.check(pr, b)
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("trust domain %s: %w", p.TrustDomain, err))
				continue
			}
			pr.bundle = b
			if p.URL == "" {
				pr.lastSuccess = cfg.Clock.Now()
			}
		}
		im.peers = append(im.peers, pr)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	im.publish()
	return im, nil
}

// Run refreshes every peer until ctx ends.
func (im *Importer) Run(ctx context.Context) error {
	g, ctx := errgroup.WithContext(ctx)
	for _, p := range im.peers {
		g.Go(func() error {
			if p.cfg.URL == "" {
				im.poll(ctx, p)
				return nil
			}
			return im.watchEndpoint(ctx, p)
		})
	}
	return g.Wait()
}

// watchEndpoint refreshes p from its bundle endpoint: at the refresh
// hint, at most every RefreshInterval, and after a failure with a
// back-off from a second up to RefreshInterval.
func (im *Importer) watchEndpoint(ctx context.Context, p *peer) error {
	// With https_spiffe the endpoint is authenticated with the bundle
	// held when the handshake runs: the bootstrap bundle first, then each
	// one fetched.
	f, err := newFetcher(p.cfg, p, MaxBundleBytes)
	if err != nil {
		return fmt.Errorf("trust domain %s: %w", p.cfg.TrustDomain, err)
	}
	for {
		wait := im.refresh(ctx, p, f)
		if ctx.Err() != nil {
			return nil
		}
		t := im.cfg.Clock.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C():
		}
	}
}

// refresh fetches p's bundle once and says when to fetch it next.
func (im *Importer) refresh(ctx context.Context, p *peer, f *fetcher) time.Duration {
	b, err := f.fetch(ctx)
	if err == nil {
		b, err = im.check(p, b)
	}
	if err != nil {
		if ctx.Err() != nil {
			return 0
		}
		im.failed(p, err)
		return p.backoff()
	}
	im.received(p, b)
	hint, _ := b.RefreshHint()
	return p.nextRefresh(hint)
}

// poll re-reads p's bundle file, or its ClusterTrustBundles (at once,
// then), every RefreshInterval.
func (im *Importer) poll(ctx context.Context, p *peer) {
	t := im.cfg.Clock.NewTicker(p.cfg.RefreshInterval)
	defer t.Stop()
	for first := p.cfg.FromBundles != nil; ; first = false {
		if !first {
			select {
			case <-ctx.Done():
				return
			case <-t.C():
			}
		}
		b, err := im.read(ctx, p)
		if err == nil {
			b, err = im.check(p, b)
		}
		if err != nil {
			im.failed(p, err)
			continue
		}
		im.received(p, b)
	}
}

// read reads p's bundle from its file or its ClusterTrustBundles.
func (im *Importer) read(ctx context.Context, p *peer) (*spiffebundle.Bundle, error) {
	sel := p.cfg.FromBundles
	if sel == nil {
		return ReadBundleFile(p.cfg.TrustDomain, p.cfg.BundleFile)
	}
	roots, err := im.cfg.ClusterTrustBundles(ctx, *sel)
	if err != nil {
		return nil, err
	}
	if len(roots) == 0 {
		return nil, fmt.Errorf("no ClusterTrustBundle of signer %s with labels %v holds a root", sel.SignerName, sel.MatchLabels)
	}
	return spiffebundle.FromX509Authorities(p.cfg.TrustDomain, roots), nil
}

// check is CheckBundle for p now, against our roots now.
func (im *Importer) check(p *peer, b *spiffebundle.Bundle) (*spiffebundle.Bundle, error) {
	var own []*x509.Certificate
	if im.cfg.OwnRoots != nil {
		own = im.cfg.OwnRoots()
	}
	return CheckBundle(b, im.cfg.Clock.Now(), p.cfg.MaxRoots, own)
}

// backoff is the wait after a failed refresh: a second, doubling up to
// the refresh interval.
func (p *peer) backoff() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.retry = min(max(2*p.retry, minRetry), p.cfg.RefreshInterval)
	return p.retry
}

// nextRefresh is the wait after a good refresh: the bundle's refresh hint
// (0: none) bounded by a second and the refresh interval.
func (p *peer) nextRefresh(hint time.Duration) time.Duration {
	if hint <= 0 || hint > p.cfg.RefreshInterval {
		return p.cfg.RefreshInterval
	}
	return max(hint, minRetry)
}

// received holds b, the bundle just read for p.
func (im *Importer) received(p *peer, b *spiffebundle.Bundle) {
	p.mu.Lock()
	changed := p.bundle == nil || !p.bundle.Equal(b)
	recovered := p.failing
	p.bundle, p.failing, p.retry, p.lastSuccess = b, false, 0, im.cfg.Clock.Now()
	p.mu.Unlock()
	if recovered {
		im.cfg.Logger.Info("federated bundle refreshed after failures", "trust_domain", p.cfg.TrustDomain.String())
	}
	if changed {
		seq, _ := b.SequenceNumber()
		im.cfg.Logger.Info("federated bundle changed", "trust_domain", p.cfg.TrustDomain.String(),
			"x509_authorities", len(b.X509Authorities()), "sequence", seq)
		if p.cfg.Ztunnel {
			im.publish()
		}
		if im.cfg.OnChange != nil {
			im.cfg.OnChange(p.cfg.TrustDomain)
		}
	}
}

// failed counts a failed refresh of p; the bundle held stays.
func (im *Importer) failed(p *peer, err error) {
	p.mu.Lock()
	p.fetchErrors++
	first := !p.failing
	p.failing = true
	held := p.bundle != nil
	p.mu.Unlock()
	if first {
		im.cfg.Logger.Error("federated bundle refresh failed; the last bundle is kept", "trust_domain", p.cfg.TrustDomain.String(),
			"url", p.cfg.URL, "file", p.cfg.BundleFile, "bundle_held", held, "error", err.Error())
	}
}

// publish sends the roots of the ztunnel peers to ZtunnelRoots.
func (im *Importer) publish() {
	if im.cfg.ZtunnelRoots == nil {
		return
	}
	im.notify.Lock()
	defer im.notify.Unlock()
	im.cfg.ZtunnelRoots(im.ZtunnelRoots())
}

// ZtunnelRoots returns the roots held of every peer with Ztunnel set.
func (im *Importer) ZtunnelRoots() []*x509.Certificate {
	return im.RootsOf(func(p Peer) bool { return p.Ztunnel })
}

// RootsOf returns the roots held of every peer for which keep is true, in
// configuration order.
func (im *Importer) RootsOf(keep func(Peer) bool) []*x509.Certificate {
	var out []*x509.Certificate
	for _, p := range im.peers {
		if !keep(p.cfg) {
			continue
		}
		if b := p.current(); b != nil {
			out = append(out, b.X509Authorities()...)
		}
	}
	return out
}

// Roots returns the X.509 authorities held of td (nil: none).
func (im *Importer) Roots(td spiffeid.TrustDomain) []*x509.Certificate {
	if b, ok := im.Bundle(td); ok {
		return b.X509Authorities()
	}
	return nil
}

// Bundle returns the bundle held of td.
func (im *Importer) Bundle(td spiffeid.TrustDomain) (*spiffebundle.Bundle, bool) {
	for _, p := range im.peers {
		if p.cfg.TrustDomain == td {
			b := p.current()
			return b, b != nil
		}
	}
	return nil, false
}

// States reports every peer, in configuration order.
func (im *Importer) States() []PeerState {
	out := make([]PeerState, 0, len(im.peers))
	for _, p := range im.peers {
		p.mu.Lock()
		s := PeerState{TrustDomain: p.cfg.TrustDomain.String(), LastSuccess: p.lastSuccess, FetchErrors: p.fetchErrors}
		if p.bundle != nil {
			s.Roots = len(p.bundle.X509Authorities())
		}
		p.mu.Unlock()
		out = append(out, s)
	}
	return out
}

func (p *peer) current() *spiffebundle.Bundle {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.bundle
}

// GetX509BundleForTrustDomain is x509bundle.Source, for authenticating
// p's https_spiffe endpoint with the bundle held.
func (p *peer) GetX509BundleForTrustDomain(td spiffeid.TrustDomain) (*x509bundle.Bundle, error) {
	b := p.current()
	if b == nil || td != p.cfg.TrustDomain {
		return nil, fmt.Errorf("federation: no bundle of trust domain %s", td)
	}
	return b.GetX509BundleForTrustDomain(td)
}

// ReadBundleFile reads a bundle of td from path: a SPIFFE bundle (JWKS),
// or PEM certificates as its X.509 authorities.
func ReadBundleFile(td spiffeid.TrustDomain, path string) (*spiffebundle.Bundle, error) {
	raw, err := os.ReadFile(filepath.Clean(path))
	if err != nil {
		return nil, err
	}
	if b, err := spiffebundle.Parse(td, raw); err == nil {
		return b, nil
	}
	xb, err := x509bundle.Parse(td, raw)
	if err != nil {
		return nil, fmt.Errorf("%s: neither a SPIFFE bundle nor PEM certificates: %w", path, err)
	}
	if len(xb.X509Authorities()) == 0 {
		return nil, fmt.Errorf("%s: no certificates", path)
	}
	return spiffebundle.FromX509Bundle(xb), nil
}

func readPool(path string) (*x509.CertPool, error) {
	raw, err := os.ReadFile(filepath.Clean(path))
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(raw) {
		return nil, fmt.Errorf("%s: no PEM certificates", path)
	}
	return pool, nil
}
