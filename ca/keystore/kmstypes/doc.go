// Package kmstypes registers the KMS types a binary that imports it
// accepts in a key URI (keystore.OpenKey): softkms (always there), PKCS#11
// and, unless built with the tag nocloudkms, the cloud KMSes (cloud.go).
// PKCS#11 needs cgo (it loads the HSM's module); a build without cgo
// refuses pkcs11: URIs with an error that says so.
//
// It holds no code: which KMS types a program has is decided by importing
// it. It does not open keys (keystore does).
package kmstypes

import (
	// PKCS#11, besides softkms (always there).
	_ "go.step.sm/crypto/kms/pkcs11"
)
