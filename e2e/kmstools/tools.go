//go:build tools

// Package kmstools pins local-kms, an emulator of the AWS KMS API, against
// which the e2e suite runs the CA with awskms: key URIs. It is a module of
// its own so that its dependencies cannot move those of the control plane
// (e2e/tools) or of the product.
package kmstools

import _ "github.com/nsmithuk/local-kms"
