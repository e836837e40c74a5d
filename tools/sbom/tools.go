//go:build tools

// Package sbom pins cyclonedx-gomod, which writes the CycloneDX SBOM of
// each binary in the container image from the module list the Go
// toolchain embeds in it. A module of its own, so that its dependencies
// cannot move the linters' (tools/go.mod) or the product's.
package sbom

import _ "github.com/CycloneDX/cyclonedx-gomod/cmd/cyclonedx-gomod"
