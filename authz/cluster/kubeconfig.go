package cluster

import (
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"slices"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// MaxKubeconfigBytes bounds a checked kubeconfig: a server, a CA bundle
// and a client certificate chain fit in a few KiB.
const MaxKubeconfigBytes = 64 << 10

// Reason says, as a metric label, why a kubeconfig was refused.
type Reason string

// The reasons a kubeconfig is refused.
const (
	ReasonTooLarge      Reason = "too-large"
	ReasonInvalid       Reason = "invalid"
	ReasonContext       Reason = "context"
	ReasonExec          Reason = "exec"
	ReasonAuthProvider  Reason = "auth-provider"
	ReasonFile          Reason = "file"
	ReasonProxy         Reason = "proxy"
	ReasonInsecure      Reason = "insecure-skip-tls-verify"
	ReasonNotHTTPS      Reason = "not-https"
	ReasonNoCA          Reason = "no-ca"
	ReasonNoCredential  Reason = "no-credential" //nolint:gosec // a reason label, not a credential
	ReasonBasicAuth     Reason = "basic-auth"
	ReasonImpersonation Reason = "impersonation"
)

// KubeconfigError is a kubeconfig refused by CheckKubeconfig. Its message
// names the entry and the field, never a value.
type KubeconfigError struct {
	Reason Reason
	msg    string
	err    error
}

func (e *KubeconfigError) Error() string {
	if e.err != nil {
		return e.msg + ": " + e.err.Error()
	}
	return e.msg
}

func (e *KubeconfigError) Unwrap() error { return e.err }

func refuse(reason Reason, format string, args ...any) *KubeconfigError {
	return &KubeconfigError{Reason: reason, msg: fmt.Sprintf(format, args...)}
}

// ReasonOf is the reason of a refusal (ReasonInvalid if err is not a
// KubeconfigError).
func ReasonOf(err error) Reason {
	if ke, ok := errors.AsType[*KubeconfigError](err); ok {
		return ke.Reason
	}
	return ReasonInvalid
}

// CheckKubeconfig parses a kubeconfig that someone other than the operator
// wrote (a remote cluster Secret) and returns the client configuration of
// its current context, built from the checked fields only. Every cluster,
// user and context it holds, used or not, may carry only:
//   - a cluster: an https server, its CA certificates inline
//     (certificate-authority-data), a TLS server name, disable-compression;
//   - a user: a bearer token inline, a client certificate and key inline;
//   - a context: a cluster and a user it names (its namespace is ignored).
//
// Anything that makes the CA run a command (exec), read a file
// (certificate-authority, client-certificate, client-key, tokenFile), use a
// proxy, skip TLS verification, talk plain http, present a password or
// impersonate someone, and any auth-provider plugin, is refused with a
// KubeconfigError that names the field. The current context is
// current-context, or the only context if there is one and
// current-context is empty. Nothing is read from files or the environment
// and nothing runs: the kubeconfig is only decoded.
func CheckKubeconfig(kubeconfig []byte) (*rest.Config, error) {
	if len(kubeconfig) > MaxKubeconfigBytes {
		return nil, refuse(ReasonTooLarge, "kubeconfig of %d bytes, over %d", len(kubeconfig), MaxKubeconfigBytes)
	}
	if len(kubeconfig) == 0 {
		return nil, refuse(ReasonInvalid, "empty kubeconfig")
	}
	// Load decodes only; files are read and paths resolved by the loading
	// rules and ClientConfig, which are not used here.
	cfg, err := clientcmd.Load(kubeconfig)
	if err != nil {
		return nil, &KubeconfigError{Reason: ReasonInvalid, msg: "kubeconfig", err: err}
	}
	for _, name := range slices.Sorted(maps.Keys(cfg.Clusters)) {
		if err := checkCluster(cfg.Clusters[name]); err != nil {
			err.msg = fmt.Sprintf("cluster %q: %s", name, err.msg)
			return nil, err
		}
	}
	for _, name := range slices.Sorted(maps.Keys(cfg.AuthInfos)) {
		if err := checkUser(cfg.AuthInfos[name]); err != nil {
			err.msg = fmt.Sprintf("user %q: %s", name, err.msg)
			return nil, err
		}
	}
	ctx, err := currentContext(cfg)
	if err != nil {
		return nil, err
	}
	c, u := cfg.Clusters[ctx.Cluster], cfg.AuthInfos[ctx.AuthInfo]
	return &rest.Config{
		Host:               c.Server,
		BearerToken:        u.Token,
		DisableCompression: c.DisableCompression,
		TLSClientConfig: rest.TLSClientConfig{
			ServerName: c.TLSServerName,
			CAData:     slices.Clone(c.CertificateAuthorityData),
			CertData:   slices.Clone(u.ClientCertificateData),
			KeyData:    slices.Clone(u.ClientKeyData),
		},
	}, nil
}

// currentContext is the context used, checked to name a cluster and a
// user that exist.
func currentContext(cfg *clientcmdapi.Config) (*clientcmdapi.Context, error) {
	name := cfg.CurrentContext
	if name == "" && len(cfg.Contexts) == 1 {
		for n := range cfg.Contexts {
			name = n
		}
	}
	if name == "" {
		return nil, refuse(ReasonContext, "no current-context, and %d contexts", len(cfg.Contexts))
	}
	ctx, ok := cfg.Contexts[name]
	switch {
	case !ok || ctx == nil:
		return nil, refuse(ReasonContext, "current-context %q: no such context", name)
	case cfg.Clusters[ctx.Cluster] == nil:
		return nil, refuse(ReasonContext, "context %q: no cluster %q", name, ctx.Cluster)
	case cfg.AuthInfos[ctx.AuthInfo] == nil:
		return nil, refuse(ReasonContext, "context %q: no user %q", name, ctx.AuthInfo)
	}
	return ctx, nil
}

func checkCluster(c *clientcmdapi.Cluster) *KubeconfigError {
	if c == nil {
		return refuse(ReasonInvalid, "empty")
	}
	u, err := url.Parse(c.Server)
	switch {
	case err != nil || u.Host == "":
		return refuse(ReasonInvalid, "server is not a URL with a host")
	case u.Scheme != "https":
		return refuse(ReasonNotHTTPS, "server: the scheme is %q, only https is allowed", u.Scheme)
	case u.User != nil:
		return refuse(ReasonInvalid, "server: a user or password in the URL is not allowed")
	case u.RawQuery != "" || u.Fragment != "":
		return refuse(ReasonInvalid, "server: a query or fragment is not allowed")
	case c.InsecureSkipTLSVerify:
		return refuse(ReasonInsecure, "insecure-skip-tls-verify is not allowed")
	case c.ProxyURL != "":
		return refuse(ReasonProxy, "proxy-url is not allowed")
	case c.CertificateAuthority != "":
		return refuse(ReasonFile, "certificate-authority (a file) is not allowed: use certificate-authority-data")
	case len(c.CertificateAuthorityData) == 0:
		return refuse(ReasonNoCA, "certificate-authority-data is required")
	}
	if !certificates(c.CertificateAuthorityData) {
		return refuse(ReasonNoCA, "certificate-authority-data holds no PEM certificate, or one that does not parse")
	}
	return nil
}

// certificates says whether b is PEM holding only certificates, at least
// one.
func certificates(b []byte) bool {
	n := 0
	for {
		var block *pem.Block
		if block, b = pem.Decode(b); block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			return false
		}
		if _, err := x509.ParseCertificate(block.Bytes); err != nil {
			return false
		}
		n++
	}
	return n > 0
}

func checkUser(u *clientcmdapi.AuthInfo) *KubeconfigError {
	if u == nil {
		return refuse(ReasonNoCredential, "empty")
	}
	switch {
	case u.Exec != nil:
		return refuse(ReasonExec, "exec (a command the CA would run) is not allowed")
	case u.AuthProvider != nil:
		return refuse(ReasonAuthProvider, "auth-provider %q is not allowed", u.AuthProvider.Name)
	case u.TokenFile != "":
		return refuse(ReasonFile, "tokenFile (a file) is not allowed: use token")
	case u.ClientCertificate != "":
		return refuse(ReasonFile, "client-certificate (a file) is not allowed: use client-certificate-data")
	case u.ClientKey != "":
		return refuse(ReasonFile, "client-key (a file) is not allowed: use client-key-data")
	case u.Username != "" || u.Password != "":
		return refuse(ReasonBasicAuth, "username and password are not allowed")
	case u.Impersonate != "" || u.ImpersonateUID != "" || len(u.ImpersonateGroups) > 0 || len(u.ImpersonateUserExtra) > 0:
		return refuse(ReasonImpersonation, "act-as (impersonation) is not allowed")
	case (len(u.ClientCertificateData) == 0) != (len(u.ClientKeyData) == 0):
		return refuse(ReasonNoCredential, "client-certificate-data and client-key-data go together")
	case u.Token == "" && len(u.ClientCertificateData) == 0:
		return refuse(ReasonNoCredential, "a token or a client certificate is required")
	}
	return nil
}
