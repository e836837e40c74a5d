package keystore

import (
	"bytes"
	"crypto"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"slices"
	"strings"

	"go.step.sm/crypto/pemutil"

	"github.com/workload-ca/workload-ca/ca"
)

// load reads the layout's files. The first certificate of the cert file is
// the signing certificate; the rest of it and the optional chain file are
// intermediates, except copies of the signing certificate or of a root,
// which chain files may include. A nil key is read from the layout's key
// file.
func (l layout) load(r *os.Root, key crypto.Signer) (*ca.Material, error) {
	certs, err := readCerts(r, l.cert)
	if err != nil {
		return nil, err
	}
	if key == nil {
		if key, err = readKey(r, l.key); err != nil {
			return nil, err
		}
	}
	roots, err := readCerts(r, l.roots)
	if err != nil {
		return nil, err
	}
	above := slices.Clone(certs[1:])
	if l.chain != "" {
		chain, err := readOptionalCerts(r, l.chain)
		if err != nil {
			return nil, err
		}
		above = append(above, chain...)
	}
	roots = dedupe(roots, nil)
	return &ca.Material{
		Signer:        key,
		Cert:          certs[0],
		Intermediates: dedupe(above, append([]*x509.Certificate{certs[0]}, roots...)),
		Roots:         roots,
	}, nil
}

func readCerts(r *os.Root, name string) ([]*x509.Certificate, error) {
	data, err := r.ReadFile(name)
	if err != nil {
		return nil, err
	}
	certs, err := pemutil.ParseCertificateBundle(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return certs, nil
}

func readOptionalCerts(r *os.Root, name string) ([]*x509.Certificate, error) {
	ok, err := exists(r, name)
	if err != nil || !ok {
		return nil, err
	}
	return readCerts(r, name)
}

// readKey parses the first private key block of the file (PKCS#1, PKCS#8
// or SEC1), skipping blocks such as the "EC PARAMETERS" openssl writes
// first.
func readKey(r *os.Root, name string) (crypto.Signer, error) {
	data, err := r.ReadFile(name)
	if err != nil {
		return nil, err
	}
	for block, rest := pem.Decode(data); block != nil; block, rest = pem.Decode(rest) {
		if !strings.HasSuffix(block.Type, "PRIVATE KEY") {
			continue
		}
		key, err := pemutil.Parse(pem.EncodeToMemory(block), pemutil.WithFilename(name))
		if err != nil {
			return nil, err
		}
		signer, ok := key.(crypto.Signer)
		if !ok {
			return nil, fmt.Errorf("%s: key of type %T cannot sign", name, key)
		}
		return signer, nil
	}
	return nil, fmt.Errorf("%s: no PEM private key found", name)
}

// dedupe returns certs without repeats and without any cert in exclude,
// keeping the first occurrence's order.
func dedupe(certs, exclude []*x509.Certificate) []*x509.Certificate {
	var out []*x509.Certificate
	for _, c := range certs {
		seen := func(x *x509.Certificate) bool { return bytes.Equal(x.Raw, c.Raw) }
		if !slices.ContainsFunc(exclude, seen) && !slices.ContainsFunc(out, seen) {
			out = append(out, c)
		}
	}
	return out
}
