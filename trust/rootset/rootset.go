// Package rootset writes a set of root certificates in one canonical form,
// so that every place the CA publishes its roots (ClusterTrustBundles,
// Istio's root ConfigMap) holds the same text for the same set, and an
// unchanged set never causes a write. It also decides which federated
// trust domains' roots join ours in one destination (Composition): each
// peer is judged on its own roots, so a bad peer is left out without
// affecting our roots or another peer's; and it holds the rule that keeps
// a peer's roots out of Istio's root ConfigMap unless their name
// constraints keep them off our DNS names (KeepsOffDNS).
package rootset

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// ErrInvalid is wrapped when roots cannot be published: none, one that is
// not a CA certificate, or too many for their destination.
var ErrInvalid = errors.New("roots cannot be published")

// PEM returns roots as PEM "CERTIFICATE" blocks without headers, nil
// entries and duplicates removed, ordered by NotBefore then DER.
func PEM(roots []*x509.Certificate) (string, error) {
	certs := slices.DeleteFunc(slices.Clone(roots), func(c *x509.Certificate) bool { return c == nil })
	slices.SortFunc(certs, func(a, b *x509.Certificate) int {
		if c := a.NotBefore.Compare(b.NotBefore); c != 0 {
			return c
		}
		return bytes.Compare(a.Raw, b.Raw)
	})
	certs = slices.CompactFunc(certs, func(a, b *x509.Certificate) bool { return bytes.Equal(a.Raw, b.Raw) })
	if len(certs) == 0 {
		return "", fmt.Errorf("%w: no roots", ErrInvalid)
	}
	var b strings.Builder
	for _, c := range certs {
		if err := CheckCA(c); err != nil {
			return "", err
		}
		_ = pem.Encode(&b, &pem.Block{Type: "CERTIFICATE", Bytes: c.Raw}) // a Builder never fails
	}
	return b.String(), nil
}

// CheckCA returns an error wrapping ErrInvalid unless c is a CA
// certificate (basic constraints with cA true) whose key usage, if it has
// one, allows signing certificates.
func CheckCA(c *x509.Certificate) error {
	switch {
	case !c.IsCA || !c.BasicConstraintsValid:
		return fmt.Errorf("%w: root %q is not a CA certificate", ErrInvalid, c.Subject)
	case c.KeyUsage != 0 && c.KeyUsage&x509.KeyUsageCertSign == 0:
		return fmt.Errorf("%w: root %q may not sign certificates (no keyCertSign)", ErrInvalid, c.Subject)
	}
	return nil
}
