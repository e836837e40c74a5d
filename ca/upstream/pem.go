package upstream

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
)

// ParseCertificates parses the CERTIFICATE blocks of an upstream's PEM
// answer, in order; any other block, trailing data or none at all is an
// error.
func ParseCertificates(b []byte) ([]*x509.Certificate, error) {
	rest := b
	var out []*x509.Certificate
	for {
		var blk *pem.Block
		blk, rest = pem.Decode(rest)
		if blk == nil {
			break
		}
		if blk.Type != "CERTIFICATE" {
			return nil, fmt.Errorf("PEM block %q, want CERTIFICATE", blk.Type)
		}
		c, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	if len(out) == 0 || len(bytes.TrimSpace(rest)) != 0 {
		return nil, errors.New("no PEM certificate, or trailing data")
	}
	return out, nil
}
