//go:build tools

// Package tools pins the control-plane binaries the e2e suite runs:
// kube-apiserver and etcd, built from their Go modules.
package tools

import (
	_ "go.etcd.io/etcd/server/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
)
