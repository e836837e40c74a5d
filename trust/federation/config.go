package federation

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// The bundle endpoint profiles of the SPIFFE Trust Domain and Bundle
// specification.
const (
	ProfileWeb    = "https_web"
	ProfileSPIFFE = "https_spiffe"
)

// Defaults of the configuration file.
const (
	DefaultRefreshHint     = 5 * time.Minute
	DefaultRefreshInterval = 5 * time.Minute
	// DefaultEndpointPath is the last segment of the endpoint's SPIFFE ID
	// under spiffe://<trust domain>/workload-ca/.
	DefaultEndpointPath = "bundle-endpoint"
	// DefaultMaxRoots bounds the X.509 authorities of one peer's bundle:
	// a trust domain holds one root, two during a rotation, a few more
	// with several upstream CAs; 16 leaves room for that and keeps a
	// hostile peer's share of every ztunnel answer under ~16 KiB of
	// P-256 roots (~48 KiB of RSA-4096).
	DefaultMaxRoots = 16
	// MaxMaxRoots is the most maxRoots may be set to.
	MaxMaxRoots = 64
	// DefaultFetchTimeout bounds one fetch from a bundle endpoint, from
	// the dial to the last byte: a bundle is a few KiB.
	DefaultFetchTimeout = 10 * time.Second
)

// File is the configuration file as written.
type File struct {
	// Endpoint serves our bundle; nil: not served.
	Endpoint *EndpointFile `json:"endpoint,omitempty"`
	// TrustDomains are the trust domains we import bundles of.
	TrustDomains []PeerFile `json:"trustDomains,omitempty"`
}

// EndpointFile is the bundle endpoint we serve.
type EndpointFile struct {
	// Address is host:port to listen on.
	Address string `json:"address"`
	// Profile is https_web (CertFile and KeyFile, e.g. from cert-manager or
	// a public CA) or https_spiffe (our own SVID, SPIFFEID).
	Profile  string `json:"profile"`
	CertFile string `json:"certFile,omitempty"`
	KeyFile  string `json:"keyFile,omitempty"`
	// SPIFFEID is the endpoint's SVID's ID with https_spiffe (default
	// spiffe://<trust domain>/workload-ca/bundle-endpoint).
	SPIFFEID string `json:"spiffeID,omitempty"`
	// RefreshHint is the spiffe_refresh_hint we serve (default 5m).
	RefreshHint *metav1.Duration `json:"refreshHint,omitempty"`
}

// PeerFile is one trust domain we import.
type PeerFile struct {
	TrustDomain string `json:"trustDomain"`
	// URL is the trust domain's bundle endpoint (https); empty: the
	// bundle is BundleFile alone, re-read every RefreshInterval.
	URL string `json:"url,omitempty"`
	// Profile is the endpoint's profile: https_web (verified with
	// WebRootsFile, or the system's roots) or https_spiffe (its SVID
	// EndpointSPIFFEID, verified with the trust domain's current bundle,
	// which BundleFile bootstraps).
	Profile          string `json:"profile,omitempty"`
	EndpointSPIFFEID string `json:"endpointSPIFFEID,omitempty"`
	WebRootsFile     string `json:"webRootsFile,omitempty"`
	// BundleFile is a SPIFFE bundle (JWKS) or PEM roots of the trust
	// domain.
	BundleFile string `json:"bundleFile,omitempty"`
	// FromClusterTrustBundles takes the trust domain's roots from the
	// ClusterTrustBundles of another signer in our cluster (another CA's
	// publisher, cert-manager's trust-manager, ...), re-read every
	// RefreshInterval: instead of url and bundleFile.
	FromClusterTrustBundles *BundleSelectorFile `json:"fromClusterTrustBundles,omitempty"`
	// RefreshInterval is how often to refresh when the bundle carries no
	// refresh hint, and the longest wait when it does (default 5m).
	RefreshInterval *metav1.Duration `json:"refreshInterval,omitempty"`
	// MaxRoots is the most X.509 authorities a bundle of the trust
	// domain may hold (default 16, at most 64); a bundle with more is
	// refused and the last good one kept.
	MaxRoots *int `json:"maxRoots,omitempty"`
	// FetchTimeout bounds one fetch from the bundle endpoint, connect to
	// last byte (default 10s).
	FetchTimeout *metav1.Duration `json:"fetchTimeout,omitempty"`
	// Ztunnel appends the trust domain's roots to the root element of
	// every answer this CA gives its ztunnels (see docs/federation.md
	// for what that trusts).
	Ztunnel bool `json:"ztunnel,omitempty"`
	// ClusterTrustBundle publishes the trust domain's roots as
	// ClusterTrustBundles of our signer labelled with it, for pods to
	// mount (the leader publishes, as it does our own).
	ClusterTrustBundle bool `json:"clusterTrustBundle,omitempty"`
	// IstioRootConfigMap adds the trust domain's roots to Istio's
	// istio-ca-root-cert ConfigMaps (with --istio-root-configmap), after
	// ours: what istio-agent sidecars verify peers with.
	IstioRootConfigMap bool `json:"istioRootConfigMap,omitempty"`
}

// BundleSelectorFile selects ClusterTrustBundles: those of SignerName
// with every label of MatchLabels.
type BundleSelectorFile struct {
	SignerName  string            `json:"signerName"`
	MatchLabels map[string]string `json:"matchLabels,omitempty"`
}

// Config is a checked configuration.
type Config struct {
	Endpoint *Endpoint
	Peers    []Peer
}

// Endpoint is the checked EndpointFile.
type Endpoint struct {
	Address           string
	Profile           string
	CertFile, KeyFile string
	SPIFFEID          spiffeid.ID
	RefreshHint       time.Duration
}

// Peer is the checked PeerFile.
type Peer struct {
	TrustDomain      spiffeid.TrustDomain
	URL              string
	Profile          string
	EndpointSPIFFEID spiffeid.ID
	WebRootsFile     string
	BundleFile       string
	// FromBundles, when set, is the ClusterTrustBundles the roots are
	// read from.
	FromBundles        *BundleSelectorFile
	RefreshInterval    time.Duration
	MaxRoots           int
	FetchTimeout       time.Duration
	Ztunnel            bool
	ClusterTrustBundle bool
	IstioRootConfigMap bool
}

// Load reads and checks the configuration file at path for a CA of trust
// domain own: every problem is reported, with the field it is in.
func Load(path string, own spiffeid.TrustDomain) (*Config, error) {
	raw, err := os.ReadFile(filepath.Clean(path))
	if err != nil {
		return nil, err
	}
	var f File
	if err := yaml.UnmarshalStrict(raw, &f); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	c, err := f.Check(own)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	// The files it names, read now so that a mistyped path fails the
	// configuration check rather than the start.
	var errs []error
	for _, p := range c.Peers {
		if p.BundleFile != "" {
			b, err := ReadBundleFile(p.TrustDomain, p.BundleFile)
			if err == nil {
				_, err = CheckBundle(b, time.Now(), p.MaxRoots, nil)
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("trust domain %s: bundleFile: %w", p.TrustDomain, err))
			}
		}
		if p.WebRootsFile != "" {
			if _, err := readPool(p.WebRootsFile); err != nil {
				errs = append(errs, fmt.Errorf("trust domain %s: webRootsFile: %w", p.TrustDomain, err))
			}
		}
	}
	if e := c.Endpoint; e != nil && e.Profile == ProfileWeb {
		if _, err := NewFileCertificate(e.CertFile, e.KeyFile); err != nil {
			errs = append(errs, fmt.Errorf("endpoint: %w", err))
		}
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("%s: %w", path, errors.Join(errs...))
	}
	return c, nil
}

// Check checks f for a CA of trust domain own.
func (f *File) Check(own spiffeid.TrustDomain) (*Config, error) {
	c := &Config{}
	var errs []error
	if e := f.Endpoint; e != nil {
		c.Endpoint, errs = e.check(own)
	}
	peers, perrs := checkPeers(f.TrustDomains, own)
	c.Peers, errs = peers, append(errs, perrs...)
	if c.Endpoint == nil && len(c.Peers) == 0 {
		errs = append(errs, errors.New("neither an endpoint nor a trust domain to import"))
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return c, nil
}

// check checks the endpoint e describes, for a CA of trust domain own.
func (e *EndpointFile) check(own spiffeid.TrustDomain) (*Endpoint, []error) {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	ep := &Endpoint{Address: e.Address, Profile: e.Profile, CertFile: e.CertFile, KeyFile: e.KeyFile,
		RefreshHint: durationOr(e.RefreshHint, DefaultRefreshHint)}
	if e.Address == "" {
		bad("endpoint.address: required (host:port)")
	}
	switch e.Profile {
	case ProfileWeb:
		if e.CertFile == "" || e.KeyFile == "" {
			bad("endpoint: profile https_web needs certFile and keyFile")
		}
		if e.SPIFFEID != "" {
			bad("endpoint.spiffeID: only with profile https_spiffe")
		}
	case ProfileSPIFFE:
		if e.CertFile != "" || e.KeyFile != "" {
			bad("endpoint: profile https_spiffe serves our own SVID: no certFile or keyFile")
		}
		ep.SPIFFEID = spiffeid.RequireFromSegments(own, "workload-ca", DefaultEndpointPath)
		if e.SPIFFEID != "" {
			id, err := spiffeid.FromString(e.SPIFFEID)
			switch {
			case err != nil:
				bad("endpoint.spiffeID: %v", err)
			case id.TrustDomain() != own:
				bad("endpoint.spiffeID: %s is not in our trust domain %s", id, own)
			default:
				ep.SPIFFEID = id
			}
		}
	default:
		bad("endpoint.profile: %q, want https_web or https_spiffe", e.Profile)
	}
	if ep.RefreshHint < time.Second {
		bad("endpoint.refreshHint: %v, want at least 1s", ep.RefreshHint)
	}
	return ep, errs
}

// checkPeers checks the trust domains to import, for a CA of trust domain
// own.
func checkPeers(files []PeerFile, own spiffeid.TrustDomain) ([]Peer, []error) {
	var peers []Peer
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	seen := map[spiffeid.TrustDomain]bool{}
	for i, p := range files {
		at := fmt.Sprintf("trustDomains[%d]", i)
		td, err := spiffeid.TrustDomainFromString(p.TrustDomain)
		switch {
		case err != nil:
			bad("%s.trustDomain: %v", at, err)
			continue
		case td == own:
			bad("%s.trustDomain: %s is our own trust domain", at, td)
			continue
		case seen[td]:
			bad("%s.trustDomain: %s is listed twice", at, td)
			continue
		}
		seen[td] = true
		at = fmt.Sprintf("trustDomains[%d] (%s)", i, td)
		peer := Peer{TrustDomain: td, URL: p.URL, Profile: p.Profile, WebRootsFile: p.WebRootsFile, BundleFile: p.BundleFile,
			FromBundles: p.FromClusterTrustBundles, RefreshInterval: durationOr(p.RefreshInterval, DefaultRefreshInterval),
			MaxRoots: DefaultMaxRoots, FetchTimeout: durationOr(p.FetchTimeout, DefaultFetchTimeout), Ztunnel: p.Ztunnel,
			ClusterTrustBundle: p.ClusterTrustBundle, IstioRootConfigMap: p.IstioRootConfigMap}
		if p.MaxRoots != nil {
			peer.MaxRoots = *p.MaxRoots
		}
		errs = append(errs, peer.check(at, p)...)
		peers = append(peers, peer)
	}
	return peers, errs
}

// check checks p's source as written in f, and sets EndpointSPIFFEID.
func (p *Peer) check(at string, f PeerFile) []error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(at+format, args...)) }
	if p.RefreshInterval < time.Second {
		bad(".refreshInterval: %v, want at least 1s", p.RefreshInterval)
	}
	if p.MaxRoots < 1 || p.MaxRoots > MaxMaxRoots {
		bad(".maxRoots: %d, want 1 to %d", p.MaxRoots, MaxMaxRoots)
	}
	if p.FetchTimeout < 100*time.Millisecond || p.FetchTimeout > time.Minute {
		bad(".fetchTimeout: %v, want 100ms to 1m", p.FetchTimeout)
	}
	if f.FetchTimeout != nil && p.URL == "" {
		bad(".fetchTimeout: only with a url")
	}
	if b := p.FromBundles; b != nil {
		if p.URL != "" || p.BundleFile != "" {
			bad(".fromClusterTrustBundles: instead of url and bundleFile, not with them")
		}
		if d, path, ok := strings.Cut(b.SignerName, "/"); !ok || d == "" || path == "" || strings.Contains(path, "/") {
			bad(".fromClusterTrustBundles.signerName: %q, want a signer name such as example.com/signer", b.SignerName)
		}
	}
	if p.URL == "" {
		if p.BundleFile == "" && p.FromBundles == nil {
			bad(": needs a url (its bundle endpoint), a bundleFile or fromClusterTrustBundles")
		}
		if p.Profile != "" || f.EndpointSPIFFEID != "" || p.WebRootsFile != "" {
			bad(": profile, endpointSPIFFEID and webRootsFile need a url")
		}
		return errs
	}
	if u, err := url.Parse(p.URL); err != nil || u.Scheme != "https" || u.Host == "" || u.User != nil {
		bad(".url: %q, want an https:// URL without user info", p.URL)
	}
	switch p.Profile {
	case ProfileWeb:
		if f.EndpointSPIFFEID != "" {
			bad(".endpointSPIFFEID: only with profile https_spiffe")
		}
	case ProfileSPIFFE:
		id, err := spiffeid.FromString(f.EndpointSPIFFEID)
		switch {
		case err != nil:
			bad(".endpointSPIFFEID: %v (required with https_spiffe)", err)
		case id.TrustDomain() != p.TrustDomain:
			bad(".endpointSPIFFEID: %s is not in trust domain %s", id, p.TrustDomain)
		default:
			p.EndpointSPIFFEID = id
		}
		if p.BundleFile == "" {
			bad(": profile https_spiffe needs a bundleFile, the bundle that authenticates the endpoint the first time")
		}
		if p.WebRootsFile != "" {
			bad(".webRootsFile: only with profile https_web")
		}
	default:
		bad(".profile: %q, want https_web or https_spiffe", p.Profile)
	}
	return errs
}

func durationOr(d *metav1.Duration, def time.Duration) time.Duration {
	if d == nil {
		return def
	}
	return d.Duration
}
