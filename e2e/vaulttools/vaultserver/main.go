// Command vault-server is the Vault server the e2e suite and the bench run
// as workload-ca's upstream CA: HashiCorp Vault's own server core and HTTP
// API (github.com/hashicorp/vault/vault, .../http) with its PKI secrets
// engine and the Kubernetes auth method as the builtin plugins, on file
// storage, on a plain-HTTP loopback listener. It starts uninitialized and
// sealed (first run) or sealed (restart), as `vault server` does with a
// storage "file" stanza and no seal stanza, and is initialized and unsealed
// over the API (sys/init, sys/unseal). system, identity, cubbyhole, token
// and kv are wired by the core itself.
//
// Why not the `vault` command: its builtin registry compiles every plugin
// Vault ships (the Azure SDKs alone are 115 MB of source), about 2,450
// packages against about 1,550 here, which would double the cold build of
// the e2e suite's tools on two cores for code these tests never run.
//
// Which Vault: Vault's go.mod replaces github.com/hashicorp/vault/sdk with
// its ./sdk directory, which a module zip does not hold, so the build takes
// the published sdk its go.mod names (the replace in ../go.mod). That holds
// for Vault 1.19.0 and sdk v0.15.2, tagged six days apart. Later releases
// do not build from what the module proxy serves: 1.20.x needs an sdk
// between v0.18.0 (no PluginRunner.Download) and v0.19.0
// (GetCloudSQLAuthOptions takes three arguments), 1.21.x one between
// v0.20.0 and v0.24.0 (a two-argument ActivationFunc and the RestorePolicy
// that returns a name).
package main

import (
	"context"
	"errors"
	"flag"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sort"
	"syscall"
	"time"

	metrics "github.com/armon/go-metrics"
	hclog "github.com/hashicorp/go-hclog"
	aeadwrapper "github.com/hashicorp/go-kms-wrapping/wrappers/aead/v2"
	kubeauth "github.com/hashicorp/vault-plugin-auth-kubernetes"
	"github.com/hashicorp/vault/builtin/logical/pki"
	"github.com/hashicorp/vault/helper/metricsutil"
	vaulthttp "github.com/hashicorp/vault/http"
	"github.com/hashicorp/vault/internalshared/configutil"
	"github.com/hashicorp/vault/sdk/helper/consts"
	"github.com/hashicorp/vault/sdk/logical"
	physfile "github.com/hashicorp/vault/sdk/physical/file"
	"github.com/hashicorp/vault/vault"
	"github.com/hashicorp/vault/vault/plugincatalog"
	vaultseal "github.com/hashicorp/vault/vault/seal"
)

// registry is a plugincatalog.BuiltinRegistry holding only pki (secrets) and
// kubernetes (auth). The factories MUST be stored as the named type
// logical.Factory: sdk/plugin/plugin.go:54 and plugin_v5.go:80 type-assert
// the value returned by Get's func to logical.Factory, and a bare
// func(context.Context, *logical.BackendConfig) (logical.Backend, error)
// boxed in an interface{} would fail that assertion ("unsupported backend
// type").
type registry struct {
	secrets     map[string]logical.Factory
	credentials map[string]logical.Factory
}

var _ plugincatalog.BuiltinRegistry = (*registry)(nil)

func (r *registry) table(t consts.PluginType) map[string]logical.Factory {
	switch t {
	case consts.PluginTypeSecrets:
		return r.secrets
	case consts.PluginTypeCredential:
		return r.credentials
	}
	return nil // databases and anything else: none
}

func (r *registry) Contains(name string, t consts.PluginType) bool {
	_, ok := r.table(t)[name]
	return ok
}

func (r *registry) Get(name string, t consts.PluginType) (func() (interface{}, error), bool) {
	f, ok := r.table(t)[name]
	if !ok {
		return nil, false
	}
	return func() (interface{}, error) { return f, nil }, true
}

func (r *registry) Keys(t consts.PluginType) []string {
	keys := make([]string, 0, len(r.table(t)))
	for k := range r.table(t) {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func (r *registry) DeprecationStatus(name string, t consts.PluginType) (consts.DeprecationStatus, bool) {
	if r.Contains(name, t) {
		return consts.Supported, true
	}
	return consts.Unknown, false
}

func (r *registry) IsBuiltinEntPlugin(string, consts.PluginType) bool { return false }

func main() {
	addr := flag.String("addr", "127.0.0.1:8200", "loopback host:port for the HTTP API (port 0 picks one)")
	dataDir := flag.String("data", "", "directory for the file storage backend (required)")
	logLevel := flag.String("log-level", "info", "trace, debug, info, warn, error")
	flag.Parse()

	logger := hclog.NewInterceptLogger(&hclog.LoggerOptions{
		Name:   "vault-server",
		Level:  hclog.LevelFromString(*logLevel),
		Output: os.Stderr,
	})
	fail := func(msg string, args ...interface{}) {
		logger.Error(msg, args...)
		os.Exit(1)
	}
	if *dataDir == "" {
		fail("-data is required")
	}
	if err := os.MkdirAll(*dataDir, 0o700); err != nil {
		fail("creating data dir", "error", err)
	}

	// Listen first, so that -addr=127.0.0.1:0 resolves before the core
	// records its api address.
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		fail("listen", "addr", *addr, "error", err)
	}
	apiAddr := "http://" + ln.Addr().String()

	// storage "file" { path = ... }  (command/commands_full.go:59)
	backend, err := physfile.NewFileBackend(map[string]string{"path": *dataDir}, logger.Named("storage.file"))
	if err != nil {
		fail("file storage", "error", err)
	}

	// The Shamir seal `vault server` builds when no seal stanza is given
	// (command/server.go setSeal, case "1 enabled shamir"), identical to the
	// default CreateCore installs for a nil Seal (vault/core.go:1180-1189).
	shamir := aeadwrapper.NewShamirWrapper()
	access, err := vaultseal.NewAccessFromWrapper(logger.Named("seal.shamir"), shamir, vault.SealConfigTypeShamir.String())
	if err != nil {
		fail("seal access", "error", err)
	}
	barrierSeal := vault.NewDefaultSeal(access)

	reg := &registry{
		secrets:     map[string]logical.Factory{"pki": pki.Factory},
		credentials: map[string]logical.Factory{"kubernetes": kubeauth.Factory},
	}

	coreConfig := &vault.CoreConfig{
		Physical:        backend,
		StorageType:     "file",
		Seal:            barrierSeal,
		BuiltinRegistry: reg, // must be non-nil: vault/logical_system.go:1443 (sys/mounts listing)
		// Empty: pki/kubernetes come through the plugin catalog as builtins,
		// like in `vault server`; system/identity/cubbyhole/token/kv are added
		// by the core itself.
		LogicalBackends:    map[string]logical.Factory{},
		CredentialBackends: map[string]logical.Factory{},
		Logger:             logger,
		AllLoggers:         []hclog.Logger{logger},
		LogLevel:           *logLevel,
		RedirectAddr:       apiAddr,
		ClusterAddr:        "", // single node: clustering disabled (vault/cluster.go:346)
		DisableMlock:       true,
		// sys/metrics dereferences it (vault/logical_system.go:4403).
		MetricsHelper: metricsutil.NewMetricsHelper(metrics.NewInmemSink(10*time.Second, time.Minute), false),
	}

	core, err := vault.NewCore(coreConfig)
	if err != nil {
		if vault.IsFatalError(err) || core == nil {
			fail("initializing core", "error", err)
		}
		logger.Warn("non-fatal error initializing core", "error", err)
	}

	listenerConfig := &configutil.Listener{
		Type:               configutil.TCP,
		Address:            ln.Addr().String(),
		TLSDisable:         true,
		MaxRequestSize:     vaulthttp.DefaultMaxRequestSize,
		MaxRequestDuration: vault.DefaultMaxRequestDuration,
	}
	// command/server.go:1461 (unused while clustering is disabled, harmless).
	core.SetClusterHandler(vaulthttp.Handler.Handler(&vault.HandlerProperties{
		Core:           core,
		ListenerConfig: &configutil.Listener{},
	}))
	// command/server.go:3112. ListenerConfig must be non-nil
	// (http/handler.go:174 dereferences it).
	handler := vaulthttp.Handler.Handler(&vault.HandlerProperties{
		Core:           core,
		ListenerConfig: listenerConfig,
	})
	srv := &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		IdleTimeout:       5 * time.Minute,
		ErrorLog:          logger.StandardLogger(nil),
	}
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()

	logger.Info("vault-server started", "api_addr", apiAddr, "storage", *dataDir, "sealed", core.Sealed())

	sigCh := make(chan os.Signal, 1)
	signal.Notify(sigCh, syscall.SIGINT, syscall.SIGTERM)
	code := 0
	select {
	case s := <-sigCh:
		logger.Info("shutdown triggered", "signal", s.String())
	case err := <-serveErr:
		if !errors.Is(err, http.ErrServerClosed) {
			logger.Error("http server failed", "error", err)
			code = 1
		}
	case <-core.ShutdownDone():
		logger.Error("vault core was shut down")
		code = 1
	}

	// Same order as command/server.go:1822-1840: stop listeners, then seal
	// and shut the core down, then finalize the seal.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	if err := srv.Shutdown(ctx); err != nil {
		_ = srv.Close()
	}
	cancel()
	if err := core.Shutdown(); err != nil {
		logger.Error("core shutdown", "error", err)
	}
	if err := barrierSeal.Finalize(context.Background()); err != nil {
		logger.Error("finalizing seal", "error", err)
	}
	os.Exit(code)
}
