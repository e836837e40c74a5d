package rootconfigmap

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// The ConfigMap Istio's sidecars and ztunnel mount to verify the CA.
const (
	// ConfigMapName is the ConfigMap published in every selected namespace.
	ConfigMapName = "istio-ca-root-cert"
	// DataKey is the key holding the PEM roots.
	DataKey = "root-cert.pem"
)

// Labels set on every ConfigMap we publish.
const (
	LabelManagedBy   = "app.kubernetes.io/managed-by"
	ManagedBy        = "workload-ca"
	LabelTrustDomain = "workload-ca.io/trust-domain"
	// LabelIstioConfig is the label istiod puts on the ConfigMaps it
	// publishes; we keep it so that tools selecting Istio's objects by it
	// still find ours.
	LabelIstioConfig = "istio.io/config"
)

// ErrInvalidRoots is wrapped when the roots cannot be published: none, or
// one that is not a CA certificate. Nothing is changed in the cluster then;
// existing ConfigMaps stay.
var ErrInvalidRoots = errors.New("roots cannot be published")

// rootsPEM returns roots as the value of DataKey: PEM "CERTIFICATE" blocks,
// duplicates removed, ordered by NotBefore then DER so that the same set of
// roots always yields the same string and an unchanged set writes nothing.
func rootsPEM(roots []*x509.Certificate) (string, error) {
	certs := slices.DeleteFunc(slices.Clone(roots), func(c *x509.Certificate) bool { return c == nil })
	slices.SortFunc(certs, func(a, b *x509.Certificate) int {
		if c := a.NotBefore.Compare(b.NotBefore); c != 0 {
			return c
		}
		return bytes.Compare(a.Raw, b.Raw)
	})
	certs = slices.CompactFunc(certs, func(a, b *x509.Certificate) bool { return bytes.Equal(a.Raw, b.Raw) })
	if len(certs) == 0 {
		return "", fmt.Errorf("%w: no roots", ErrInvalidRoots)
	}
	var b strings.Builder
	for _, c := range certs {
		if !c.IsCA || !c.BasicConstraintsValid {
			return "", fmt.Errorf("%w: root %q is not a CA certificate", ErrInvalidRoots, c.Subject)
		}
		_ = pem.Encode(&b, &pem.Block{Type: "CERTIFICATE", Bytes: c.Raw}) // a Builder never fails
	}
	return b.String(), nil
}

// ownLabels returns the labels of our ConfigMaps in trust domain td.
func ownLabels(td spiffeid.TrustDomain) map[string]string {
	return map[string]string{
		LabelManagedBy:   ManagedBy,
		LabelTrustDomain: td.Name(),
		LabelIstioConfig: "true",
	}
}

// hasLabels reports whether have holds every label in want, with its value.
func hasLabels(have, want map[string]string) bool {
	for k, v := range want {
		if got, ok := have[k]; !ok || got != v {
			return false
		}
	}
	return true
}
