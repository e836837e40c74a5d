package ca_test

import (
	"bytes"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"net"
	"net/url"
	"strings"
	"testing"

	"github.com/workload-ca/workload-ca/ca"
	"github.com/workload-ca/workload-ca/internal/testca"
)

func TestParseCSRAccepts(t *testing.T) {
	for _, kt := range []testca.KeyType{testca.P256, testca.P384, testca.RSA2048, testca.Ed25519} {
		t.Run(string(kt), func(t *testing.T) {
			csr, err := ca.ParseCSR(testca.CSR(t, testca.NewKey(t, kt), workload.String()))
			if err != nil {
				t.Fatalf("ParseCSR: %v", err)
			}
			if len(csr.URIs) != 1 || csr.URIs[0].String() != workload.String() {
				t.Errorf("URIs = %v, want [%s]", csr.URIs, workload)
			}
		})
	}
	t.Run("no SAN", func(t *testing.T) {
		if _, err := ca.ParseCSR(testca.CSR(t, testca.NewKey(t, testca.P256))); err != nil {
			t.Fatalf("ParseCSR: %v", err)
		}
	})
	t.Run("NEW CERTIFICATE REQUEST type and surrounding whitespace", func(t *testing.T) {
		der := csrDER(t, testca.CSR(t, testca.NewKey(t, testca.P256), workload.String()))
		in := "\n  " + string(pem.EncodeToMemory(&pem.Block{Type: "NEW CERTIFICATE REQUEST", Bytes: der})) + "\n\n"
		if _, err := ca.ParseCSR([]byte(in)); err != nil {
			t.Fatalf("ParseCSR: %v", err)
		}
	})
}

func TestParseCSRRejects(t *testing.T) {
	p256 := testca.NewKey(t, testca.P256)
	valid := testca.CSR(t, p256, workload.String())
	certPEM := testca.NewRoot(t, testca.P256).CertPEM()
	tests := []struct {
		name    string
		in      []byte
		wantMsg string
	}{
		{"empty", nil, "not PEM"},
		{"garbage", []byte("hello, CA"), "not PEM"},
		{"text before the block", append([]byte("x"), valid...), "not PEM"},
		{"truncated PEM", valid[:len(valid)/2], "malformed PEM"},
		{"wrong PEM type", certPEM, `type "CERTIFICATE"`},
		{"two PEM blocks", append(bytes.Clone(valid), valid...), "data after the PEM block"},
		{"trailing garbage", append(bytes.Clone(valid), "junk"...), "data after the PEM block"},
		{"oversize", append(bytes.Clone(valid), bytes.Repeat([]byte(" "), ca.MaxCSRSize)...), "exceeds the limit"},
		{"not DER inside PEM", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: []byte("nope")}), "parsing DER"},
		{"bad signature", tamperURI(t, valid), "signature"},
		{"RSA-1024 key", testca.CSR(t, testca.NewKey(t, testca.RSA1024), workload.String()), "RSA key of 1024 bits"},
		{"P-224 key", testca.CSR(t, testca.NewKey(t, testca.P224), workload.String()), "unsupported ECDSA curve P-224"},
		{"two URI SANs", testca.CSR(t, p256, workload.String(), "spiffe://cluster.local/ns/a/sa/b"), "2 URI SANs"},
		{"non-SPIFFE URI SAN", testca.CSR(t, p256, "https://example.com/x"), "not a SPIFFE ID"},
		{"DNS SAN", csrWith(t, &x509.CertificateRequest{DNSNames: []string{"a.example"}}), "DNS SANs"},
		{"IP SAN", csrWith(t, &x509.CertificateRequest{IPAddresses: []net.IP{net.IPv4(10, 0, 0, 1)}}), "IP SANs"},
		{"email SAN", csrWith(t, &x509.CertificateRequest{EmailAddresses: []string{"a@example.com"}}), "email SANs"},
		{"DNS SAN next to a URI", csrWith(t, &x509.CertificateRequest{DNSNames: []string{"a"}, URIs: []*url.URL{workload.URL()}}), "DNS SANs"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			csr, err := ca.ParseCSR(tt.in)
			if !errors.Is(err, ca.ErrInvalidCSR) {
				t.Fatalf("ParseCSR = %v, %v; want an error wrapping ErrInvalidCSR", csr, err)
			}
			if !strings.Contains(err.Error(), tt.wantMsg) {
				t.Errorf("error %q does not mention %q", err, tt.wantMsg)
			}
		})
	}
}

func csrWith(t *testing.T, tmpl *x509.CertificateRequest) []byte {
	t.Helper()
	tmpl.Subject = pkix.Name{CommonName: "x"}
	return testca.CSRFromTemplate(t, testca.NewKey(t, testca.P256), tmpl)
}

func csrDER(t *testing.T, pemBytes []byte) []byte {
	t.Helper()
	block, _ := pem.Decode(pemBytes)
	if block == nil {
		t.Fatal("no PEM block")
	}
	return block.Bytes
}

// tamperURI changes one byte of the signed content (in the URI SAN), which
// keeps the CSR well-formed but breaks its signature.
func tamperURI(t *testing.T, pemBytes []byte) []byte {
	t.Helper()
	der := bytes.Clone(csrDER(t, pemBytes))
	i := bytes.Index(der, []byte("/sa/default"))
	if i < 0 {
		t.Fatal("URI not found in CSR")
	}
	der[i+len("/sa/")] = 'D'
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})
}
