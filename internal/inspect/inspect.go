package inspect

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rsa"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"go.step.sm/crypto/pemutil"
)

// FromPEM is the set of the PEM certificates raw holds, from source.
func FromPEM(source string, raw []byte) (Set, error) {
	certs, err := pemutil.ParseCertificateBundle(raw)
	if err != nil {
		return Set{}, err
	}
	return Set{Source: source, Certs: certs}, nil
}

// Set is the certificates of one source: a file or a bundle.
type Set struct {
	Source string
	Certs  []*x509.Certificate
}

// Cert is what is said of one certificate.
type Cert struct {
	Source    string    `json:"source"`
	Index     int       `json:"index"`
	Role      string    `json:"role"` // leaf, intermediate, root
	Subject   string    `json:"subject,omitempty"`
	SPIFFEID  string    `json:"spiffe_id,omitempty"`
	DNSNames  []string  `json:"dns_names,omitempty"`
	Serial    string    `json:"serial"`
	Key       string    `json:"key"`
	NotBefore time.Time `json:"not_before"`
	NotAfter  time.Time `json:"not_after"`
	// Validity is "valid", "expired" or "not yet valid" at inspection.
	Validity string `json:"validity"`
	// MaxPathLen is a CA's path length constraint; -1: none.
	MaxPathLen *int `json:"max_path_len,omitempty"`
	// SignedBy is the index of the certificate of the same source that
	// signs it (a root: its own); nil when none of them does.
	SignedBy *int `json:"signed_by,omitempty"`
	// VerifiesTo is, for a leaf or intermediate, the index of the root of
	// the same source it verifies to now; VerifyError why it does not.
	VerifiesTo  *int   `json:"verifies_to,omitempty"`
	VerifyError string `json:"verify_error,omitempty"`
}

// Describe describes every certificate of s at now.
func Describe(s Set, now time.Time) []Cert {
	roots, inter := x509.NewCertPool(), x509.NewCertPool()
	for _, c := range s.Certs {
		switch {
		case selfSigned(c):
			roots.AddCert(c)
		case c.IsCA:
			inter.AddCert(c)
		}
	}
	out := make([]Cert, 0, len(s.Certs))
	for i, c := range s.Certs {
		in := Cert{Source: s.Source, Index: i, Role: role(c), Subject: c.Subject.String(), DNSNames: c.DNSNames,
			Serial: c.SerialNumber.String(), Key: keyName(c), NotBefore: c.NotBefore.UTC(), NotAfter: c.NotAfter.UTC(),
			Validity: validity(c, now)}
		if id, err := x509svid.IDFromCert(c); err == nil {
			in.SPIFFEID = id.String()
		}
		if c.IsCA {
			n := c.MaxPathLen
			if n == 0 && !c.MaxPathLenZero {
				n = -1
			}
			in.MaxPathLen = &n
		}
		for j, p := range s.Certs {
			if bytes.Equal(c.RawIssuer, p.RawSubject) && c.CheckSignatureFrom(p) == nil {
				in.SignedBy = &j
				break
			}
		}
		if in.Role != "root" {
			in.VerifiesTo, in.VerifyError = verifyTo(c, s.Certs, roots, inter, now)
		}
		out = append(out, in)
	}
	return out
}

// verifyTo verifies c with the roots and intermediates of its source, for
// any use, and returns the index of the root the chain ends in.
func verifyTo(c *x509.Certificate, certs []*x509.Certificate, roots, inter *x509.CertPool, now time.Time) (*int, string) {
	chains, err := c.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, CurrentTime: now,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
	if err != nil {
		var unknown x509.UnknownAuthorityError
		if errors.As(err, &unknown) {
			return nil, "no root of this source signs it"
		}
		return nil, err.Error()
	}
	top := chains[0][len(chains[0])-1]
	for j, r := range certs {
		if r.Equal(top) {
			return &j, ""
		}
	}
	return nil, "verifies to a root not in this source"
}

func selfSigned(c *x509.Certificate) bool {
	return c.IsCA && bytes.Equal(c.RawIssuer, c.RawSubject) && c.CheckSignatureFrom(c) == nil
}

func role(c *x509.Certificate) string {
	switch {
	case selfSigned(c):
		return "root"
	case c.IsCA:
		return "intermediate"
	}
	return "leaf"
}

func validity(c *x509.Certificate, now time.Time) string {
	switch {
	case now.Before(c.NotBefore):
		return "not yet valid"
	case now.After(c.NotAfter):
		return "expired"
	}
	return "valid"
}

func keyName(c *x509.Certificate) string {
	switch k := c.PublicKey.(type) {
	case *ecdsa.PublicKey:
		return "ECDSA " + k.Curve.Params().Name
	case *rsa.PublicKey:
		return fmt.Sprintf("RSA %d", k.N.BitLen())
	case ed25519.PublicKey:
		return "Ed25519"
	}
	return fmt.Sprintf("%T", c.PublicKey)
}

// WriteText prints out for a terminal.
func WriteText(w io.Writer, out []Cert, now time.Time) {
	source := ""
	for _, in := range out {
		if in.Source != source {
			source = in.Source
			fmt.Fprintf(w, "%s\n", source)
		}
		name := in.SPIFFEID
		if name == "" {
			name = in.Subject
		}
		if len(in.DNSNames) > 0 {
			name = strings.TrimSpace(name + " DNS:" + strings.Join(in.DNSNames, ","))
		}
		fmt.Fprintf(w, "  #%d %-12s %s\n", in.Index, in.Role, name)
		left := ""
		if in.Validity == "valid" {
			left = ", " + humanDuration(in.NotAfter.Sub(now)) + " left"
		}
		fmt.Fprintf(w, "     %s, serial %s, %s → %s (%s%s)\n", in.Key, in.Serial,
			in.NotBefore.Format(time.RFC3339), in.NotAfter.Format(time.RFC3339), in.Validity, left)
		if in.MaxPathLen != nil && *in.MaxPathLen >= 0 {
			fmt.Fprintf(w, "     CA, path length %d\n", *in.MaxPathLen)
		}
		switch {
		case in.Role == "root":
		case in.SignedBy != nil:
			fmt.Fprintf(w, "     signed by #%d", *in.SignedBy)
		default:
			fmt.Fprint(w, "     signed by a certificate not in this source")
		}
		switch {
		case in.Role == "root":
		case in.VerifiesTo != nil:
			fmt.Fprintf(w, "; verifies to root #%d\n", *in.VerifiesTo)
		default:
			fmt.Fprintf(w, "; does not verify: %s\n", in.VerifyError)
		}
	}
}

// humanDuration is d in days beyond two days, else to the minute.
func humanDuration(d time.Duration) string {
	if d > 48*time.Hour {
		return fmt.Sprintf("%dd", int(d.Hours()/24))
	}
	return d.Round(time.Minute).String()
}
