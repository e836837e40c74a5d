//go:build tools

// Package vaulttools pins HashiCorp Vault (the github.com/hashicorp/vault
// module, its `vault` command, a go.mod tool), which the e2e suite and the
// bench run on loopback as the upstream CA whose PKI secrets engine issues
// workload-ca's intermediates. It is a module of its own so that Vault's
// dependencies cannot move those of the control plane (e2e/tools) or of
// the product.
//
// Vault's own go.mod replaces github.com/hashicorp/vault/sdk with its
// ./sdk directory, which a module zip does not hold, so the build takes a
// published sdk instead: the one Vault's go.mod names (replace below).
// That holds for Vault 1.19.0 and sdk v0.15.2, tagged six days apart. The
// releases after it do not build from what the module proxy serves: 1.20.x
// needs an sdk between v0.18.0 (no PluginRunner.Download) and v0.19.0
// (GetCloudSQLAuthOptions takes three arguments), and 1.21.x one between
// v0.20.0 and v0.24.0 (a two-argument ActivationFunc and the
// RestorePolicy that returns a name).
package vaulttools
