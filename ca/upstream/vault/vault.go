// Package vault is an upstream authority (package ca/upstream) backed by
// the PKI secrets engine of HashiCorp Vault or OpenBao: each intermediate
// is signed by <mount>/root/sign-intermediate, or by
// <mount>/issuer/<issuer>/sign-intermediate when an issuer is named, the
// endpoint that issues CA certificates (a role's sign endpoint issues
// leaves only). The CA authenticates with Vault's Kubernetes auth method
// (a service-account token from a file the configuration names, logged in
// for each request and the Vault token revoked after it) or with a token
// read from a file at each request (rotated by whatever writes it, such as
// Vault Agent). Vault is reached over https only.
//
// No token file is read by default: the pod's own service-account token
// (/var/run/secrets/kubernetes.io/serviceaccount/token) is for the API
// server's audience and may read the CA Secret, so it must never be sent
// to Vault; a projected token with Vault's audience is (the chart mounts
// one).
//
// The Vault policy the CA needs is update on that one path:
//
//	path "pki/root/sign-intermediate" { capabilities = ["update"] }
package vault

import (
	"context"
	"encoding/pem"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/hashicorp/vault/api"
	k8sauth "github.com/hashicorp/vault/api/auth/kubernetes"

	"github.com/workload-ca/workload-ca/ca/upstream"
)

// Config says which Vault signs and how the CA logs in. Address and Mount
// are required, and exactly one of TokenFile and KubernetesRole (with
// KubernetesTokenFile).
type Config struct {
	// Address is Vault's https URL, such as https://vault.example.com:8200;
	// http is refused (the tokens and the CA's intermediates would cross
	// the network in the clear, and anyone on the path could answer).
	Address string
	// CAFile is a PEM bundle that verifies Vault's TLS certificate;
	// empty: the system's roots.
	CAFile string
	// Namespace is a Vault Enterprise namespace; empty: none.
	Namespace string
	// Mount is the PKI secrets engine's mount path, such as "pki".
	Mount string
	// Issuer names the mount's issuer that signs; empty: its default.
	Issuer string
	// TokenFile holds a Vault token, read at each request.
	TokenFile string
	// KubernetesRole is the role of Vault's Kubernetes auth method to log
	// in as, with the service-account token in KubernetesTokenFile
	// (required: a projected token whose audience is Vault's, never the
	// pod's API token), at the auth mount KubernetesMount (default
	// "kubernetes").
	KubernetesRole      string
	KubernetesMount     string
	KubernetesTokenFile string
}

// Authority signs the CA's intermediates with Vault's PKI engine.
type Authority struct {
	cfg    Config
	client *api.Client
}

// New checks cfg and returns an Authority; it does not reach Vault.
func New(cfg Config) (*Authority, error) {
	switch {
	case cfg.Address == "":
		return nil, errors.New("vault: missing address")
	case cfg.Mount == "":
		return nil, errors.New("vault: missing PKI mount")
	case (cfg.TokenFile == "") == (cfg.KubernetesRole == ""):
		return nil, errors.New("vault: want exactly one of a token file and a Kubernetes auth role")
	case cfg.KubernetesRole != "" && cfg.KubernetesTokenFile == "":
		return nil, errors.New("vault: Kubernetes auth needs the file of a service-account token for Vault's audience " +
			"(a projected token); the pod's own API token is never sent to Vault")
	}
	if err := checkAddress(cfg.Address); err != nil {
		return nil, err
	}
	cfg.Mount = strings.Trim(cfg.Mount, "/")
	if cfg.KubernetesRole != "" && cfg.KubernetesMount == "" {
		cfg.KubernetesMount = "kubernetes"
	}
	// An explicit configuration: the client's defaults would read VAULT_*
	// environment variables. No retries of its own: the rotation retries
	// with backoff.
	conf := &api.Config{Address: cfg.Address, MaxRetries: 0}
	if err := conf.ConfigureTLS(&api.TLSConfig{CACert: cfg.CAFile}); err != nil {
		return nil, fmt.Errorf("vault: TLS: %w", err)
	}
	client, err := api.NewClient(conf)
	if err != nil {
		return nil, fmt.Errorf("vault: %w", err)
	}
	client.ClearToken() // NewClient takes VAULT_TOKEN from the environment
	if cfg.Namespace != "" {
		client.SetNamespace(cfg.Namespace)
	} else {
		client.ClearNamespace()
	}
	return &Authority{cfg: cfg, client: client}, nil
}

// checkAddress accepts an https URL of a host, without credentials,
// query or fragment.
func checkAddress(address string) error {
	u, err := url.Parse(address)
	switch {
	case err != nil:
		return fmt.Errorf("vault: address: %w", err)
	case u.Scheme != "https":
		return fmt.Errorf("vault: address %q: want https (Vault's tokens and the CA's intermediates must not cross the network in the clear)", address)
	case u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "":
		return fmt.Errorf("vault: address %q: want https://host[:port][/path]", address)
	}
	return nil
}

// signPath is the endpoint that signs intermediates.
func (a *Authority) signPath() string {
	if a.cfg.Issuer != "" {
		return a.cfg.Mount + "/issuer/" + a.cfg.Issuer + "/sign-intermediate"
	}
	return a.cfg.Mount + "/root/sign-intermediate"
}

// SignIntermediate has Vault sign req.CSR as a CA of path length 0, with
// the CSR's subject and SANs, for req.TTL (Vault cuts it to the mount's
// max TTL and its issuer's expiry), constrained to the trust domain's
// URIs if asked.
func (a *Authority) SignIntermediate(ctx context.Context, req upstream.Request) (upstream.Issued, error) {
	client, logout, err := a.login(ctx)
	if err != nil {
		return upstream.Issued{}, err
	}
	defer logout()
	data := map[string]any{
		"csr":             string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: req.CSR.Raw})),
		"use_csr_values":  true,
		"max_path_length": 0,
		"ttl":             fmt.Sprintf("%ds", int64(req.TTL/time.Second)),
		"format":          "pem",
	}
	if req.NameConstraints {
		data["permitted_uri_domains"] = []string{req.TrustDomain.Name()}
	}
	path := a.signPath()
	secret, err := client.Logical().WriteWithContext(ctx, path, data)
	if err != nil {
		return upstream.Issued{}, fmt.Errorf("vault: %s at %s: %w", path, a.cfg.Address, err)
	}
	issued, err := parseAnswer(secret)
	if err != nil {
		return upstream.Issued{}, fmt.Errorf("vault: %s: %w", path, err)
	}
	return issued, nil
}

// login returns a client with a token: the token file's, or a new one
// from the Kubernetes auth method, which logout revokes.
func (a *Authority) login(ctx context.Context) (*api.Client, func(), error) {
	client, err := a.client.CloneWithHeaders()
	if err != nil {
		return nil, nil, fmt.Errorf("vault: %w", err)
	}
	if a.cfg.TokenFile != "" {
		raw, err := os.ReadFile(a.cfg.TokenFile)
		if err != nil {
			return nil, nil, fmt.Errorf("vault: token file: %w", err)
		}
		token := strings.TrimSpace(string(raw))
		if token == "" {
			return nil, nil, fmt.Errorf("vault: token file %s is empty", a.cfg.TokenFile)
		}
		client.SetToken(token)
		return client, func() {}, nil
	}
	method, err := k8sauth.NewKubernetesAuth(a.cfg.KubernetesRole,
		k8sauth.WithServiceAccountTokenPath(a.cfg.KubernetesTokenFile), k8sauth.WithMountPath(a.cfg.KubernetesMount))
	if err != nil {
		return nil, nil, fmt.Errorf("vault: kubernetes auth: %w", err)
	}
	if _, err := client.Auth().Login(ctx, method); err != nil {
		return nil, nil, fmt.Errorf("vault: kubernetes auth login (role %q, mount %q) at %s: %w",
			a.cfg.KubernetesRole, a.cfg.KubernetesMount, a.cfg.Address, err)
	}
	logout := func() {
		// Best effort: the token expires by its TTL anyway.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = client.Auth().Token().RevokeSelfWithContext(ctx, "")
	}
	return client, logout, nil
}

// parseAnswer reads sign-intermediate's answer (format pem): certificate,
// and ca_chain, which starts with the certificate itself, then its
// issuer and upward; issuing_ca stands in for a missing chain.
func parseAnswer(secret *api.Secret) (upstream.Issued, error) {
	if secret == nil || secret.Data == nil {
		return upstream.Issued{}, errors.New("empty answer")
	}
	certPEM, _ := secret.Data["certificate"].(string)
	certs, err := upstream.ParseCertificates([]byte(certPEM))
	switch {
	case err != nil:
		return upstream.Issued{}, fmt.Errorf("answer's certificate: %w", err)
	case len(certs) != 1:
		return upstream.Issued{}, fmt.Errorf("answer's certificate: %d PEM certificates, want one", len(certs))
	}
	issued := upstream.Issued{Cert: certs[0]}
	var chain []string
	if raw, ok := secret.Data["ca_chain"].([]any); ok {
		for _, x := range raw {
			s, _ := x.(string)
			chain = append(chain, s)
		}
	}
	if len(chain) == 0 {
		s, _ := secret.Data["issuing_ca"].(string)
		chain = []string{s}
	}
	for i, s := range chain {
		certs, err := upstream.ParseCertificates([]byte(s))
		if err != nil {
			return upstream.Issued{}, fmt.Errorf("answer's ca_chain %d: %w", i, err)
		}
		for _, c := range certs {
			if !c.Equal(issued.Cert) {
				issued.Chain = append(issued.Chain, c)
			}
		}
	}
	return issued, nil
}
