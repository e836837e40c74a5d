package istiodcert

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// DefaultSecretName is the Secret Istio's chart mounts at
// /var/run/secrets/istiod/tls (optional: istiod falls back to its own CA's
// certificate without it).
const DefaultSecretName = "istiod-tls" //nolint:gosec // a Secret's name, not a credential

// Data keys of the Secret: the kubernetes.io/tls keys and ca.crt, which
// istiod reads as its CA bundle when /var/run/secrets/istiod/ca is empty.
const (
	CertKey  = corev1.TLSCertKey       // leaf, then the certificates above it
	KeyKey   = corev1.TLSPrivateKeyKey // PKCS #8
	RootsKey = "ca.crt"                // our roots
)

// Labels set on the Secret. A Secret without LabelManagedBy=ManagedBy is
// not ours and is never written.
const (
	LabelManagedBy   = "app.kubernetes.io/managed-by"
	ManagedBy        = "workload-ca"
	LabelTrustDomain = "workload-ca.io/trust-domain"
)

// FieldManager is the field manager of our writes.
const FieldManager = "workload-ca"

// Why a Secret is (re)issued, in the log.
const (
	reasonMissing   = "no Secret"
	reasonUnusable  = "the Secret's certificate or key is unusable"
	reasonNames     = "the DNS names changed"
	reasonSigner    = "the CA signs with another certificate"
	reasonDue       = "two thirds of its lifetime have passed"
	reasonRoots     = "the roots changed"
	reasonNotServed = "the certificate is not yet valid or has expired"
)

// verdict is what assess found.
type verdict struct {
	// reissue says why the certificate must be reissued; "" if it need not.
	reissue string
	// notAfter and renewAt are the held certificate's end and the time two
	// thirds into its life, when it must be reissued (set when reissue is
	// "").
	notAfter, renewAt time.Time
}

// assess says whether the certificate s holds must be reissued. It must
// parse with its key, name exactly dnsNames, be signed by signing, be
// valid at now and not yet two thirds into its life; ca.crt must be
// rootsPEM.
func assess(s *corev1.Secret, dnsNames []string, signing *x509.Certificate, rootsPEM string, now time.Time) verdict {
	if s == nil {
		return verdict{reissue: reasonMissing}
	}
	pair, err := tls.X509KeyPair(s.Data[CertKey], s.Data[KeyKey])
	if err != nil || pair.Leaf == nil {
		return verdict{reissue: reasonUnusable}
	}
	leaf := pair.Leaf
	v := verdict{notAfter: leaf.NotAfter, renewAt: renewAt(leaf)}
	switch {
	case !sameNames(leaf.DNSNames, dnsNames):
		v.reissue = reasonNames
	case leaf.CheckSignatureFrom(signing) != nil:
		v.reissue = reasonSigner
	case now.Before(leaf.NotBefore) || !now.Before(leaf.NotAfter):
		v.reissue = reasonNotServed
	case !now.Before(v.renewAt):
		v.reissue = reasonDue
	case string(s.Data[RootsKey]) != rootsPEM:
		v.reissue = reasonRoots
	}
	return v
}

// renewAt is two thirds into leaf's life.
func renewAt(leaf *x509.Certificate) time.Time {
	return leaf.NotBefore.Add(leaf.NotAfter.Sub(leaf.NotBefore) * 2 / 3)
}

func sameNames(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

// issued is a new certificate as the Secret holds it.
type issued struct {
	data     map[string][]byte
	notAfter time.Time
	renewAt  time.Time
}

// newKey is the key of each certificate: P-256, which every TLS client of
// istiod (Envoy, ztunnel's rustls, Go) accepts.
func newKey() (*ecdsa.PrivateKey, error) { return ecdsa.GenerateKey(elliptic.P256(), rand.Reader) }

// secretData encodes leaf, the certificates above it, key and rootsPEM
// as the Secret's data.
func secretData(leaf *x509.Certificate, above []*x509.Certificate, key crypto.Signer, rootsPEM string) (issued, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return issued{}, fmt.Errorf("encode the key: %w", err)
	}
	var chain []byte
	for _, c := range append([]*x509.Certificate{leaf}, above...) {
		chain = append(chain, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})...)
	}
	return issued{
		data: map[string][]byte{
			CertKey:  chain,
			KeyKey:   pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}),
			RootsKey: []byte(rootsPEM),
		},
		notAfter: leaf.NotAfter,
		renewAt:  renewAt(leaf),
	}, nil
}
