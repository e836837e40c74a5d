package keystore

import (
	"bytes"
	"crypto"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"time"

	"go.step.sm/crypto/x509util"

	"github.com/workload-ca/workload-ca/ca"
)

// IstioRootKeyFile is the key of the first certificate of root-cert.pem in
// a plug-in root directory (see LoadRootDir), where Istio's and istioctl's
// certificate tooling put it.
const IstioRootKeyFile = "root-key.pem"

// IntermediateCommonName is the common name of generated intermediates.
const IntermediateCommonName = "workload-ca intermediate"

// rootLayouts are the layouts of a plug-in root directory: root-cert.pem
// is both the signing root (its first certificate) and the bundle.
func rootLayouts() []layout {
	return []layout{
		{cert: IstioRootFile, key: IstioRootKeyFile, roots: IstioRootFile},
		{cert: TLSCertFile, key: TLSKeyFile, roots: TLSCAFile},
	}
}

// LoadRootDir reads a plug-in root CA from dir, the one that issues the
// CA's intermediates (see GenerateIntermediate). Two layouts:
//
//   - root-cert.pem and root-key.pem: the roots, the first of them the
//     signing root, and the signing root's key;
//   - tls.crt, tls.key and ca.crt (a cert-manager CA Secret): the signing
//     root and its key, and the roots.
//
// It returns the root as material: Signer is the root's key, Cert the
// signing root, Roots the trust bundle, Cert first, without repeats. The
// signing root must be in the bundle (a CA issued by another one is not a
// root: use it with --ca-dir instead) and nothing may come between it and
// the bundle; the material is validated at the current time. A non-nil key
// is the root's key, held outside the directory, as for LoadDir.
func LoadRootDir(dir string, key crypto.Signer) (*ca.Material, error) {
	return loadRootDir(dir, key, time.Now())
}

func loadRootDir(dir string, key crypto.Signer, now time.Time) (*ca.Material, error) {
	m, err := readDir(dir, rootLayouts(), key)
	if err == nil {
		err = asRoot(m)
	}
	if err == nil {
		err = m.Validate(now)
	}
	if err != nil {
		return nil, fmt.Errorf("ca-root-dir %s: %w", dir, err)
	}
	return m, nil
}

// asRoot checks that m's signing certificate is one of its roots, with
// nothing in between, and moves it to the front of the bundle.
func asRoot(m *ca.Material) error {
	same := func(c *x509.Certificate) bool { return bytes.Equal(c.Raw, m.Cert.Raw) }
	i := slices.IndexFunc(m.Roots, same)
	switch {
	case i < 0:
		return fmt.Errorf("%w: the signing certificate (subject %q) is not in the root bundle: a root CA is required",
			ca.ErrInvalidMaterial, m.Cert.Subject)
	case len(m.Intermediates) > 0:
		return fmt.Errorf("%w: %d certificates besides the root in the certificate file: the root must issue the intermediates itself",
			ca.ErrInvalidMaterial, len(m.Intermediates))
	}
	if err := issuesCAs(m.Cert); err != nil {
		return err
	}
	m.Roots = append([]*x509.Certificate{m.Cert}, slices.Delete(slices.Clone(m.Roots), i, i+1)...)
	return nil
}

// GenerateIntermediate returns a new intermediate CA issued by root (as
// LoadRootDir returns it) as signing material, with a new key of
// opts.KeyType: subject O=<trust domain>, CN=IntermediateCommonName, the
// trust domain's SPIFFE ID as URI SAN, a CA of path length 0 (it issues
// leaves only), key usage certSign and cRLSign, valid from an hour before
// now (but not before the root) for opts.Lifetime, cut at the root's
// expiry. Roots of the result is root.Roots. The result is validated at
// now, so a root that cannot issue it (expired, or whose path length
// constraint forbids it) is an error.
func GenerateIntermediate(root *ca.Material, opts GenerateOptions, now time.Time) (*ca.Material, error) {
	switch {
	case opts.TrustDomain.IsZero():
		return nil, errors.New("keystore: generate intermediate: trust domain is required")
	case root == nil || root.Signer == nil || root.Cert == nil || len(root.Roots) == 0:
		return nil, errors.New("keystore: generate intermediate: incomplete root")
	}
	if err := issuesCAs(root.Cert); err != nil {
		return nil, fmt.Errorf("keystore: generate intermediate: %w", err)
	}
	if opts.Lifetime <= 0 {
		opts.Lifetime = DefaultRootLifetime
	}
	notBefore, notAfter := now.Add(-backdate(opts.Lifetime)), now.Add(opts.Lifetime)
	if notBefore.Before(root.Cert.NotBefore) {
		notBefore = root.Cert.NotBefore
	}
	if notAfter.After(root.Cert.NotAfter) {
		notAfter = root.Cert.NotAfter
	}
	if !now.Before(notAfter) {
		return nil, fmt.Errorf("keystore: generate intermediate: the root expired at %s", root.Cert.NotAfter.UTC().Format(time.RFC3339))
	}
	signer, err := NewKey(opts.KeyType)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		Subject:               pkix.Name{Organization: []string{opts.TrustDomain.Name()}, CommonName: IntermediateCommonName},
		URIs:                  []*url.URL{opts.TrustDomain.ID().URL()},
		NotBefore:             notBefore,
		NotAfter:              notAfter,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLen:            0,
		MaxPathLenZero:        true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	// x509util fills in a random serial number and the subject key id;
	// crypto/x509 the authority key id, from the root's subject key id.
	cert, err := x509util.CreateCertificate(tmpl, root.Cert, signer.Public(), root.Signer)
	if err != nil {
		return nil, fmt.Errorf("keystore: generate intermediate: %w", err)
	}
	m := &ca.Material{Signer: signer, Cert: cert, Roots: slices.Clone(root.Roots)}
	if err := m.Validate(now); err != nil {
		return nil, fmt.Errorf("keystore: generate intermediate: %w", err)
	}
	return m, nil
}

// issuesCAs refuses a root whose path length constraint forbids an
// intermediate below it. Validating the intermediate does not catch it:
// the certificate being verified is not counted as an intermediate, the
// leaves it signs will be.
func issuesCAs(root *x509.Certificate) error {
	if root.BasicConstraintsValid && root.MaxPathLen == 0 {
		return fmt.Errorf("%w: root (subject %q) has path length 0: it cannot issue an intermediate", ca.ErrInvalidMaterial, root.Subject)
	}
	return nil
}
