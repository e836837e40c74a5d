package ca

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"fmt"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// MaxCSRSize bounds the PEM input ParseCSR accepts; an RSA-8192 CSR with a
// long URI fits comfortably.
const MaxCSRSize = 16 << 10

// RSA key sizes accepted in CSRs, in bits.
const (
	minRSABits = 2048
	maxRSABits = 8192
)

// ParseCSR parses a PEM certificate signing request and checks everything
// that does not depend on who asks: one PEM block and nothing else, a
// supported key, a valid self-signature, and no SANs but at most one SPIFFE
// URI. It does no I/O and keeps no state. Every error wraps ErrInvalidCSR.
func ParseCSR(pemBytes []byte) (*x509.CertificateRequest, error) {
	if len(pemBytes) > MaxCSRSize {
		return nil, invalidCSR("%d bytes exceeds the limit of %d", len(pemBytes), MaxCSRSize)
	}
	der, err := decodeCSRPEM(pemBytes)
	if err != nil {
		return nil, err
	}
	csr, err := x509.ParseCertificateRequest(der)
	if err != nil {
		return nil, invalidCSR("parsing DER: %v", err)
	}
	// The key is checked before the signature so that unsupported or
	// oversized keys cost nothing to reject.
	if err := CheckPublicKey(csr.PublicKey); err != nil {
		return nil, err
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, invalidCSR("signature: %v", err)
	}
	if err := checkCSRNames(csr); err != nil {
		return nil, err
	}
	return csr, nil
}

// decodeCSRPEM returns the DER of the only PEM block in b. Unlike
// pem.Decode, it refuses text before or after the block.
func decodeCSRPEM(b []byte) ([]byte, error) {
	trimmed := bytes.TrimSpace(b)
	if !bytes.HasPrefix(trimmed, []byte("-----BEGIN ")) {
		return nil, invalidCSR("not PEM: input does not start with a PEM block")
	}
	block, rest := pem.Decode(trimmed)
	switch {
	case block == nil:
		return nil, invalidCSR("malformed PEM block")
	case block.Type != "CERTIFICATE REQUEST" && block.Type != "NEW CERTIFICATE REQUEST":
		return nil, invalidCSR("PEM block type %q, want \"CERTIFICATE REQUEST\"", block.Type)
	case len(block.Headers) != 0:
		return nil, invalidCSR("PEM headers are not allowed")
	case len(rest) != 0:
		return nil, invalidCSR("data after the PEM block (only one CSR is allowed)")
	}
	return block.Bytes, nil
}

// subjectCurves is the curves of the ECDSA keys the CA issues to (an
// array: checking a request's key allocates nothing).
func subjectCurves() [2]elliptic.Curve { return [...]elliptic.Curve{elliptic.P256(), elliptic.P384()} }

func isSubjectCurve(c elliptic.Curve) bool {
	for _, sc := range subjectCurves() {
		if sc == c {
			return true
		}
	}
	return false
}

// CheckPublicKey reports whether the CA issues to pub: ECDSA P-256 and
// P-384, RSA 2048 to 8192 bits, and Ed25519. Errors wrap ErrInvalidCSR.
func CheckPublicKey(pub crypto.PublicKey) error {
	switch k := pub.(type) {
	case *ecdsa.PublicKey:
		if !isSubjectCurve(k.Curve) {
			return invalidCSR("unsupported ECDSA curve %s (want P-256 or P-384)", k.Curve.Params().Name)
		}
	case *rsa.PublicKey:
		if n := k.N.BitLen(); n < minRSABits || n > maxRSABits {
			return invalidCSR("RSA key of %d bits (want %d to %d)", n, minRSABits, maxRSABits)
		}
	case ed25519.PublicKey:
	default:
		return invalidCSR("unsupported public key type %T", pub)
	}
	return nil
}

// checkCSRNames allows no SAN but a single SPIFFE ID URI. The subject is
// ignored: issued certificates never copy it.
func checkCSRNames(csr *x509.CertificateRequest) error {
	switch {
	case len(csr.DNSNames) > 0:
		return invalidCSR("DNS SANs are not allowed")
	case len(csr.IPAddresses) > 0:
		return invalidCSR("IP SANs are not allowed")
	case len(csr.EmailAddresses) > 0:
		return invalidCSR("email SANs are not allowed")
	case len(csr.URIs) > 1:
		return invalidCSR("%d URI SANs, at most one is allowed", len(csr.URIs))
	case len(csr.URIs) == 1:
		if _, err := spiffeid.FromURI(csr.URIs[0]); err != nil {
			return invalidCSR("URI SAN is not a SPIFFE ID: %v", err)
		}
	}
	return nil
}

func invalidCSR(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidCSR, fmt.Sprintf(format, args...))
}
