package clustertrustbundle

import (
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"strings"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/workload-ca/workload-ca/trust/rootset"
)

// Signer and bundle names.
const (
	// DefaultSignerName is the signer our bundles are linked to by default.
	DefaultSignerName = "workload-ca.io/spiffe"
	// IstioSignerName and IstioBundleName are what Istio's charts mount.
	IstioSignerName = "istio.io/istiod-ca"
	IstioBundleName = "istio.io:istiod-ca:root-cert"
	// FieldManager is the field manager of our writes; any other manager
	// of spec.trustBundle is another writer.
	FieldManager = "workload-ca"
)

// Labels on every bundle we publish; all must match for a bundle to be
// ours. LabelTrustDomain is the trust domain whose roots the bundle holds
// (ours, or a federated one's); the k8s.spiffe.io labels are those a
// SPIFFE draft for Kubernetes trust distribution proposes: the trust
// domain of the workloads the bundle is for (ours), the trust domain its
// roots vouch for, and the canary stage (live: what every workload should
// trust now; preview: that and a new root not yet live, for canaries).
const (
	LabelManagedBy        = "app.kubernetes.io/managed-by"
	ManagedBy             = "workload-ca"
	LabelTrustDomain      = "workload-ca.io/trust-domain"
	LabelSPIFFEWorkloadTD = "k8s.spiffe.io/workload-trust-domain"
	LabelSPIFFEPeerTD     = "k8s.spiffe.io/peer-trust-domain"
	LabelSPIFFECanarying  = "k8s.spiffe.io/canarying"
	CanaryingLive         = "live"
	CanaryingPreview      = "preview"
)

// previewPrefix starts the name, after the signer's prefix, of a bundle
// of the preview stage.
const previewPrefix = "preview-"

// peerPrefix starts the name, after the signer's prefix, of a bundle of a
// federated trust domain's roots; the hash after it covers the trust
// domain and the content. A trust domain may hold characters a name may
// not (such as "_"), so it is hashed rather than spelled out; the labels
// name it.
const peerPrefix = "peer-"

// maxBundleSize is the apiserver's limit on spec.trustBundle.
const maxBundleSize = 1 << 20

// hashBytes is how many bytes of SHA-256 name a content-addressed bundle.
const hashBytes = 8

// ErrInvalidRoots is wrapped when the roots cannot be published: none, one
// that is not a CA certificate, or too many for one bundle. Nothing is
// changed in the cluster then; existing bundles stay.
var ErrInvalidRoots = rootset.ErrInvalid

// errTooLarge marks roots over the API's size limit.
var errTooLarge = errors.New("too large")

// bundleContent returns roots as ClusterTrustBundle content: their
// canonical PEM (rootset.PEM), so that the same set of roots always yields
// the same string (and name), within the API's size limit.
func bundleContent(roots []*x509.Certificate) (string, error) {
	content, err := rootset.PEM(roots)
	if err != nil {
		return "", err
	}
	if len(content) > maxBundleSize {
		return "", fmt.Errorf("%w: %w: %d bytes of PEM, over the %d-byte limit", ErrInvalidRoots, errTooLarge, len(content), maxBundleSize)
	}
	return content, nil
}

// target is one signer we publish for, and how its bundle is named.
type target struct {
	signer string
	// fixedName, when set, is the bundle's name, updated in place;
	// otherwise the name is derived from the content.
	fixedName string
	// preview: a preview bundle is published too.
	preview bool
	// peer, when set, is the federated trust domain whose roots the
	// bundle holds: its name is apart from ours and every other peer's
	// even when the roots are the same.
	peer spiffeid.TrustDomain
}

// name returns the name of the live bundle holding content.
func (t target) name(content string) string {
	if t.fixedName != "" {
		return t.fixedName
	}
	if !t.peer.IsZero() {
		sum := sha256.Sum256([]byte(peerPrefix + t.peer.Name() + "\n" + content))
		return signerPrefix(t.signer) + peerPrefix + hex.EncodeToString(sum[:hashBytes])
	}
	sum := sha256.Sum256([]byte(content))
	return signerPrefix(t.signer) + hex.EncodeToString(sum[:hashBytes])
}

// previewName returns the name of the preview bundle holding content:
// apart from the live bundle's even when the two hold the same roots.
func (t target) previewName(content string) string {
	sum := sha256.Sum256([]byte(CanaryingPreview + "\n" + content))
	return signerPrefix(t.signer) + previewPrefix + hex.EncodeToString(sum[:hashBytes])
}

// isPreview reports whether name is that of a preview bundle.
func isPreview(name string) bool {
	_, rest, ok := strings.Cut(name, ":")
	for ok && strings.Contains(rest, ":") {
		_, rest, ok = strings.Cut(rest, ":")
	}
	return ok && strings.HasPrefix(rest, previewPrefix)
}

// signerPrefix is the name prefix the apiserver requires of bundles linked
// to signer.
func signerPrefix(signer string) string {
	return strings.ReplaceAll(signer, "/", ":") + ":"
}

// ownLabels returns the labels that make a bundle one of a CA of trust
// domain workload holding the roots of trust domain peer (its own:
// workload), whatever its stage.
func ownLabels(workload, peer spiffeid.TrustDomain) map[string]string {
	return map[string]string{LabelManagedBy: ManagedBy, LabelTrustDomain: peer.Name(),
		LabelSPIFFEWorkloadTD: workload.Name(), LabelSPIFFEPeerTD: peer.Name()}
}

// withStage returns own and the canary stage of the bundle named name.
func withStage(own map[string]string, name string) map[string]string {
	out := maps.Clone(own)
	out[LabelSPIFFECanarying] = CanaryingLive
	if isPreview(name) {
		out[LabelSPIFFECanarying] = CanaryingPreview
	}
	return out
}

// validateSignerName checks the form the apiserver requires,
// "<DNS domain with a dot>/<path>", and reports errors in our terms.
func validateSignerName(s string) error {
	domain, path, ok := strings.Cut(s, "/")
	switch {
	case !ok || strings.Contains(path, "/"):
		return fmt.Errorf("signer name %q: want exactly one '/', as in example.com/signer", s)
	case !strings.Contains(domain, "."):
		return fmt.Errorf("signer name %q: domain %q needs at least one dot", s, domain)
	}
	if errs := validation.IsDNS1123Subdomain(domain); len(errs) > 0 {
		return fmt.Errorf("signer name %q: domain: %s", s, strings.Join(errs, "; "))
	}
	for seg := range strings.SplitSeq(path, ".") {
		if errs := validation.IsDNS1123Subdomain(seg); len(errs) > 0 {
			return fmt.Errorf("signer name %q: path: %s", s, strings.Join(errs, "; "))
		}
	}
	return nil
}
