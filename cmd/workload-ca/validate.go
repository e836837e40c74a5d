package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
)

// validateServe is `serve --validate`: the flags have been checked; it
// loads the CA material that needs no API server (a directory, a plug-in
// root directory, a KMS or HSM key), prints what serve would run, and
// returns. It writes nothing.
func validateServe(ctx context.Context, o serveOptions, stdout io.Writer) error {
	material, err := o.material.Describe(ctx)
	if err != nil {
		return err
	}
	w := &lines{w: stdout}
	m, s := o.material, o.serving
	w.printf("configuration valid; workload-ca serve would run:")
	w.printf("  trust domain %s; leaves %v by default, at most %v", m.TrustDomain.Name(), m.DefaultTTL, m.MaxTTL)
	w.printf("  CA: %s", material)
	w.printf("  gRPC on %s (serving names %s, %s or later), admin on %s", s.ListenAddr, strings.Join(s.DNSNames, ","),
		tls.VersionName(s.TLSMinVersion), o.process.AdminAddr)
	verification := "a TokenReview for every new token"
	if o.tokens.Local {
		verification = "pod-bound tokens of the cluster's issuer verified locally, others by TokenReview"
	}
	w.printf("  callers: audiences %s; %s; node agents %v", strings.Join(o.tokens.Audiences, ","), verification, o.clusters.NodeAgents)
	if o.policies.Enabled {
		w.printf("  requests also decided by the IssuancePolicy resources (every replica)")
	}
	o.describeClusters(w)
	o.describeFederation(w)
	w.printf("  leader election: Lease %s/%s", o.process.Leader.Namespace, o.process.Leader.Name)
	for _, task := range o.leaderTasks() {
		w.printf("  leader: %s", task)
	}
	return w.err
}

func (o *serveOptions) describeClusters(w *lines) {
	c := o.clusters
	if c.ID != "" {
		w.printf("  only requests for cluster %s", c.ID)
	}
	if c.RemoteSecrets {
		w.printf("  remote clusters: from the Secrets labelled istio/multiCluster=true in namespace %s", c.RemoteSecretsNS)
	}
	for _, id := range slices.Sorted(maps.Keys(c.RemoteKubeconfigs)) {
		w.printf("  remote cluster %s: kubeconfig %s", id, c.RemoteKubeconfigs[id])
	}
}

func (o *serveOptions) describeFederation(w *lines) {
	f := o.federation.Config
	if f == nil {
		return
	}
	if e := f.Endpoint; e != nil {
		w.printf("  SPIFFE bundle endpoint on %s, profile %s, refresh hint %v", e.Address, e.Profile, e.RefreshHint)
	}
	for _, p := range f.Peers {
		source := "file " + p.BundleFile
		if p.URL != "" {
			source = p.URL + " (" + p.Profile + ")"
		}
		w.printf("  federated trust domain %s from %s; in the ztunnel answer: %v", p.TrustDomain, source, p.Ztunnel)
	}
}

// leaderTasks names what the leader would run beyond leader election.
func (o *serveOptions) leaderTasks() []string {
	var tasks []string
	signer := o.bundles.SignerName
	if o.material.Secret.Name != "" {
		tasks = append(tasks, "rotation of the CA in its Secret")
	}
	if o.bundles.Publish {
		t := "ClusterTrustBundles of signer " + signer
		if o.bundles.IstioCompatible {
			t += " and istio.io:istiod-ca:root-cert"
		}
		tasks = append(tasks, t)
	}
	for _, td := range o.federation.BundlePeers() {
		tasks = append(tasks, "ClusterTrustBundles of signer "+signer+" with the roots of federated trust domain "+td.Name())
	}
	if o.rootCMs.Publish {
		sel := o.rootCMs.Namespaces.String()
		if sel == "" {
			sel = "every namespace"
		}
		t := "Istio's istio-ca-root-cert ConfigMap in " + sel
		if tds := o.federation.RootConfigMapPeers(); len(tds) > 0 {
			t += fmt.Sprintf(", with the roots of federated trust domains %v", tds)
		}
		tasks = append(tasks, t)
	}
	if o.istiod.Enabled {
		tasks = append(tasks, fmt.Sprintf("istiod's serving certificate in Secret %s/%s for %s", o.istiod.Namespace, o.istiod.SecretName, strings.Join(o.istiod.Names(), ",")))
	}
	if o.podCerts.Enabled {
		tasks = append(tasks, "PodCertificateRequests of signer "+signer)
	}
	return tasks
}

// lines writes lines, keeping the first error.
type lines struct {
	w   io.Writer
	err error
}

func (l *lines) printf(format string, args ...any) {
	if l.err == nil {
		_, l.err = fmt.Fprintf(l.w, format+"\n", args...)
	}
}
