package keystore_test

import (
	"testing"

	"go.step.sm/crypto/keyutil"

	"github.com/workload-ca/workload-ca/ca/keystore"
	"github.com/workload-ca/workload-ca/internal/testca"
)

// FuzzLoadDir feeds arbitrary bytes to the CA material files of the Istio
// layout: loading never panics, and material it accepts is whole (a key
// that matches the signing certificate, roots) and valid now.
func FuzzLoadDir(f *testing.F) {
	root := testca.NewRoot(f, testca.P256)
	mid := testca.NewIntermediate(f, root, testca.P256)
	f.Add(root.CertPEM(), root.KeyPEM(f), root.CertPEM(), []byte(nil))
	f.Add(mid.CertPEM(), mid.KeyPEM(f), root.CertPEM(), append(mid.CertPEM(), root.CertPEM()...))
	f.Add(mid.CertPEM(), root.KeyPEM(f), root.CertPEM(), []byte(nil))
	f.Add([]byte("-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n"), []byte("x"), []byte{}, []byte("y"))
	f.Fuzz(func(t *testing.T, cert, key, roots, chain []byte) {
		files := map[string][]byte{keystore.IstioCertFile: cert, keystore.IstioKeyFile: key, keystore.IstioRootFile: roots}
		if chain != nil {
			files[keystore.IstioChainFile] = chain
		}
		m, err := keystore.LoadDir(writeDir(t, files), nil)
		if err != nil {
			return
		}
		if m.Cert == nil || m.Signer == nil || len(m.Roots) == 0 || !keyutil.Equal(m.Cert.PublicKey, m.Signer.Public()) {
			t.Fatalf("accepted incomplete material: cert %v, signer %v, %d roots", m.Cert != nil, m.Signer != nil, len(m.Roots))
		}
	})
}
