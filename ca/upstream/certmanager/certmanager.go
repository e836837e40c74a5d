// Package certmanager is an upstream authority (package ca/upstream)
// backed by cert-manager: each intermediate is a CertificateRequest with
// isCA set, against a configured Issuer or ClusterIssuer, which brings
// every issuer cert-manager has (its CA issuer, Vault, Venafi, AWS Private
// CA, Google CAS) at once. The request is created in the CA's namespace,
// approved by cert-manager's approver (or approver-policy), signed by the
// issuer, read (its certificate only once the request is Approved and not
// Denied), and deleted: the CA Secret keeps the result.
//
// It speaks to the API server with the dynamic client, so the CA does not
// depend on cert-manager's Go module; the fields it reads and writes are
// those of cert-manager.io/v1, stable since cert-manager 1.0.
package certmanager

import (
	"context"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/workload-ca/workload-ca/ca/upstream"
)

// CertificateRequests is cert-manager's resource.
var CertificateRequests = schema.GroupVersionResource{Group: "cert-manager.io", Version: "v1", Resource: "certificaterequests"}

// Config says which issuer signs. Client, Namespace and IssuerName are
// required.
type Config struct {
	Client dynamic.Interface
	// Namespace is where the CertificateRequests are created (the CA's
	// own); an Issuer must be in it.
	Namespace string
	// IssuerName, IssuerKind ("Issuer" or "ClusterIssuer", default
	// "Issuer") and IssuerGroup (default "cert-manager.io"; an external
	// issuer's group otherwise) name the issuer.
	IssuerName, IssuerKind, IssuerGroup string
	// Poll is how often a pending request is read again (default 1s).
	Poll   time.Duration
	Logger *slog.Logger
}

// Authority signs the CA's intermediates through cert-manager.
type Authority struct {
	cfg Config
}

// New checks cfg and returns an Authority; it does not reach the API.
func New(cfg Config) (*Authority, error) {
	if cfg.Client == nil {
		return nil, errors.New("cert-manager: missing client")
	}
	cfg, err := cfg.WithDefaults()
	if err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Authority{cfg: cfg}, nil
}

// WithDefaults checks everything of cfg but Client and fills in the
// defaults.
func (cfg Config) WithDefaults() (Config, error) {
	if cfg.Namespace == "" || cfg.IssuerName == "" {
		return cfg, errors.New("cert-manager: missing namespace or issuer name")
	}
	if cfg.IssuerKind == "" {
		cfg.IssuerKind = "Issuer"
	}
	if cfg.IssuerKind != "Issuer" && cfg.IssuerKind != "ClusterIssuer" && cfg.IssuerGroup == "" {
		return cfg, fmt.Errorf("cert-manager: issuer kind %q: want Issuer or ClusterIssuer (or name the external issuer's group)", cfg.IssuerKind)
	}
	if cfg.IssuerGroup == "" {
		cfg.IssuerGroup = "cert-manager.io"
	}
	if cfg.Poll <= 0 {
		cfg.Poll = time.Second
	}
	return cfg, nil
}

// SignIntermediate creates a CertificateRequest (isCA, usages cert sign
// and crl sign, duration req.TTL) for req.CSR, waits until it is issued
// or refused, and deletes it.
func (a *Authority) SignIntermediate(ctx context.Context, req upstream.Request) (upstream.Issued, error) {
	csrPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: req.CSR.Raw})
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "cert-manager.io/v1",
		"kind":       "CertificateRequest",
		"metadata": map[string]any{
			"generateName": "workload-ca-intermediate-",
			"labels":       map[string]any{"app.kubernetes.io/managed-by": "workload-ca"},
		},
		"spec": map[string]any{
			"request":   base64.StdEncoding.EncodeToString(csrPEM), // a []byte field
			"isCA":      true,
			"duration":  req.TTL.String(),
			"usages":    []any{"cert sign", "crl sign"},
			"issuerRef": map[string]any{"name": a.cfg.IssuerName, "kind": a.cfg.IssuerKind, "group": a.cfg.IssuerGroup},
		},
	}}
	client := a.cfg.Client.Resource(CertificateRequests).Namespace(a.cfg.Namespace)
	created, err := client.Create(ctx, obj, metav1.CreateOptions{})
	if err != nil {
		return upstream.Issued{}, fmt.Errorf("cert-manager: create CertificateRequest in %s: %w", a.cfg.Namespace, err)
	}
	name := created.GetName()
	defer func() {
		// The CA Secret keeps the result; an abandoned request would be
		// issued for nobody. Best effort, beyond ctx.
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if err := client.Delete(dctx, name, metav1.DeleteOptions{}); err != nil {
			a.cfg.Logger.Warn("could not delete the CertificateRequest", "name", name, "error", err.Error())
		}
	}()
	for {
		got, err := client.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return upstream.Issued{}, fmt.Errorf("cert-manager: CertificateRequest %s/%s: %w", a.cfg.Namespace, name, err)
		}
		issued, done, err := parseStatus(got)
		if done || err != nil {
			if err != nil {
				err = fmt.Errorf("cert-manager: CertificateRequest %s/%s (issuer %s %s): %w", a.cfg.Namespace, name, a.cfg.IssuerKind, a.cfg.IssuerName, err)
			}
			return issued, err
		}
		select {
		case <-ctx.Done():
			return upstream.Issued{}, fmt.Errorf("cert-manager: CertificateRequest %s/%s not issued in time (%s): %w",
				a.cfg.Namespace, name, pending(got), ctx.Err())
		case <-time.After(a.cfg.Poll):
		}
	}
}

// ErrNotApproved is wrapped when a CertificateRequest carries a
// certificate without the condition Approved=True: cert-manager's issuers
// sign approved requests only, so someone else wrote its status.
var ErrNotApproved = errors.New("certificate on a request that is not approved")

// parseStatus reads a CertificateRequest: done with the certificate and
// its chain once issued and approved (status.certificate: the
// certificate, then the issuer's chain; status.ca: the issuer's root),
// done with an error once denied or failed, or issued without approval,
// not done otherwise.
func parseStatus(cr *unstructured.Unstructured) (upstream.Issued, bool, error) {
	approved := false
	for _, c := range conditions(cr) {
		switch {
		case c.typ == "Denied" && c.status == "True":
			return upstream.Issued{}, true, fmt.Errorf("denied: %s: %s", c.reason, c.message)
		case c.typ == "Ready" && c.status == "False" && c.reason == "Failed":
			return upstream.Issued{}, true, fmt.Errorf("failed: %s", c.message)
		case c.typ == "InvalidRequest" && c.status == "True":
			return upstream.Issued{}, true, fmt.Errorf("invalid request: %s", c.message)
		case c.typ == "Approved" && c.status == "True":
			approved = true
		}
	}
	certPEM, _, _ := unstructured.NestedString(cr.Object, "status", "certificate")
	if certPEM == "" {
		return upstream.Issued{}, false, nil
	}
	if !approved {
		return upstream.Issued{}, true, fmt.Errorf("%w: %w (want the condition Approved=True, set by cert-manager's approver or approver-policy)",
			upstream.ErrUpstream, ErrNotApproved)
	}
	certs, err := decodeCerts(certPEM)
	if err != nil {
		return upstream.Issued{}, true, fmt.Errorf("status.certificate: %w", err)
	}
	issued := upstream.Issued{Cert: certs[0], Chain: certs[1:]}
	if caPEM, _, _ := unstructured.NestedString(cr.Object, "status", "ca"); caPEM != "" {
		roots, err := decodeCerts(caPEM)
		if err != nil {
			return upstream.Issued{}, true, fmt.Errorf("status.ca: %w", err)
		}
		for _, r := range roots {
			if len(issued.Chain) == 0 || !issued.Chain[len(issued.Chain)-1].Equal(r) {
				issued.Chain = append(issued.Chain, r)
			}
		}
	}
	return issued, true, nil
}

// decodeCerts reads a []byte field of the API (base64 in JSON) holding
// PEM certificates.
func decodeCerts(b64 string) ([]*x509.Certificate, error) {
	raw, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		return nil, err
	}
	return upstream.ParseCertificates(raw)
}

type condition struct{ typ, status, reason, message string }

func conditions(cr *unstructured.Unstructured) []condition {
	raw, _, _ := unstructured.NestedSlice(cr.Object, "status", "conditions")
	var out []condition
	for _, r := range raw {
		m, _ := r.(map[string]any)
		str := func(k string) string { s, _ := m[k].(string); return s }
		out = append(out, condition{str("type"), str("status"), str("reason"), str("message")})
	}
	return out
}

// pending describes why a request is not issued yet, for the timeout error.
func pending(cr *unstructured.Unstructured) string {
	for _, c := range conditions(cr) {
		if c.typ == "Approved" && c.status == "True" {
			for _, r := range conditions(cr) {
				if r.typ == "Ready" {
					return "approved; ready " + r.status + ": " + r.reason + ": " + r.message
				}
			}
			return "approved, not signed"
		}
	}
	return "not approved"
}
