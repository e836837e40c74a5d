package ca

import (
	"crypto"
	"crypto/x509"
	"errors"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// ErrInvalidCSR is wrapped by every rejection of a certificate signing
// request: malformed PEM or DER, bad signature, unsupported key, or SANs that
// do not match the granted identity.
var ErrInvalidCSR = errors.New("invalid certificate signing request")

// ErrInvalidMaterial is wrapped when CA material is incomplete or
// inconsistent: not a CA, key does not match, chain does not verify.
var ErrInvalidMaterial = errors.New("invalid CA material")

// ErrForeignTrustDomain is returned by Sign when the requested identity is
// not in the authority's trust domain. It is a policy refusal, not a
// malformed request.
var ErrForeignTrustDomain = errors.New("identity is not in the CA's trust domain")

// Material is a signing CA: its key, its certificate, the certificates
// between it and a root, and the root bundle clients trust.
type Material struct {
	// Signer is the signing certificate's private key.
	Signer crypto.Signer
	// Cert is the signing certificate (a root or an intermediate).
	Cert *x509.Certificate
	// Intermediates are the certificates above Cert, Cert's issuer first,
	// excluding roots. Empty when Cert is a root or is issued by a root.
	Intermediates []*x509.Certificate
	// Roots is the trust bundle. It may hold several roots during rotation.
	Roots []*x509.Certificate
}

// Request asks for a workload certificate.
type Request struct {
	// CSR has already been parsed and its signature checked by ParseCSR.
	CSR *x509.CertificateRequest
	// ID is the identity granted by authorization.
	ID spiffeid.ID
	// TTL is the requested lifetime; zero or negative means the default, and
	// a value over the maximum is clamped to it.
	TTL time.Duration
	// MaxValidity, if positive, bounds the whole validity period,
	// NotAfter - NotBefore, backdating included (a Kubernetes
	// PodCertificateRequest's maxExpirationSeconds is such a bound).
	MaxValidity time.Duration
	// MaxTTL, if positive, caps the lifetime from now (NotAfter - now),
	// after the default and the maximum TTL are applied: an issuance
	// policy's cap.
	MaxTTL time.Duration
}

// Issued is a signed certificate and the chain to return to the client.
type Issued struct {
	Cert *x509.Certificate
	// Chain is [leaf, intermediates..., root bundle], each element PEM; the
	// last element holds every root, concatenated.
	Chain []string
}
