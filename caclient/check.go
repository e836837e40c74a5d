package caclient

import (
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// CheckResponse checks a cert_chain as ztunnel does: the leaf first, whose
// first URI SAN is the requested identity; one certificate in each middle
// element; at least one root in the last element, which may hold several.
func CheckResponse(chain []string, want spiffeid.ID) (*Result, error) {
	if len(chain) < 2 {
		return nil, errors.New("response: no root certificate present")
	}
	leaf, err := firstCert(chain[0])
	if err != nil {
		return nil, fmt.Errorf("response leaf: %w", err)
	}
	if len(leaf.URIs) == 0 || leaf.URIs[0].String() != want.String() {
		return nil, fmt.Errorf("response leaf: SAN %v does not match the requested identity %s", leaf.URIs, want)
	}
	res := &Result{Leaf: leaf, PEM: chain}
	for _, elem := range chain[1 : len(chain)-1] {
		c, err := firstCert(elem)
		if err != nil {
			return nil, fmt.Errorf("response intermediate: %w", err)
		}
		res.Chain = append(res.Chain, c)
	}
	if res.Roots, err = allCerts(chain[len(chain)-1]); err != nil {
		return nil, fmt.Errorf("response root bundle: %w", err)
	}
	return res, nil
}

// Verify checks that the leaf chains to the returned roots for client and
// server authentication, as the workload's mTLS peers will.
func (r *Result) Verify() error {
	roots, inter := x509.NewCertPool(), x509.NewCertPool()
	for _, c := range r.Roots {
		roots.AddCert(c)
	}
	for _, c := range r.Chain {
		inter.AddCert(c)
	}
	// One usage at a time: crypto/x509 accepts a chain that allows any one
	// of KeyUsages.
	for _, usage := range []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth} {
		if _, err := r.Leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
			return err
		}
	}
	return nil
}

func firstCert(s string) (*x509.Certificate, error) {
	b, _ := pem.Decode([]byte(s))
	if b == nil || b.Type != "CERTIFICATE" {
		return nil, errors.New("no PEM certificate")
	}
	return x509.ParseCertificate(b.Bytes)
}

func allCerts(s string) ([]*x509.Certificate, error) {
	var certs []*x509.Certificate
	rest := []byte(s)
	for {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return nil, err
		}
		certs = append(certs, c)
	}
	if len(certs) == 0 {
		return nil, errors.New("no root certificate present")
	}
	return certs, nil
}
