// Package vaultserver runs a real Vault server on loopback for the e2e
// suite and the bench (the program e2e/vaulttools/vaultserver: Vault's core
// and HTTP API with its PKI engine and Kubernetes auth method): file
// storage (so that it can be stopped and started again with its PKI
// intact), initialized with one unseal key, unsealed at each start, and set
// up as the upstream CA of workload-ca: a PKI secrets engine with a root of
// its own, a policy that may only sign intermediates, and the Kubernetes
// auth method or a token for it.
package vaultserver

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"time"

	vaultapi "github.com/hashicorp/vault/api"

	"github.com/workload-ca/workload-ca/e2e/internal/proc"
)

// EnvBinary names the Vault binary the Makefile builds (make vault).
const EnvBinary = "WORKLOAD_CA_VAULT"

// Policy is the name of the policy Setup writes: update on
// pki/root/sign-intermediate, nothing else.
const Policy = "workload-ca"

// Server is one Vault server process and its root token's client.
type Server struct {
	bin, dir string
	// Addr is host:port of its HTTP API.
	Addr      string
	p         *proc.Process
	log       *os.File
	unsealKey string
	// Client holds the root token.
	Client *vaultapi.Client
}

// Start starts Vault in dir (created) on free loopback ports, initializes
// and unseals it.
func Start(ctx context.Context, bin, dir string) (*Server, error) {
	if err := os.MkdirAll(filepath.Join(dir, "data"), 0o755); err != nil {
		return nil, err
	}
	s := &Server{bin: bin, dir: dir}
	err := proc.RetryPorts(func() error {
		ports, err := proc.FreePorts(1)
		if err != nil {
			return err
		}
		s.Addr = "127.0.0.1:" + strconv.Itoa(ports[0])
		return s.run(ctx)
	})
	if err != nil {
		return nil, fmt.Errorf("vault: %w", err)
	}
	init, err := s.Client.Sys().InitWithContext(ctx, &vaultapi.InitRequest{SecretShares: 1, SecretThreshold: 1})
	if err != nil {
		return nil, errors.Join(fmt.Errorf("vault operator init: %w", err), s.Stop())
	}
	s.unsealKey = init.Keys[0]
	s.Client.SetToken(init.RootToken)
	if err := s.unseal(ctx); err != nil {
		return nil, errors.Join(err, s.Stop())
	}
	return s, nil
}

// run starts the server process and waits until its API answers.
func (s *Server) run(ctx context.Context) error {
	log, err := os.OpenFile(s.LogPath(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	p, err := proc.Start("vault", s.bin, []string{"-addr", s.Addr, "-data", filepath.Join(s.dir, "data"), "-log-level", "info"},
		proc.Environ(), log, log, proc.InDir(s.dir))
	if err != nil {
		log.Close()
		return err
	}
	s.p, s.log = p, log
	if s.Client == nil {
		if s.Client, err = vaultapi.NewClient(&vaultapi.Config{Address: "http://" + s.Addr}); err != nil {
			return errors.Join(err, s.Stop())
		}
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+s.Addr+"/v1/sys/health", http.NoBody)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
			return nil
		}
		if p.Exited() {
			return errors.Join(fmt.Errorf("vault exited: %w", p.StartupError()), s.Stop())
		}
		select {
		case <-ctx.Done():
			return errors.Join(fmt.Errorf("vault does not answer: %w", err), s.Stop())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (s *Server) unseal(ctx context.Context) error {
	if _, err := s.Client.Sys().UnsealWithContext(ctx, s.unsealKey); err != nil {
		return fmt.Errorf("vault unseal: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		h, err := s.Client.Sys().HealthWithContext(ctx)
		if err == nil && h.Initialized && !h.Sealed && !h.Standby {
			return nil
		}
		if err == nil {
			err = fmt.Errorf("health: initialized %v, sealed %v, standby %v", h.Initialized, h.Sealed, h.Standby)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("vault is not active after unsealing: %w", err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// LogPath is the server's log file.
func (s *Server) LogPath() string { return filepath.Join(s.dir, "vault.log") }

// Tail is the end of the running server's output.
func (s *Server) Tail() string {
	if s.p == nil {
		return ""
	}
	return s.p.Tail()
}

// Stop stops the server (SIGTERM, then SIGKILL) and waits for it.
func (s *Server) Stop() error {
	if s.p == nil {
		return nil
	}
	err := s.p.Terminate(10 * time.Second)
	s.log.Close()
	s.p = nil
	return err
}

// Restart starts the server again on the same address and unseals it.
func (s *Server) Restart(ctx context.Context) error {
	if err := s.run(ctx); err != nil {
		return err
	}
	return s.unseal(ctx)
}

// SetUpPKI mounts the PKI secrets engine at pki, generates its root (the
// company's root, for a test) and writes Policy. It returns the root.
func (s *Server) SetUpPKI(ctx context.Context) (*x509.Certificate, error) {
	if err := s.Client.Sys().MountWithContext(ctx, "pki", &vaultapi.MountInput{Type: "pki",
		Config: vaultapi.MountConfigInput{MaxLeaseTTL: "87600h"}}); err != nil {
		return nil, fmt.Errorf("vault secrets enable pki: %w", err)
	}
	gen, err := s.Client.Logical().WriteWithContext(ctx, "pki/root/generate/internal",
		map[string]any{"common_name": "Example Corp Root CA", "ttl": "87600h", "key_type": "ec"})
	if err != nil {
		return nil, fmt.Errorf("vault pki root: %w", err)
	}
	certPEM, _ := gen.Data["certificate"].(string)
	block, _ := pem.Decode([]byte(certPEM))
	if block == nil {
		return nil, errors.New("vault pki root: no certificate in the answer")
	}
	root, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return nil, err
	}
	if err := s.Client.Sys().PutPolicyWithContext(ctx, Policy,
		`path "pki/root/sign-intermediate" { capabilities = ["update"] }`); err != nil {
		return nil, fmt.Errorf("vault policy: %w", err)
	}
	return root, nil
}

// EnableKubernetesAuth enables the Kubernetes auth method against the API
// server at host (CA bundle caPEM), reviewing login tokens with
// reviewerJWT (a token allowed to create TokenReviews), and a role
// "workload-ca" for service account ns/sa with audience "vault" and
// Policy.
func (s *Server) EnableKubernetesAuth(ctx context.Context, host string, caPEM []byte, reviewerJWT, ns, sa string) error {
	if err := s.Client.Sys().EnableAuthWithOptionsWithContext(ctx, "kubernetes", &vaultapi.EnableAuthOptions{Type: "kubernetes"}); err != nil {
		return fmt.Errorf("vault auth enable kubernetes: %w", err)
	}
	writes := []struct {
		path string
		data map[string]any
	}{
		{"auth/kubernetes/config", map[string]any{"kubernetes_host": host, "kubernetes_ca_cert": string(caPEM),
			"token_reviewer_jwt": reviewerJWT, "disable_local_ca_jwt": true}},
		{"auth/kubernetes/role/workload-ca", map[string]any{"bound_service_account_names": []string{sa},
			"bound_service_account_namespaces": []string{ns}, "audience": "vault", "token_policies": []string{Policy}, "token_ttl": "10m"}},
	}
	for _, w := range writes {
		if _, err := s.Client.Logical().WriteWithContext(ctx, w.path, w.data); err != nil {
			return fmt.Errorf("vault write %s: %w", w.path, err)
		}
	}
	return nil
}

// PolicyToken creates a token of Policy alone, valid for ttl.
func (s *Server) PolicyToken(ctx context.Context, ttl time.Duration) (string, error) {
	sec, err := s.Client.Auth().Token().CreateWithContext(ctx, &vaultapi.TokenCreateRequest{Policies: []string{Policy},
		TTL: ttl.String(), NoParent: true})
	if err != nil {
		return "", fmt.Errorf("vault token create: %w", err)
	}
	return sec.Auth.ClientToken, nil
}

// HTTPS serves Vault's API over TLS on another loopback port, as the CA
// requires (it refuses http:// addresses): a reverse proxy to the server
// that stays up while the server stops and starts (answering 502 then).
// It returns the https URL, a PEM file (in the server's directory) of the
// certificate that verifies it, and a close function.
func (s *Server) HTTPS() (string, string, func(), error) {
	target, err := url.Parse("http://" + s.Addr)
	if err != nil {
		return "", "", nil, err
	}
	srv := httptest.NewTLSServer(httputil.NewSingleHostReverseProxy(target))
	caFile := filepath.Join(s.dir, "https-ca.pem")
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600); err != nil {
		srv.Close()
		return "", "", nil, err
	}
	return srv.URL, caFile, srv.Close, nil
}
