package main

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"go.step.sm/crypto/pemutil"
	"k8s.io/client-go/kubernetes"

	"github.com/workload-ca/workload-ca/trust/clustertrustbundle"
)

// inspectConfig is the validated configuration of `workload-ca inspect`.
type inspectConfig struct {
	Files      []string
	Bundle     string // --cluster-trust-bundle
	Signer     string // --signer
	Kubeconfig string
	JSON       bool
}

// inspectCommand is `workload-ca inspect`.
func inspectCommand() commandDef[inspectConfig] {
	return commandDef[inspectConfig]{
		use:   "inspect [PEM file...]",
		short: "Describe certificates or ClusterTrustBundles: identities, expiry, which root signs what",
		long: `Describes certificates (a chain, a root bundle, cert-chain.pem, root-cert.pem),
or the ClusterTrustBundles of a name or signer: identities, validity, and
which certificate signs which.`,
		flags:     inspectFlags,
		args:      true,
		exclusive: [][]string{{"cluster-trust-bundle", "signer"}},
		values:    map[string][]string{"output": {"text", "json"}},
		files:     []string{"kubeconfig"},
		run:       runInspect,
	}
}

func inspectFlags() (*pflag.FlagSet, func([]string) (inspectConfig, error)) {
	fs := newFlagSet("inspect")
	var c inspectConfig
	var output string
	fs.section("ClusterTrustBundles")
	fs.StringVar(&c.Bundle, "cluster-trust-bundle", "", "inspect the ClusterTrustBundle of this name")
	fs.StringVar(&c.Signer, "signer", "", "inspect every ClusterTrustBundle of this signer, e.g. workload-ca.io/spiffe")
	fs.StringVar(&c.Kubeconfig, "kubeconfig", "", "kubeconfig file for --cluster-trust-bundle and --signer (default: KUBECONFIG, then in-cluster)")
	fs.section("Output")
	fs.StringVar(&output, "output", "text", "output format: text or json")
	fs.example("cluster-trust-bundle", "workload-ca.io:spiffe:1f2e3d4c5b6a7988")
	fs.example("kubeconfig", "$HOME/.kube/config")
	return fs.done(), func(files []string) (inspectConfig, error) {
		c.Files = files
		switch output {
		case "text":
		case "json":
			c.JSON = true
		default:
			return c, fmt.Errorf("%w: --output %q: want text or json", errUsage, output)
		}
		switch {
		case c.Bundle != "" && c.Signer != "":
			return c, fmt.Errorf("%w: --cluster-trust-bundle and --signer are exclusive", errUsage)
		case len(c.Files) == 0 && c.Bundle == "" && c.Signer == "":
			return c, fmt.Errorf("%w: nothing to inspect: give PEM files, --cluster-trust-bundle NAME or --signer NAME (e.g. workload-ca inspect root-cert.pem)", errUsage)
		}
		return c, nil
	}
}

func runInspect(ctx context.Context, c inspectConfig, stdout, _ io.Writer) error {
	var sets []certSet
	for _, f := range c.Files {
		raw, err := os.ReadFile(f) //nolint:gosec // the files the user asked to inspect
		if err != nil {
			return err
		}
		certs, err := pemutil.ParseCertificateBundle(raw)
		if err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		sets = append(sets, certSet{Source: f, Certs: certs})
	}
	if c.Bundle != "" || c.Signer != "" {
		bundles, err := findBundles(ctx, c)
		if err != nil {
			return err
		}
		sets = append(sets, bundles...)
	}
	now := time.Now()
	var out []inspected
	for _, s := range sets {
		out = append(out, inspect(s, now)...)
	}
	if c.JSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(out)
	}
	writeInspected(stdout, out, now)
	return nil
}

// findBundles reads the ClusterTrustBundles c names from the API server.
func findBundles(ctx context.Context, c inspectConfig) ([]certSet, error) {
	cfg, err := loadRESTConfig(c.Kubeconfig)
	if err != nil {
		return nil, err
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	bundles, err := clustertrustbundle.Find(ctx, client, c.Bundle, c.Signer)
	if err != nil {
		return nil, err
	}
	if len(bundles) == 0 {
		return nil, fmt.Errorf("no ClusterTrustBundle %s", strings.TrimSpace("named "+c.Bundle+" "+signerPart(c.Signer)))
	}
	var sets []certSet
	for _, b := range bundles {
		certs, err := pemutil.ParseCertificateBundle([]byte(b.Spec.TrustBundle))
		if err != nil {
			return nil, fmt.Errorf("ClusterTrustBundle %s: %w", b.Name, err)
		}
		sets = append(sets, certSet{Source: "ClusterTrustBundle " + b.Name + signerPart(b.Spec.SignerName), Certs: certs})
	}
	return sets, nil
}

func signerPart(signer string) string {
	if signer == "" {
		return ""
	}
	return " (signer " + signer + ")"
}

// certSet is the certificates of one source: a file or a bundle.
type certSet struct {
	Source string
	Certs  []*x509.Certificate
}

// inspected is what inspect says of one certificate.
type inspected struct {
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

// inspect describes every certificate of s at now.
func inspect(s certSet, now time.Time) []inspected {
	roots, inter := x509.NewCertPool(), x509.NewCertPool()
	for _, c := range s.Certs {
		switch {
		case selfSigned(c):
			roots.AddCert(c)
		case c.IsCA:
			inter.AddCert(c)
		}
	}
	out := make([]inspected, 0, len(s.Certs))
	for i, c := range s.Certs {
		in := inspected{Source: s.Source, Index: i, Role: role(c), Subject: c.Subject.String(), DNSNames: c.DNSNames,
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

// writeInspected prints out for a terminal.
func writeInspected(w io.Writer, out []inspected, now time.Time) {
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
