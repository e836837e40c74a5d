// Package rootset writes a set of root certificates in one canonical form,
// so that every place the CA publishes its roots (ClusterTrustBundles,
// Istio's root ConfigMap) holds the same text for the same set, and an
// unchanged set never causes a write.
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

// ErrInvalid is wrapped when roots cannot be published: none, or one that
// is not a CA certificate.
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
		if !c.IsCA || !c.BasicConstraintsValid {
			return "", fmt.Errorf("%w: root %q is not a CA certificate", ErrInvalid, c.Subject)
		}
		_ = pem.Encode(&b, &pem.Block{Type: "CERTIFICATE", Bytes: c.Raw}) // a Builder never fails
	}
	return b.String(), nil
}
