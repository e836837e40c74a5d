package main

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/leaderelection"

	"github.com/workload-ca/workload-ca/authz"
	"github.com/workload-ca/workload-ca/authz/tokenreview"
	"github.com/workload-ca/workload-ca/ca"
	"github.com/workload-ca/workload-ca/ca/keystore"
	"github.com/workload-ca/workload-ca/ca/rotation"
	"github.com/workload-ca/workload-ca/ca/upstream/upstreamconfig"
	"github.com/workload-ca/workload-ca/internal/cliflag"
	"github.com/workload-ca/workload-ca/internal/leader"
	"github.com/workload-ca/workload-ca/istiodcert"
	"github.com/workload-ca/workload-ca/server"
	"github.com/workload-ca/workload-ca/trust/clustertrustbundle"
	"github.com/workload-ca/workload-ca/trust/federation"
)

// serveConfig is the validated configuration of `workload-ca serve`.
type serveConfig struct {
	ListenAddr  string
	TrustDomain spiffeid.TrustDomain
	CADir       string
	// CADirCreate lets a missing CADir be created, with a new self-signed
	// root in it.
	CADirCreate bool
	CARootDir   string
	// CAKeyURI names the signing key of CADir's certificate, or of
	// CARootDir's root, in a KMS or HSM instead of a key file.
	CAKeyURI string
	// UpstreamConfig is the file of --ca-upstream-config, Upstream what
	// it holds: the upstream CA that issues the intermediates.
	UpstreamConfig  string
	Upstream        *upstreamconfig.Config
	CASecret        types.NamespacedName
	CATTL           time.Duration
	Propagation     time.Duration
	Preview         time.Duration
	SkewMargin      time.Duration
	CAKeyType       string
	DefaultTTL      time.Duration
	MaxTTL          time.Duration
	ServingDNSNames []string
	ServingTTL      time.Duration
	TLSMinVersion   uint16
	Kubeconfig      string
	KubeQPS         float64
	KubeBurst       int
	TokenAudiences  []string
	TokenCacheTTL   time.Duration
	// TokenLocal decides pod-bound tokens of the cluster's issuer without
	// a TokenReview (--token-verification=local).
	TokenLocal       bool
	TokenKeysRefresh time.Duration
	ClusterID        string
	// RemoteSecrets watches the Secrets labelled istio/multiCluster=true
	// in RemoteSecretsNS for remote clusters; RemoteKubeconfigs are more,
	// by cluster id.
	RemoteSecrets     bool
	RemoteSecretsNS   string
	RemoteKubeconfigs map[string]string
	// FederationConfig is the file of --federation-config, Federation
	// its checked contents (nil: no federation).
	FederationConfig string
	Federation       *federation.Config
	NodeAgents       []authz.NodeAgent
	GracePeriod      time.Duration
	ShutdownDelay    time.Duration
	MaxConnAge       time.Duration
	LogLevel         slog.Level
	// LogText writes the logs as text (--log-format text) instead of JSON.
	LogText bool

	MaxConcurrentSigns int
	SignQueueTimeout   time.Duration
	MaxQueued          int
	MaxQueuedPerNode   int
	MaxStreams         int
	BusyConns          int
	BusyMaxStreams     int
	MaxConnIdle        time.Duration
	MaxConns           int
	AuthDeadline       time.Duration
	MaxUnauthPerAddr   int
	MaxHeaderBytes     int
	AdminAddr          string
	Pprof              bool
	AuditLog           string
	IstioMetrics       bool
	CADirPoll          time.Duration
	PublishTrustBundle bool
	PodCertificates    bool
	PodCertWorkers     int
	SignerName         string
	IstioCompatible    bool
	// IstioRootConfigMap publishes Istio's istio-ca-root-cert ConfigMap
	// in the namespaces IstioRootNamespaces selects.
	IstioRootConfigMap  bool
	IstioRootNamespaces labels.Selector
	// IstiodCert keeps istiod's serving certificate, for IstiodDNSNames,
	// in the Secret IstiodCertSecret of IstiodNamespace.
	IstiodCert       bool
	IstiodNamespace  string
	IstiodCertSecret string
	IstiodDNSNames   []string
	IstiodCertTTL    time.Duration
	LeaderElectionNS string
	// Validate checks the configuration and the CA material, prints what
	// would run and exits (--validate).
	Validate         bool
	LeaderElectionID string
	Lease            leader.Durations
}

// serveFlagValues are the flags' values before they are validated into
// a serveConfig.
type serveFlagValues struct {
	c                                                                       serveConfig
	td, tlsMin, logLevel, logFormat, caSecret, rootNamespaces, verification string
	dnsNames, audiences, agents, istiodNames, remoteKubeconfigs             cliflag.List
}

// serveFlags defines the flags of `workload-ca serve`, in sections: the
// one list the parser, the help and the generated configuration reference
// read.
func serveFlags() (*pflag.FlagSet, *serveFlagValues) {
	fs := cliflag.New("serve")
	v := &serveFlagValues{dnsNames: cliflag.List{"localhost"}, audiences: cliflag.List{tokenreview.DefaultAudience},
		agents: cliflag.List{"istio-system/ztunnel"}}
	c := &v.c
	fs.Section("General")
	fs.BoolVar(&c.Validate, "validate", false, "check the flags and the CA material that needs no API server (a directory, a plug-in root, a KMS or HSM key), print what would run, and exit without writing anything")
	fs.Section("Serving")
	fs.StringVar(&c.ListenAddr, "listen-addr", ":15012", "gRPC listen address")
	fs.Var(&v.dnsNames, "serving-dns-names", "comma-separated DNS names of the serving certificate (the names clients dial)")
	fs.DurationVar(&c.ServingTTL, "serving-ttl", 24*time.Hour, "lifetime of the serving certificate; renewed after two thirds")
	fs.StringVar(&v.tlsMin, "tls-min-version", "1.3", "minimum TLS version: 1.3 or 1.2")
	fs.Section("Identities and lifetimes")
	fs.StringVar(&v.td, "trust-domain", "cluster.local", "SPIFFE trust domain of issued identities")
	fs.DurationVar(&c.DefaultTTL, "default-ttl", 24*time.Hour, "lifetime of a certificate when the request names none")
	fs.DurationVar(&c.MaxTTL, "max-ttl", ca.DefaultMaxTTL, "longest certificate lifetime; longer requests are clamped. Certificates cannot be revoked: this is how long a stolen one stays usable")
	fs.Section("CA material")
	fs.StringVar(&c.CADir, "ca-dir", "", "directory of CA material (Istio cacerts or tls.crt/tls.key/ca.crt layout), hot-reloaded; a self-signed root is generated there when empty")
	fs.BoolVar(&c.CADirCreate, "ca-dir-create", false, "with --ca-dir: create the directory, and a self-signed root in it, when it does not exist; without this a missing directory is an error, so a mistyped path never starts a new CA (an existing empty directory still gets a generated root)")
	fs.StringVar(&v.caSecret, "ca-secret", "", "namespace/name of a Secret holding the CA's self-signed roots (or, with --ca-root-dir, intermediates) and rotation state; created by the first replica, rotated by the leader (instead of --ca-dir)")
	fs.StringVar(&c.CARootDir, "ca-root-dir", "", "with --ca-secret: directory of a plug-in root CA (root-cert.pem, signing root first, and root-key.pem; or tls.crt, tls.key, ca.crt), reloaded when it changes; the CA signs with intermediates it mints from the root and rotates, kept in the Secret without the root key; the trust bundle is the directory's roots")
	fs.StringVar(&c.CAKeyURI, "ca-key-uri", "", "KMS or HSM URI (go.step.sm/crypto: pkcs11:, awskms:, cloudkms:, azurekms:, softkms:) of the key of --ca-dir's signing certificate or of --ca-root-dir's root, which the directory then holds without a key file; give a PKCS#11 PIN in a file (pin-source=/path)")
	fs.StringVar(&c.UpstreamConfig, "ca-upstream-config", "", "with --ca-secret: YAML file naming an upstream CA (Vault or OpenBao PKI, or a cert-manager issuer) that issues the CA's intermediates to keys the CA generates; leaves are still signed here, the upstream is asked once per rotation, and the trust bundle is the upstream's root (see docs/upstream.md)")
	fs.StringVar(&c.CAKeyType, "ca-key-type", "ecdsa-p256", "key type of a generated root or intermediate: ecdsa-p256, ecdsa-p384, rsa-2048, rsa-3072, rsa-4096")
	fs.DurationVar(&c.CADirPoll, "ca-dir-poll-interval", 5*time.Second, "how often --ca-dir or --ca-root-dir is checked for changed material (hot reload)")
	fs.Section("Rotation (with --ca-secret)")
	fs.DurationVar(&c.CATTL, "ca-ttl", rotation.DefaultCATTL, "with --ca-secret: lifetime of each generated root (or intermediate, cut at the root's expiry); rotation prepares the next at half-life")
	fs.DurationVar(&c.Preview, "rotation-preview", 0, "with --ca-secret and --publish-trust-bundle: how long a new root is published only in a preview ClusterTrustBundle (k8s.spiffe.io/canarying: preview) before the live one holds it; the propagation delay counts from then (0: no preview stage)")
	fs.DurationVar(&c.Propagation, "rotation-propagation-delay", rotation.DefaultPropagationDelay, "with --ca-secret: least time a new root is in the trust bundle before it signs, and with --ca-root-dir a new signing root before its intermediates do (rotating intermediates needs none: the bundle does not change)")
	fs.DurationVar(&c.SkewMargin, "rotation-skew-margin", rotation.DefaultSkewMargin, "with --ca-secret: how long a retired root stays in the trust bundle beyond --max-ttl (clock skew, replicas that switch signer late)")
	fs.Section("Kubernetes API")
	fs.StringVar(&c.Kubeconfig, "kubeconfig", "", "kubeconfig file; in-cluster configuration when empty")
	fs.Float64Var(&c.KubeQPS, "kube-api-qps", 50, "sustained rate of Kubernetes API requests of each client: the TokenReviews, the pod index and each writer have a rate limit of their own, leader election a fixed one")
	fs.IntVar(&c.KubeBurst, "kube-api-burst", 100, "burst of Kubernetes API requests of each client")
	fs.Section("Authentication")
	fs.StringVar(&v.verification, "token-verification", "local", "local: decide pod-bound tokens of the cluster's issuer with its published keys and the pod and service account informers, and send the others to a TokenReview; tokenreview: a TokenReview for every new token")
	fs.Var(&v.audiences, "token-audiences", "comma-separated audiences a bearer token must carry")
	fs.DurationVar(&c.TokenCacheTTL, "token-cache-ttl", tokenreview.DefaultMaxCacheTTL, "upper bound on caching a token review (the token's expiry bounds it too)")
	fs.DurationVar(&c.TokenKeysRefresh, "token-keys-refresh", time.Minute, "how often the service account issuer's keys are fetched again; a token signed with a key the API server no longer lists stops being accepted within this long")
	fs.StringVar(&c.ClusterID, "cluster-id", "", "if set, refuse requests whose clusterid header names another cluster (Unauthenticated), as istiod does; Istio's default cluster id is Kubernetes")
	fs.Section("Multi-cluster (with --cluster-id)")
	fs.BoolVar(&c.RemoteSecrets, "remote-cluster-secrets", false, "serve the ztunnels of remote clusters configured by the Secrets labelled istio/multiCluster=true in --remote-cluster-secrets-namespace (istiod's remote secrets: each data key a cluster id, each value its kubeconfig), added, changed and removed without a restart; a request picks its cluster with its clusterid header")
	fs.StringVar(&c.RemoteSecretsNS, "remote-cluster-secrets-namespace", "", "namespace of the remote cluster Secrets (default: --leader-election-namespace, the CA's own)")
	fs.Var(&v.remoteKubeconfigs, "remote-kubeconfigs", "comma-separated cluster-id=kubeconfig-file of remote clusters to serve besides those of --remote-cluster-secrets, read at start")
	fs.Section("Federation")
	fs.StringVar(&c.FederationConfig, "federation-config", "", "YAML file: a SPIFFE bundle endpoint serving our roots, and the trust domains whose bundles we import (see docs/federation.md)")
	fs.Section("Authorization")
	fs.Var(&v.agents, "node-agents", "comma-separated namespace/serviceaccount of node agents that may request identities of pods on their node")
	fs.Section("Overload and connection limits")
	fs.IntVar(&c.MaxConcurrentSigns, "max-concurrent-signs", 0, "concurrent CSR checks and signatures (default: the number of CPUs the process may use; 64 when a KMS or HSM key of --ca-key-uri signs the leaves)")
	fs.DurationVar(&c.SignQueueTimeout, "sign-queue-timeout", server.DefaultQueueTimeout, "the longest a request waits for a signing slot; one whose turn would come later (or after its deadline) is refused at once with Unavailable and a time to come back")
	fs.IntVar(&c.MaxQueued, "max-queued-requests", server.DefaultMaxQueued, "requests that may wait for a signing slot; beyond, they are refused at once with Unavailable and a time to come back")
	fs.IntVar(&c.MaxQueuedPerNode, "max-queued-per-node", server.DefaultMaxQueuedPerNode, "requests from one node (its node agent and pods) that may wait for a signing slot, so that no node takes the queue")
	fs.IntVar(&c.MaxStreams, "max-streams-per-connection", server.DefaultMaxStreamsPerConnection, "requests one client connection may have in flight (HTTP/2 concurrent streams); a client wanting more queues them itself")
	fs.IntVar(&c.BusyConns, "busy-connections", server.DefaultBusyConnections, "open client connections from which a new connection may have only --busy-max-streams requests in flight, for as long as it lives; 0: every connection gets --max-streams-per-connection")
	fs.IntVar(&c.BusyMaxStreams, "busy-max-streams", server.DefaultBusyMaxStreams, "requests a connection accepted while --busy-connections are open may have in flight")
	fs.IntVar(&c.MaxConns, "max-connections", server.DefaultMaxConnections, "client connections open at once; a connection beyond waits to be accepted until one closes")
	fs.DurationVar(&c.AuthDeadline, "unauthenticated-connection-deadline", server.DefaultAuthDeadline, "close a client connection on which no caller has authenticated within this long of its being accepted (requests in flight then get as long again), freeing its slot; ztunnel and istio-agent send a CSR as soon as they connect; 0: never")
	fs.IntVar(&c.MaxUnauthPerAddr, "max-unauthenticated-connections-per-address", 0, "client connections from one source address on which no caller has authenticated yet; one beyond is closed at once; 0: no bound (a NAT or an east-west gateway puts many clients behind one address)")
	fs.DurationVar(&c.MaxConnIdle, "max-connection-idle", server.DefaultMaxConnectionIdle, "close a client connection no request has used for this long; 0: never")
	fs.DurationVar(&c.MaxConnAge, "max-connection-age", 30*time.Minute, "close each client connection after about this long (in-flight requests get --grace-period), so ztunnels spread over replicas added or restarted since they connected; 0: never")
	fs.IntVar(&c.MaxHeaderBytes, "max-header-bytes", server.DefaultMaxHeaderListSize, "request metadata of one request, as HTTP/2 counts it; a larger request is refused before any check")
	fs.Section("Shutdown")
	fs.DurationVar(&c.GracePeriod, "grace-period", 15*time.Second, "how long in-flight requests may take at shutdown")
	fs.DurationVar(&c.ShutdownDelay, "shutdown-delay", 5*time.Second, "how long the CA keeps serving, new connections included, after SIGTERM and before it drains: the time the cluster takes to stop routing to a terminating pod")
	fs.Section("Trust distribution (leader only)")
	fs.BoolVar(&c.PublishTrustBundle, "publish-trust-bundle", true, "publish the roots as ClusterTrustBundles (leader only)")
	fs.StringVar(&c.SignerName, "signer-name", clustertrustbundle.DefaultSignerName, "signer name of the published ClusterTrustBundles, and of the PodCertificateRequests signed with --pod-certificates")
	fs.BoolVar(&c.IstioCompatible, "istio-compatible", false, "also publish the roots as istio.io:istiod-ca:root-cert, the bundle Istio's charts mount")
	fs.BoolVar(&c.IstioRootConfigMap, "istio-root-configmap", false, "publish the roots as Istio's istio-ca-root-cert ConfigMap in every namespace (leader only), which sidecars and ztunnel mount unless Istio reads ClusterTrustBundles")
	fs.StringVar(&v.rootNamespaces, "istio-root-configmap-namespaces", "", "label selector of the namespaces that get the istio-ca-root-cert ConfigMap; empty: all")
	fs.BoolVar(&c.PodCertificates, "pod-certificates", false, "sign the PodCertificateRequests addressed to --signer-name (leader only): pods that mount a podCertificate projected volume get the X.509-SVID of their service account")
	fs.IntVar(&c.PodCertWorkers, "pod-certificate-workers", 4, "PodCertificateRequests decided at once with --pod-certificates (each waits for its status update)")
	fs.Section("istiod's serving certificate (leader only)")
	fs.BoolVar(&c.IstiodCert, "istiod-cert", false, "keep istiod's serving certificate issued by this CA in the Secret Istio's chart mounts for it (leader only), so that proxies verifying istiod's xDS port with our root can connect")
	fs.StringVar(&c.IstiodNamespace, "istiod-namespace", "istio-system", "with --istiod-cert: istiod's namespace, where the Secret is kept")
	fs.StringVar(&c.IstiodCertSecret, "istiod-cert-secret", istiodcert.DefaultSecretName, "with --istiod-cert: the Secret (kubernetes.io/tls: tls.crt, tls.key, ca.crt) istiod mounts at /var/run/secrets/istiod/tls; one not created by this CA is left alone")
	fs.Var(&v.istiodNames, "istiod-cert-dns-names", "with --istiod-cert: comma-separated DNS names of istiod's certificate (default istiod.<--istiod-namespace>.svc; add istiod-<revision>.<namespace>.svc for revisions, and any name proxies dial)")
	fs.DurationVar(&c.IstiodCertTTL, "istiod-cert-ttl", istiodcert.DefaultTTL, "with --istiod-cert: lifetime of istiod's certificate (clamped to --max-ttl); reissued after two thirds")
	fs.Section("Leader election")
	fs.StringVar(&c.LeaderElectionNS, "leader-election-namespace", "istio-system", "namespace of the leader election Lease (the CA's own namespace)")
	fs.StringVar(&c.LeaderElectionID, "leader-election-id", "workload-ca", "name of the leader election Lease")
	fs.DurationVar(&c.Lease.Lease, "leader-election-lease-duration", 15*time.Second, "how long a lease is valid without renewal")
	fs.DurationVar(&c.Lease.Renew, "leader-election-renew-deadline", 10*time.Second, "how long the leader retries renewing before it gives up")
	fs.DurationVar(&c.Lease.Retry, "leader-election-retry-period", 2*time.Second, "how often candidates retry")
	fs.Section("Observability")
	fs.StringVar(&c.AdminAddr, "admin-addr", ":15014", "HTTP address of /metrics, /healthz and /readyz")
	fs.StringVar(&v.logLevel, "log-level", "info", "log level: debug, info, warn, error")
	fs.StringVar(&v.logFormat, "log-format", "json", "log format: json (one object a line, for log pipelines) or text (key=value, for a terminal); audit records in --audit-log are always JSON")
	fs.StringVar(&c.AuditLog, "audit-log", "", "file for the audit records (one per decision); empty: with the other logs on stdout")
	fs.BoolVar(&c.IstioMetrics, "istio-metrics-compat", false, "also export istiod's citadel_server_* metrics")
	fs.BoolVar(&c.Pprof, "pprof", false, "serve /debug/pprof on the admin address")
	fs.Example("ca-dir", "/etc/cacerts")
	fs.Example("ca-secret", "istio-system/workload-ca")
	fs.Example("ca-root-dir", "/etc/root-ca")
	fs.Example("ca-key-uri", "pkcs11:token=ca;object=root?pin-source=/etc/pin")
	fs.Example("ca-upstream-config", "/etc/workload-ca/upstream.yaml")
	fs.Example("kubeconfig", "$HOME/.kube/config")
	fs.Example("cluster-id", "Kubernetes")
	fs.Example("audit-log", "/var/log/workload-ca/audit.log")
	fs.Example("istio-root-configmap-namespaces", "istio-injection=enabled")
	fs.Example("istiod-cert-dns-names", "istiod.istio-system.svc,istiod-canary.istio-system.svc")
	fs.Example("max-concurrent-signs", "2")
	fs.Example("remote-kubeconfigs", "east=/etc/remote/east.kubeconfig")
	fs.Example("remote-cluster-secrets-namespace", "istio-system")
	fs.Example("federation-config", "/etc/workload-ca/federation.yaml")
	return fs.Done(), v
}

// serveCommand is `workload-ca serve`.
func serveCommand() commandDef[serveConfig] {
	return commandDef[serveConfig]{
		use:   "serve",
		short: "Run the CA (gRPC IstioCertificateService)",
		long: `Runs the CA: the gRPC IstioCertificateService for ztunnel and istio-agent on
--listen-addr, metrics and health on --admin-addr, and, on the leader, the
trust distribution and rotation tasks. Exactly one of --ca-dir and
--ca-secret names the CA material; serve --validate checks it and exits.`,
		flags: func() (*pflag.FlagSet, func([]string) (serveConfig, error)) {
			fs, v := serveFlags()
			return fs, func([]string) (serveConfig, error) { return v.config() }
		},
		exclusive: [][]string{{"ca-dir", "ca-secret"}, {"ca-dir", "ca-root-dir"}},
		oneOf:     [][]string{{"ca-dir", "ca-secret"}},
		values: map[string][]string{
			"ca-key-type":        {"ecdsa-p256", "ecdsa-p384", "rsa-2048", "rsa-3072", "rsa-4096"},
			"tls-min-version":    {"1.3", "1.2"},
			"token-verification": {"local", "tokenreview"},
			"log-level":          {"debug", "info", "warn", "error"},
			"log-format":         {"json", "text"},
		},
		dirs:  []string{"ca-dir", "ca-root-dir"},
		files: []string{"kubeconfig", "audit-log", "federation-config", "ca-upstream-config"},
		run:   runServe,
	}
}

// config validates the parsed flags (environment variables
// WORKLOAD_CA_<FLAG> already applied) into the configuration, once.
func (v *serveFlagValues) config() (serveConfig, error) {
	c := &v.c
	c.ServingDNSNames, c.TokenAudiences, c.IstiodDNSNames = v.dnsNames, v.audiences, v.istiodNames
	switch v.logFormat {
	case "json":
	case "text":
		c.LogText = true
	default:
		return *c, fmt.Errorf("%w: --log-format %q: want json or text", errUsage, v.logFormat)
	}
	switch v.verification {
	case "local":
		c.TokenLocal = true
	case "tokenreview":
	default:
		return *c, fmt.Errorf("%w: --token-verification %q: want local or tokenreview", errUsage, v.verification)
	}
	err := c.finish(v.td, v.tlsMin, v.logLevel, v.caSecret, v.rootNamespaces, v.agents, v.remoteKubeconfigs)
	return *c, err
}

// finishCA checks the CA source: exactly one of --ca-dir and --ca-secret,
// --ca-root-dir only with --ca-secret, and a rotation policy that fits the
// leaf lifetimes.
func (c *serveConfig) finishCA(caSecret string) []error {
	switch {
	case c.CARootDir != "" && caSecret == "":
		return []error{errors.New("--ca-root-dir requires --ca-secret (the intermediates it issues are kept there)")}
	case c.UpstreamConfig != "" && caSecret == "":
		return []error{errors.New("--ca-upstream-config requires --ca-secret (the intermediates the upstream issues are kept there)")}
	case c.UpstreamConfig != "" && (c.CARootDir != "" || c.CAKeyURI != ""):
		return []error{errors.New("--ca-upstream-config excludes --ca-root-dir and --ca-key-uri: the upstream issues the intermediates, whose keys are kept in --ca-secret")}
	case c.CAKeyURI != "" && c.CADir == "" && c.CARootDir == "":
		return []error{errors.New("--ca-key-uri requires --ca-dir or --ca-root-dir (the directory of the key's certificate)")}
	case (c.CADir == "") == (caSecret == ""):
		return []error{errors.New("exactly one of --ca-dir and --ca-secret is required")}
	case c.CADir != "":
		return c.checkCADir()
	}
	ns, name, ok := strings.Cut(caSecret, "/")
	if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
		return []error{fmt.Errorf("--ca-secret %q: want namespace/name", caSecret)}
	}
	c.CASecret = types.NamespacedName{Namespace: ns, Name: name}
	if c.UpstreamConfig != "" {
		u, err := upstreamconfig.Load(c.UpstreamConfig, ns)
		if err != nil {
			return []error{fmt.Errorf("--ca-upstream-config: %w", err)}
		}
		c.Upstream = u
	}
	if _, err := c.rotationPolicy(); err != nil {
		if short := (*rotation.TooShortError)(nil); errors.As(err, &short) {
			return []error{fmt.Errorf("--ca-ttl %v is too short: the next CA is prepared at %.0f%% of its life, and what is left must cover --max-ttl %v plus --rotation-preview and --rotation-propagation-delay %v; want --ca-ttl of at least %v",
				short.CATTL, 100*short.PrepareAt, c.MaxTTL, c.Preview+c.Propagation, short.Least.Round(time.Hour))}
		}
		return []error{fmt.Errorf("rotation policy (--ca-ttl, --rotation-preview, --rotation-propagation-delay, --rotation-skew-margin, --max-ttl): %w", err)}
	}
	return nil
}

// checkCADir refuses a --ca-dir that does not exist unless
// --ca-dir-create asks for it: a mistyped path would otherwise start a new
// CA with a new root that nothing trusts.
func (c *serveConfig) checkCADir() []error {
	fi, err := os.Stat(c.CADir)
	switch {
	case err == nil && !fi.IsDir():
		return []error{fmt.Errorf("--ca-dir %s is not a directory", c.CADir)}
	case err == nil, errors.Is(err, os.ErrNotExist) && c.CADirCreate:
		return nil
	case errors.Is(err, os.ErrNotExist):
		return []error{fmt.Errorf("--ca-dir %s does not exist (a mistyped path?); --ca-dir-create makes it and a new self-signed root there", c.CADir)}
	}
	return []error{fmt.Errorf("--ca-dir: %w", err)}
}

// federatedBundles are the federated trust domains published as
// ClusterTrustBundles.
func (c *serveConfig) federatedBundles() []spiffeid.TrustDomain {
	return c.federatedWhere(func(p federation.Peer) bool { return p.ClusterTrustBundle })
}

// federatedRootConfigMaps are the federated trust domains added to Istio's
// root ConfigMaps.
func (c *serveConfig) federatedRootConfigMaps() []spiffeid.TrustDomain {
	return c.federatedWhere(func(p federation.Peer) bool { return p.IstioRootConfigMap })
}

// istiodNames are the names istiod's serving certificate is for:
// --istiod-dns-names, or the default for its namespace.
func (c *serveConfig) istiodNames() []string {
	if len(c.IstiodDNSNames) > 0 {
		return c.IstiodDNSNames
	}
	return istiodcert.DefaultDNSNames(c.IstiodNamespace)
}

func (c *serveConfig) federatedWhere(keep func(federation.Peer) bool) []spiffeid.TrustDomain {
	var out []spiffeid.TrustDomain
	if c.Federation != nil {
		for _, p := range c.Federation.Peers {
			if keep(p) {
				out = append(out, p.TrustDomain)
			}
		}
	}
	return out
}

// finishRemotes checks the remote clusters: they need --cluster-id (a
// request names its cluster, and the local one must have a name), and
// each --remote-kubeconfigs entry is id=file, with an id of its own.
func (c *serveConfig) finishRemotes(entries []string) []error {
	if !c.RemoteSecrets && len(entries) == 0 {
		return nil
	}
	var errs []error
	if c.ClusterID == "" {
		errs = append(errs, errors.New("--remote-cluster-secrets and --remote-kubeconfigs need --cluster-id, the id of this CA's own cluster (e.g. --cluster-id=Kubernetes)"))
	}
	if c.RemoteSecretsNS == "" {
		c.RemoteSecretsNS = c.LeaderElectionNS
	}
	c.RemoteKubeconfigs = map[string]string{}
	for _, e := range entries {
		id, path, ok := strings.Cut(e, "=")
		switch {
		case !ok || id == "" || path == "":
			errs = append(errs, fmt.Errorf("--remote-kubeconfigs %q: want cluster-id=kubeconfig-file", e))
		case id == c.ClusterID:
			errs = append(errs, fmt.Errorf("--remote-kubeconfigs %q: %q is this CA's own --cluster-id", e, id))
		case c.RemoteKubeconfigs[id] != "":
			errs = append(errs, fmt.Errorf("--remote-kubeconfigs: cluster %q given twice", id))
		default:
			c.RemoteKubeconfigs[id] = path
		}
	}
	return errs
}

// rotationPolicy is the rotation policy the flags describe; the longest
// leaf the CA issues bounds how long an old root must stay trusted.
func (c *serveConfig) rotationPolicy() (rotation.Policy, error) {
	if c.SkewMargin <= 0 {
		// Policy reads a zero margin as "the default"; refuse rather than
		// silently keep a retired root for an hour.
		return rotation.Policy{}, fmt.Errorf("--rotation-skew-margin %v must be positive", c.SkewMargin)
	}
	return rotation.Policy{CATTL: c.CATTL, PropagationDelay: c.Propagation, Preview: c.Preview, LeafMaxTTL: c.MaxTTL, SkewMargin: c.SkewMargin}.WithDefaults()
}

// finish parses the remaining string flags and validates the whole.
func (c *serveConfig) finish(td, tlsMin, logLevel, caSecret, rootNamespaces string, agents, remotes []string) error {
	var errs []error
	var err error
	if c.IstioRootNamespaces, err = labels.Parse(rootNamespaces); err != nil {
		errs = append(errs, fmt.Errorf("--istio-root-configmap-namespaces: %w", err))
	}
	if c.CAKeyURI != "" {
		if err := keystore.CheckKeyURI(c.CAKeyURI); err != nil {
			errs = append(errs, fmt.Errorf("--ca-key-uri: %w", err))
		}
	}
	if err := keystore.CheckKeyType(c.CAKeyType); err != nil {
		errs = append(errs, fmt.Errorf("--ca-key-type: %w", err))
	}
	if c.MaxConcurrentSigns == 0 {
		c.MaxConcurrentSigns = signsDefault(c)
	}
	if c.TrustDomain, err = spiffeid.TrustDomainFromString(td); err != nil {
		errs = append(errs, fmt.Errorf("--trust-domain: %w", err))
	}
	switch tlsMin {
	case "1.3":
		c.TLSMinVersion = tls.VersionTLS13
	case "1.2":
		c.TLSMinVersion = tls.VersionTLS12
	default:
		errs = append(errs, fmt.Errorf("--tls-min-version %q: want 1.3 or 1.2", tlsMin))
	}
	if err := c.LogLevel.UnmarshalText([]byte(logLevel)); err != nil {
		errs = append(errs, fmt.Errorf("--log-level: %w", err))
	}
	for _, a := range agents {
		na, err := authz.ParseNodeAgent(a)
		if err != nil {
			errs = append(errs, fmt.Errorf("--node-agents: %w", err))
		}
		c.NodeAgents = append(c.NodeAgents, na)
	}
	errs = append(errs, c.finishCA(caSecret)...)
	if c.DefaultTTL <= 0 || c.MaxTTL < c.DefaultTTL {
		errs = append(errs, fmt.Errorf("--default-ttl %v must be positive and at most --max-ttl %v", c.DefaultTTL, c.MaxTTL))
	}
	if len(c.ServingDNSNames) == 0 || c.ServingTTL <= 0 {
		errs = append(errs, errors.New("--serving-dns-names and a positive --serving-ttl are required"))
	}
	if c.KubeQPS <= 0 || c.KubeBurst <= 0 {
		errs = append(errs, errors.New("--kube-api-qps and --kube-api-burst must be positive"))
	}
	// client-go's own checks, with its jitter of the retry period (1.2).
	if c.LeaderElectionNS == "" || c.LeaderElectionID == "" || c.Lease.Retry <= 0 ||
		float64(c.Lease.Renew) <= leaderelection.JitterFactor*float64(c.Lease.Retry) || c.Lease.Lease <= c.Lease.Renew {
		errs = append(errs, errors.New("leader election: want a namespace and id, and lease duration > renew deadline > 1.2 × retry period > 0"))
	}
	if c.GracePeriod <= 0 || c.ShutdownDelay < 0 || c.MaxConnAge < 0 || c.MaxConnIdle < 0 || c.AuthDeadline < 0 || c.MaxUnauthPerAddr < 0 {
		errs = append(errs, errors.New("--grace-period must be positive; --shutdown-delay, --max-connection-age, --max-connection-idle, --unauthenticated-connection-deadline and --max-unauthenticated-connections-per-address not negative"))
	}
	if c.MaxConns <= 0 || c.MaxHeaderBytes < 1024 || c.MaxHeaderBytes > 1<<20 {
		errs = append(errs, errors.New("--max-connections must be positive, --max-header-bytes within 1 KiB and 1 MiB"))
	}
	if c.IstiodCert {
		if err := istiodcert.CheckNames(c.IstiodNamespace, c.IstiodCertSecret, c.IstiodDNSNames); err != nil {
			errs = append(errs, fmt.Errorf("--istiod-namespace, --istiod-cert-secret or --istiod-cert-dns-names: %w", err))
		}
		if c.IstiodCertTTL <= 0 {
			errs = append(errs, fmt.Errorf("--istiod-cert-ttl %v must be positive", c.IstiodCertTTL))
		}
	}
	if c.PodCertificates && c.MaxTTL < time.Hour {
		errs = append(errs, fmt.Errorf("--pod-certificates: --max-ttl %v is under the hour Kubernetes requires of a pod certificate", c.MaxTTL))
	}
	errs = append(errs, c.finishRemotes(remotes)...)
	if c.FederationConfig != "" && c.TrustDomain != (spiffeid.TrustDomain{}) {
		if c.Federation, err = federation.Load(c.FederationConfig, c.TrustDomain); err != nil {
			errs = append(errs, fmt.Errorf("--federation-config: %w", err))
		}
		for _, p := range c.federatedBundles() {
			if !c.PublishTrustBundle {
				errs = append(errs, fmt.Errorf("--federation-config: trust domain %s: clusterTrustBundle needs --publish-trust-bundle", p))
			}
		}
		for _, p := range c.federatedRootConfigMaps() {
			if !c.IstioRootConfigMap {
				errs = append(errs, fmt.Errorf("--federation-config: trust domain %s: istioRootConfigMap needs --istio-root-configmap", p))
			}
		}
	}
	if c.PodCertWorkers < 1 {
		errs = append(errs, errors.New("--pod-certificate-workers must be at least 1"))
	}
	if c.CADirPoll <= 0 {
		errs = append(errs, errors.New("--ca-dir-poll-interval must be positive"))
	}
	if c.SignQueueTimeout <= 0 || c.MaxQueued <= 0 || c.MaxQueuedPerNode <= 0 || c.MaxStreams <= 0 || c.BusyMaxStreams <= 0 {
		errs = append(errs, errors.New("--sign-queue-timeout, --max-queued-requests, --max-queued-per-node, --max-streams-per-connection and --busy-max-streams must be positive"))
	}
	if c.BusyConns < 0 {
		errs = append(errs, errors.New("--busy-connections must be 0 (no busy tier) or more"))
	}
	if c.TokenKeysRefresh <= 0 {
		errs = append(errs, errors.New("--token-keys-refresh must be positive"))
	}
	if len(c.TokenAudiences) == 0 {
		errs = append(errs, errors.New("--token-audiences must name at least one audience"))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%w: %w", errUsage, err)
	}
	return nil
}
