package testca

import (
	"crypto"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/pem"
	"testing"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// CSR returns a PEM certificate signing request signed by key, with an
// empty subject and, if uris are given, one critical SubjectAltName
// extension holding them, the shape ztunnel sends.
func CSR(t testing.TB, key crypto.Signer, uris ...string) []byte {
	t.Helper()
	tmpl := &x509.CertificateRequest{}
	if len(uris) > 0 {
		tmpl.ExtraExtensions = []pkix.Extension{uriSANExtension(t, uris)}
	}
	return CSRFromTemplate(t, key, tmpl)
}

// CSRFromTemplate returns a PEM certificate signing request for tmpl signed
// by key, for tests that need other names or attributes.
func CSRFromTemplate(t testing.TB, key crypto.Signer, tmpl *x509.CertificateRequest) []byte {
	t.Helper()
	der, err := x509.CreateCertificateRequest(rand.Reader, tmpl, key)
	if err != nil {
		t.Fatalf("testca: creating CSR: %v", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})
}

// ZtunnelCSR returns a CSR like ztunnel's for id (ECDSA P-256, empty
// subject, one critical URI SAN) and its key.
func ZtunnelCSR(t testing.TB, id spiffeid.ID) ([]byte, crypto.Signer) {
	t.Helper()
	key := NewKey(t, P256)
	return CSR(t, key, id.String()), key
}

// uriSANExtension marshals GeneralNames of uniformResourceIdentifier
// entries ([6] IA5String), marked critical since the subject is empty.
func uriSANExtension(t testing.TB, uris []string) pkix.Extension {
	t.Helper()
	names := make([]asn1.RawValue, len(uris))
	for i, u := range uris {
		names[i] = asn1.RawValue{Class: asn1.ClassContextSpecific, Tag: 6, Bytes: []byte(u)}
	}
	value, err := asn1.Marshal(names)
	if err != nil {
		t.Fatalf("testca: marshaling SAN: %v", err)
	}
	return pkix.Extension{Id: asn1.ObjectIdentifier{2, 5, 29, 17}, Critical: true, Value: value}
}
