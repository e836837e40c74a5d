package ca

import (
	"encoding/base64"
	"strings"
)

const (
	pemCertHeader = "-----BEGIN CERTIFICATE-----\n"
	pemCertFooter = "-----END CERTIFICATE-----\n"
	// pemLineBytes is how many DER bytes one 64-character PEM line holds.
	pemLineBytes = 48
)

// encodeCert returns the PEM of a DER certificate, byte for byte what
// encoding/pem writes (RFC 7468: 64-character lines), in one allocation.
// It runs for every issued leaf, where pem.EncodeToMemory's growing buffer,
// encoder and string copy made three times the garbage.
func encodeCert(der []byte) string {
	enc := base64.StdEncoding
	lines := (len(der) + pemLineBytes - 1) / pemLineBytes
	var b strings.Builder
	b.Grow(len(pemCertHeader) + enc.EncodedLen(len(der)) + lines + len(pemCertFooter))
	b.WriteString(pemCertHeader)
	var line [64 + 1]byte
	for len(der) > 0 {
		n := min(len(der), pemLineBytes)
		m := enc.EncodedLen(n)
		enc.Encode(line[:m], der[:n])
		line[m] = '\n'
		b.Write(line[:m+1])
		der = der[n:]
	}
	b.WriteString(pemCertFooter)
	return b.String()
}
