//go:build !nocloudkms

package kmstypes

// The cloud KMSes a key URI may name: awskms:, azurekms: and cloudkms:.
// Their SDKs are a quarter of the binary's packages. The race-enabled unit
// tests build without them (-tags nocloudkms): no unit test opens a cloud
// key, and compiling the SDKs once more, with -race, costs about a minute
// of a cold make test. Every binary that ships has them.
//
// The cloud KMSes are reached over TLS, and the release image has no CA
// bundle: Mozilla's roots are built in for when the system has none.
import (
	_ "go.step.sm/crypto/kms/awskms"
	_ "go.step.sm/crypto/kms/azurekms"
	_ "go.step.sm/crypto/kms/cloudkms"
	_ "golang.org/x/crypto/x509roots/fallback"
)
