package main

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rsa"
	"fmt"

	// The KMS types --ca-key-uri accepts besides softkms (always there).
	// PKCS#11 needs cgo (it loads the HSM's module); a build without cgo
	// refuses pkcs11: URIs with an error that says so. The cloud KMSes are
	// reached over TLS, and the release image has no CA bundle: Mozilla's
	// roots are built in for when the system has none.
	_ "go.step.sm/crypto/kms/awskms"
	_ "go.step.sm/crypto/kms/azurekms"
	_ "go.step.sm/crypto/kms/cloudkms"
	_ "go.step.sm/crypto/kms/pkcs11"
	_ "golang.org/x/crypto/x509roots/fallback"
)

// keyAlgorithm names a public key's algorithm for logs, e.g. ecdsa-P-256.
func keyAlgorithm(pub crypto.PublicKey) string {
	switch k := pub.(type) {
	case *ecdsa.PublicKey:
		return "ecdsa-" + k.Curve.Params().Name
	case *rsa.PublicKey:
		return fmt.Sprintf("rsa-%d", k.N.BitLen())
	case ed25519.PublicKey:
		return "ed25519"
	}
	return fmt.Sprintf("%T", pub)
}
