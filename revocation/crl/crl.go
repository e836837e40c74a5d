package crl

import (
	"bytes"
	"cmp"
	"crypto"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"slices"
	"time"
)

// Reason codes of RFC 5280 section 5.3.1 that a revocation may give.
const (
	ReasonUnspecified          = 0
	ReasonKeyCompromise        = 1
	ReasonCACompromise         = 2
	ReasonAffiliationChanged   = 3
	ReasonSuperseded           = 4
	ReasonCessationOfOperation = 5
)

// Entry is one revoked certificate.
type Entry struct {
	Serial    *big.Int
	RevokedAt time.Time
	Reason    int
	// NotAfter is when the certificate expires: from then on it is left
	// out, for an expired certificate is refused anyway.
	NotAfter time.Time
}

// List is what a CRL says and who signs it.
type List struct {
	// Issuer signs the list with Signer, its key: a CA certificate that
	// may sign CRLs.
	Issuer *x509.Certificate
	Signer crypto.Signer
	// Number is the CRL number: it must grow with every list the issuer
	// signs (the caller keeps it).
	Number                 *big.Int
	ThisUpdate, NextUpdate time.Time
	Entries                []Entry
	// Rand is the source of randomness for signing (default crypto/rand).
	Rand io.Reader
}

// Errors of Build.
var (
	ErrNotCRLIssuer = errors.New("crl: the issuer may not sign CRLs")
	ErrInvalid      = errors.New("crl: invalid list")
)

// Build signs l and returns its DER, after checking that the result
// parses and verifies with the issuer's key. Entries of certificates
// expired at ThisUpdate are left out; the others are sorted by serial, a
// serial listed twice once (its earliest revocation).
func Build(l List) ([]byte, error) {
	if err := check(l); err != nil {
		return nil, err
	}
	tmpl := &x509.RevocationList{Number: l.Number, ThisUpdate: l.ThisUpdate, NextUpdate: l.NextUpdate,
		RevokedCertificateEntries: entries(l.Entries, l.ThisUpdate)}
	r := cmp.Or[io.Reader](l.Rand, rand.Reader)
	der, err := x509.CreateRevocationList(r, tmpl, l.Issuer, l.Signer)
	if err != nil {
		return nil, fmt.Errorf("crl: sign: %w", err)
	}
	parsed, err := x509.ParseRevocationList(der)
	if err != nil {
		return nil, fmt.Errorf("crl: the list signed does not parse: %w", err)
	}
	if err := parsed.CheckSignatureFrom(l.Issuer); err != nil {
		return nil, fmt.Errorf("crl: the list signed does not verify with %s: %w", l.Issuer.Subject, err)
	}
	return der, nil
}

func check(l List) error {
	switch {
	case l.Issuer == nil || l.Signer == nil:
		return fmt.Errorf("%w: an issuer and its key are required", ErrInvalid)
	case !l.Issuer.IsCA || (l.Issuer.KeyUsage != 0 && l.Issuer.KeyUsage&x509.KeyUsageCRLSign == 0):
		return fmt.Errorf("%w: %s", ErrNotCRLIssuer, l.Issuer.Subject)
	case len(l.Issuer.SubjectKeyId) == 0:
		// The list's authority key identifier is the issuer's subject
		// key identifier; without one, a client cannot match them.
		return fmt.Errorf("%w: %s has no subject key identifier", ErrInvalid, l.Issuer.Subject)
	case l.Number == nil || l.Number.Sign() <= 0 || l.Number.BitLen() > 159:
		return fmt.Errorf("%w: the CRL number must be positive and at most 20 octets", ErrInvalid)
	case !l.NextUpdate.After(l.ThisUpdate):
		return fmt.Errorf("%w: nextUpdate %s is not after thisUpdate %s", ErrInvalid, l.NextUpdate, l.ThisUpdate)
	}
	for _, e := range l.Entries {
		if e.Serial == nil || e.Serial.Sign() <= 0 {
			return fmt.Errorf("%w: an entry without a positive serial", ErrInvalid)
		}
		if e.Reason < ReasonUnspecified || e.Reason > ReasonCessationOfOperation {
			return fmt.Errorf("%w: reason code %d of serial %x", ErrInvalid, e.Reason, e.Serial)
		}
	}
	return nil
}

// entries are the entries to list at now: still valid, by serial, once
// each.
func entries(in []Entry, now time.Time) []x509.RevocationListEntry {
	live := make([]Entry, 0, len(in))
	for _, e := range in {
		if e.NotAfter.IsZero() || e.NotAfter.After(now) {
			live = append(live, e)
		}
	}
	slices.SortFunc(live, func(a, b Entry) int {
		return cmp.Or(a.Serial.Cmp(b.Serial), a.RevokedAt.Compare(b.RevokedAt))
	})
	live = slices.CompactFunc(live, func(a, b Entry) bool { return a.Serial.Cmp(b.Serial) == 0 })
	out := make([]x509.RevocationListEntry, len(live))
	for i, e := range live {
		out[i] = x509.RevocationListEntry{SerialNumber: e.Serial, RevocationTime: e.RevokedAt.UTC(), ReasonCode: e.Reason}
	}
	return out
}

// PEM is the file ztunnel and istio-agent read: one "X509 CRL" block per
// list, in the order given.
func PEM(ders ...[]byte) []byte {
	var b bytes.Buffer
	for _, der := range ders {
		_ = pem.Encode(&b, &pem.Block{Type: "X509 CRL", Bytes: der})
	}
	return b.Bytes()
}
