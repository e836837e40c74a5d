package ca

import (
	"bytes"
	"crypto/x509"
	"encoding/asn1"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"go.step.sm/crypto/keyutil"
)

// errIssuedInvalid is wrapped when a certificate the CA just signed does not
// match what was asked: a bug or a misbehaving signer, never the client's
// fault.
var errIssuedInvalid = errors.New("ca: issued certificate failed verification")

// oidSubjectAltName is id-ce-subjectAltName (RFC 5280, 4.2.1.6).
func oidSubjectAltName() asn1.ObjectIdentifier { return asn1.ObjectIdentifier{2, 5, 29, 17} }

// checkIssued verifies the content of a freshly signed leaf against spec and
// its issuer, whose chain's first expiry is chainEnd. Issuer name and key identifier equal to the signing
// certificate's, together with the chain verified when the material was
// loaded, mean the leaf chains to the roots without building the chain here.
func checkIssued(leaf, issuer *x509.Certificate, chainEnd time.Time, spec *leafSpec) error {
	switch {
	case !leaf.BasicConstraintsValid || leaf.IsCA:
		return issuedInvalid("basicConstraints must be present with CA=false")
	case leaf.KeyUsage != keyUsageFor(spec.pub):
		return issuedInvalid("key usage %#x, want %#x", leaf.KeyUsage, keyUsageFor(spec.pub))
	case !slices.Equal(leaf.ExtKeyUsage, spec.extKeyUsage) || len(leaf.UnknownExtKeyUsage) != 0:
		return issuedInvalid("extended key usage %v, want %v", leaf.ExtKeyUsage, spec.extKeyUsage)
	case leaf.NotBefore.Before(issuer.NotBefore) || leaf.NotAfter.After(issuer.NotAfter):
		return issuedInvalid("validity [%s, %s] outside the issuer's", leaf.NotBefore, leaf.NotAfter)
	case leaf.NotAfter.After(chainEnd):
		return issuedInvalid("not after %s, when a certificate of the issuer's chain expires", chainEnd)
	case !bytes.Equal(leaf.RawIssuer, issuer.RawSubject):
		return issuedInvalid("issuer name is not the signing certificate's subject")
	case !bytes.Equal(leaf.AuthorityKeyId, issuer.SubjectKeyId):
		return issuedInvalid("authority key id is not the signing certificate's subject key id")
	case !keyutil.Equal(leaf.PublicKey, spec.pub):
		return issuedInvalid("public key is not the requested one")
	}
	return checkIssuedNames(leaf, spec)
}

// checkIssuedNames checks the SANs: exactly spec's, in a critical extension
// since the subject is empty.
func checkIssuedNames(leaf *x509.Certificate, spec *leafSpec) error {
	if len(leaf.Subject.Names) != 0 || !sanCritical(leaf) {
		return issuedInvalid("subject must be empty and the SAN extension critical")
	}
	if len(leaf.IPAddresses) != 0 || len(leaf.EmailAddresses) != 0 || !slices.Equal(leaf.DNSNames, spec.dnsNames) {
		return issuedInvalid("unexpected SANs")
	}
	if spec.id.IsZero() {
		if len(leaf.URIs) != 0 {
			return issuedInvalid("serving certificate has URI SANs")
		}
		return nil
	}
	id, err := x509svid.IDFromCert(leaf)
	if err != nil {
		return issuedInvalid("SPIFFE ID: %v", err)
	}
	if id != spec.id {
		return issuedInvalid("SPIFFE ID %q, want %q", id, spec.id)
	}
	return nil
}

func sanCritical(c *x509.Certificate) bool {
	oid := oidSubjectAltName()
	for _, e := range c.Extensions {
		if e.Id.Equal(oid) {
			return e.Critical
		}
	}
	return false
}

func issuedInvalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errIssuedInvalid, fmt.Sprintf(format, args...))
}
