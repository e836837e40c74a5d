package main

import (
	"context"
	"crypto"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"

	"github.com/workload-ca/workload-ca/ca"
	"github.com/workload-ca/workload-ca/ca/keystore"
)

// validateServe is `serve --validate`: the flags have been checked; it
// loads the CA material that needs no API server (a directory, a plug-in
// root directory, a KMS or HSM key), prints what serve would run, and
// returns. It writes nothing: a directory that would get a generated root
// is reported, not created.
func validateServe(ctx context.Context, c serveConfig, stdout io.Writer) error {
	var key crypto.Signer
	if c.CAKeyURI != "" {
		k, err := keystore.OpenKey(ctx, c.CAKeyURI)
		if err != nil {
			return err
		}
		defer func() { _ = k.Close() }()
		key = k
	}
	material, err := validateMaterial(c, key)
	if err != nil {
		return err
	}
	w := &lines{w: stdout}
	w.printf("configuration valid; workload-ca serve would run:")
	w.printf("  trust domain %s; leaves %v by default, at most %v", c.TrustDomain.Name(), c.DefaultTTL, c.MaxTTL)
	w.printf("  CA: %s", material)
	w.printf("  gRPC on %s (serving names %s, %s or later), admin on %s", c.ListenAddr, strings.Join(c.ServingDNSNames, ","),
		tls.VersionName(c.TLSMinVersion), c.AdminAddr)
	verification := "a TokenReview for every new token"
	if c.TokenLocal {
		verification = "pod-bound tokens of the cluster's issuer verified locally, others by TokenReview"
	}
	w.printf("  callers: audiences %s; %s; node agents %v", strings.Join(c.TokenAudiences, ","), verification, c.NodeAgents)
	if c.ClusterID != "" {
		w.printf("  only requests for cluster %s", c.ClusterID)
	}
	if c.RemoteSecrets {
		w.printf("  remote clusters: from the Secrets labelled istio/multiCluster=true in namespace %s", c.RemoteSecretsNS)
	}
	for _, id := range slices.Sorted(maps.Keys(c.RemoteKubeconfigs)) {
		w.printf("  remote cluster %s: kubeconfig %s", id, c.RemoteKubeconfigs[id])
	}
	if f := c.Federation; f != nil {
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
	w.printf("  leader election: Lease %s/%s", c.LeaderElectionNS, c.LeaderElectionID)
	for _, task := range leaderTasks(c) {
		w.printf("  leader: %s", task)
	}
	return w.err
}

// validateMaterial loads what the CA would sign with and describes it.
func validateMaterial(c serveConfig, key crypto.Signer) (string, error) {
	authorityCfg := ca.Config{TrustDomain: c.TrustDomain, DefaultTTL: c.DefaultTTL, MaxTTL: c.MaxTTL}
	check := func(m *ca.Material) error {
		_, err := ca.New(authorityCfg, m)
		return err
	}
	switch {
	case c.CADir != "":
		if _, err := os.Stat(c.CADir); errors.Is(err, os.ErrNotExist) {
			// parseServeFlags allowed it: --ca-dir-create.
			return fmt.Sprintf("directory %s would be created with a self-signed %s root", c.CADir, c.CAKeyType), nil
		}
		m, err := keystore.LoadDir(c.CADir, key)
		switch {
		case errors.Is(err, keystore.ErrNoMaterial) && key == nil:
			return fmt.Sprintf("directory %s is empty: a self-signed %s root would be generated there", c.CADir, c.CAKeyType), nil
		case err != nil:
			return "", fmt.Errorf("--ca-dir %s: %w", c.CADir, err)
		}
		if err := check(m); err != nil {
			return "", fmt.Errorf("--ca-dir %s: %w", c.CADir, err)
		}
		return fmt.Sprintf("directory %s: signs with %q until %s, %d roots", c.CADir, m.Cert.Subject.String(),
			m.Cert.NotAfter.UTC().Format("2006-01-02"), len(m.Roots)), nil
	case c.CARootDir != "":
		root, err := keystore.LoadRootDir(c.CARootDir, key)
		if err != nil {
			return "", fmt.Errorf("--ca-root-dir %s: %w", c.CARootDir, err)
		}
		return fmt.Sprintf("Secret %s (not read by --validate: it needs the API server), intermediates minted from root %q of %s, valid until %s",
			c.CASecret, root.Cert.Subject.String(), c.CARootDir, root.Cert.NotAfter.UTC().Format("2006-01-02")), nil
	case c.Upstream != nil:
		return fmt.Sprintf("Secret %s (not read by --validate: it needs the API server), %s intermediates of %v issued by %s (not reached by --validate)",
			c.CASecret, c.CAKeyType, c.CATTL, c.Upstream.Describe()), nil
	}
	return fmt.Sprintf("Secret %s (not read by --validate: it needs the API server), self-signed %s roots of %v, rotated at half-life",
		c.CASecret, c.CAKeyType, c.CATTL), nil
}

// leaderTasks names what the leader would run beyond leader election.
func leaderTasks(c serveConfig) []string {
	var tasks []string
	if c.CASecret.Name != "" {
		tasks = append(tasks, "rotation of the CA in its Secret")
	}
	if c.PublishTrustBundle {
		t := "ClusterTrustBundles of signer " + c.SignerName
		if c.IstioCompatible {
			t += " and istio.io:istiod-ca:root-cert"
		}
		tasks = append(tasks, t)
	}
	for _, td := range c.federatedBundles() {
		tasks = append(tasks, "ClusterTrustBundles of signer "+c.SignerName+" with the roots of federated trust domain "+td.Name())
	}
	if c.IstioRootConfigMap {
		sel := c.IstioRootNamespaces.String()
		if sel == "" {
			sel = "every namespace"
		}
		t := "Istio's istio-ca-root-cert ConfigMap in " + sel
		if tds := c.federatedRootConfigMaps(); len(tds) > 0 {
			t += fmt.Sprintf(", with the roots of federated trust domains %v", tds)
		}
		tasks = append(tasks, t)
	}
	if c.IstiodCert {
		tasks = append(tasks, fmt.Sprintf("istiod's serving certificate in Secret %s/%s for %s", c.IstiodNamespace, c.IstiodCertSecret, strings.Join(c.istiodNames(), ",")))
	}
	if c.PodCertificates {
		tasks = append(tasks, "PodCertificateRequests of signer "+c.SignerName)
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
