package keystore

import (
	"crypto"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"net/url"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"go.step.sm/crypto/keyutil"
	"go.step.sm/crypto/x509util"

	"github.com/workload-ca/workload-ca/ca"
)

// Key types GenerateRoot accepts.
const (
	KeyECDSAP256 = "ecdsa-p256"
	KeyECDSAP384 = "ecdsa-p384"
	KeyRSA2048   = "rsa-2048"
	KeyRSA3072   = "rsa-3072"
	KeyRSA4096   = "rsa-4096"
)

// CheckKeyType refuses a key type GenerateRoot does not make.
func CheckKeyType(keyType string) error {
	switch keyType {
	case "", KeyECDSAP256, KeyECDSAP384, KeyRSA2048, KeyRSA3072, KeyRSA4096:
		return nil
	}
	return fmt.Errorf("unknown key type %q (want %s, %s, %s, %s or %s)",
		keyType, KeyECDSAP256, KeyECDSAP384, KeyRSA2048, KeyRSA3072, KeyRSA4096)
}

// DefaultRootLifetime is the lifetime of a generated root.
const DefaultRootLifetime = 10 * 365 * 24 * time.Hour

// maxBackdate moves a generated CA certificate's NotBefore into the past,
// so that peers with a slow clock accept it at once.
const maxBackdate = time.Hour

// backdate is maxBackdate, but never more than a hundredth of the lifetime:
// rotation measures a CA's life from NotBefore, and a short-lived CA
// backdated by a fixed hour would be born past its own rotation points.
func backdate(lifetime time.Duration) time.Duration {
	return min(maxBackdate, lifetime/100)
}

// RootCommonName is the common name of generated roots.
const RootCommonName = "workload-ca root"

// GenerateOptions describes a root to generate.
type GenerateOptions struct {
	// TrustDomain is required: it is the root's organization and URI SAN.
	TrustDomain spiffeid.TrustDomain
	// KeyType is one of the Key* constants; empty means KeyECDSAP256.
	KeyType string
	// Lifetime defaults to DefaultRootLifetime.
	Lifetime time.Duration
}

// GenerateRoot returns a new self-signed root as signing material: subject
// O=<trust domain>, CN=RootCommonName, the trust domain's SPIFFE ID as URI
// SAN (as the X.509-SVID specification recommends for CA certificates), key
// usage certSign and cRLSign, and a subject key identifier.
func GenerateRoot(opts GenerateOptions, now time.Time) (*ca.Material, error) {
	if opts.TrustDomain.IsZero() {
		return nil, errors.New("keystore: generate root: trust domain is required")
	}
	if opts.Lifetime <= 0 {
		opts.Lifetime = DefaultRootLifetime
	}
	signer, err := NewKey(opts.KeyType)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		Subject:               pkix.Name{Organization: []string{opts.TrustDomain.Name()}, CommonName: RootCommonName},
		URIs:                  []*url.URL{opts.TrustDomain.ID().URL()},
		NotBefore:             now.Add(-backdate(opts.Lifetime)),
		NotAfter:              now.Add(opts.Lifetime),
		BasicConstraintsValid: true,
		IsCA:                  true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	// x509util fills in a random serial number and the subject key id.
	cert, err := x509util.CreateCertificate(tmpl, tmpl, signer.Public(), signer)
	if err != nil {
		return nil, fmt.Errorf("keystore: generate root: %w", err)
	}
	return &ca.Material{Signer: signer, Cert: cert, Roots: []*x509.Certificate{cert}}, nil
}

// NewKey generates a key of one of the Key* types (empty: KeyECDSAP256).
func NewKey(keyType string) (crypto.Signer, error) {
	var (
		s   crypto.Signer
		err error
	)
	switch keyType {
	case "", KeyECDSAP256:
		s, err = keyutil.GenerateSigner("EC", "P-256", 0)
	case KeyECDSAP384:
		s, err = keyutil.GenerateSigner("EC", "P-384", 0)
	case KeyRSA2048:
		s, err = keyutil.GenerateSigner("RSA", "", 2048)
	case KeyRSA3072:
		s, err = keyutil.GenerateSigner("RSA", "", 3072)
	case KeyRSA4096:
		s, err = keyutil.GenerateSigner("RSA", "", 4096)
	default:
		return nil, fmt.Errorf("keystore: %w", CheckKeyType(keyType))
	}
	if err != nil {
		return nil, fmt.Errorf("keystore: generating %s key: %w", keyType, err)
	}
	return s, nil
}
