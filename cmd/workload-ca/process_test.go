package main

import (
	"errors"
	"strings"
	"testing"

	"github.com/workload-ca/workload-ca/internal/cli"
	"github.com/workload-ca/workload-ca/internal/kubeclient"
)

// TestNoKubeConfiguration: outside a cluster and without a kubeconfig the
// error says what to give, not client-go's KUBERNETES_MASTER hint.
func TestNoKubeConfiguration(t *testing.T) {
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	t.Setenv("KUBERNETES_SERVICE_PORT", "")
	t.Setenv("KUBECONFIG", "")
	t.Setenv("HOME", t.TempDir())
	_, err := newKubeClients(kubeclient.Options{QPS: 1, Burst: 1})
	if !errors.Is(err, cli.ErrUsage) || !strings.Contains(err.Error(), "--kubeconfig") || strings.Contains(err.Error(), "KUBERNETES_MASTER") {
		t.Fatalf("newKubeClients = %v; want a usage error naming --kubeconfig", err)
	}
}
