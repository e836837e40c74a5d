// Package e2e holds the end-to-end suite (package e2e_test): the real
// workload-ca binary against a real kube-apiserver and etcd.
//
// One control plane (e2e/controlplane) and one `workload-ca serve`
// (e2e/cahost) run for the whole suite, started in TestMain; certificates
// are requested with the real `workload-ca request`. Run it with `make e2e`,
// which builds both and sets WORKLOAD_CA_CONTROLPLANE_BIN and
// WORKLOAD_CA_BINARY; without them every test skips. The demo (`make demo`)
// lives in e2e/demo.
package e2e
