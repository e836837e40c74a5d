package source

import (
	"context"
	"crypto"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/workload-ca/workload-ca/ca"
	"github.com/workload-ca/workload-ca/ca/keystore"
	"github.com/workload-ca/workload-ca/ca/rotation"
	"github.com/workload-ca/workload-ca/ca/upstream"
	"github.com/workload-ca/workload-ca/ca/upstream/upstreamconfig"
)

// Wiring is what the material takes from the rest of the CA: the API
// clients of the CA Secret and of a cert-manager upstream, and where it
// reports.
type Wiring struct {
	Client   kubernetes.Interface
	Upstream dynamic.Interface
	Observer rotation.Observer
	// WatchUpstream makes the observer of the upstream's requests, which
	// also reports whether the active intermediate's successor is missing
	// (Source.SuccessorMissing).
	WatchUpstream func(successorMissing func() (time.Time, bool)) upstream.Observer
	Logger        *slog.Logger
}

// Open opens the key of --ca-key-uri, once for the life of the process
// (the directory it belongs to may be reloaded, the key is not), and the
// material from the Secret or the directory. closeKey releases the key.
func (o *Options) Open(ctx context.Context, w Wiring) (s *Source, closeKey func(), err error) {
	key, release, err := o.openKey(ctx, w.Logger)
	if err != nil {
		return nil, nil, err
	}
	defer func() {
		if err != nil {
			release() // not closeKey: a failed return has set it to nil
		}
	}()
	cfg := Config{Authority: o.authority(), Dir: o.Dir, RootDir: o.RootDir, Key: key, KeyType: o.KeyType,
		Poll: o.Poll, Observer: w.Observer, Logger: w.Logger}
	if o.Secret.Name != "" {
		if cfg.Policy, err = o.RotationPolicy(); err != nil {
			return nil, nil, err
		}
		cfg.Secret, cfg.Client = o.Secret, w.Client
	}
	var opened *Source // the upstream reads it once open
	if o.Upstream != nil {
		m, err := o.Upstream.Minter(o.upstreamWiring(w, func() *Source { return opened }))
		if err != nil {
			return nil, nil, fmt.Errorf("--ca-upstream-config: %w", err)
		}
		cfg.Upstream, cfg.ReadyMargin = m.Generate, o.Upstream.ReadyMargin
	}
	if opened, err = Open(ctx, cfg); err != nil {
		return nil, nil, err
	}
	return opened, release, nil
}

// openKey opens the key of --ca-key-uri; nil when the key is a file in
// the directory.
func (o *Options) openKey(ctx context.Context, log *slog.Logger) (crypto.Signer, func(), error) {
	if o.KeyURI == "" {
		return nil, func() {}, nil
	}
	k, err := keystore.OpenKey(ctx, o.KeyURI)
	if err != nil {
		return nil, nil, err
	}
	log.Info("CA key opened", "uri", k.URI, "algorithm", k.Algorithm())
	return k, func() {
		if err := k.Close(); err != nil {
			log.Warn("closing the CA key", "uri", k.URI, "error", err.Error())
		}
	}, nil
}

// upstreamWiring is what the upstream's Minter takes: before the source
// is open, the first intermediate is being made and there are no anchors,
// nor a successor to miss.
func (o *Options) upstreamWiring(w Wiring, opened func() *Source) upstreamconfig.Wiring {
	obs := w.WatchUpstream(func() (time.Time, bool) {
		if s := opened(); s != nil {
			return s.SuccessorMissing()
		}
		return time.Time{}, false
	})
	current := func() []*x509.Certificate {
		if s := opened(); s != nil {
			return s.Anchors()
		}
		return nil
	}
	return upstreamconfig.Wiring{Client: w.Upstream, TrustDomain: o.TrustDomain, KeyType: o.KeyType,
		Lifetime: o.CATTL, Current: current, Observer: obs, Logger: w.Logger}
}

// Describe loads the material that needs no API server (a directory, a
// plug-in root directory, a KMS or HSM key) and says what the CA would
// sign with, for serve --validate. It writes nothing: a directory that
// would get a generated root is reported, not created.
func (o *Options) Describe(ctx context.Context) (string, error) {
	key, release, err := o.openKey(ctx, slog.New(slog.DiscardHandler))
	if err != nil {
		return "", err
	}
	defer release()
	switch {
	case o.Dir != "":
		return o.describeDir(key)
	case o.RootDir != "":
		root, err := keystore.LoadRootDir(o.RootDir, key)
		if err != nil {
			return "", fmt.Errorf("--ca-root-dir %s: %w", o.RootDir, err)
		}
		return fmt.Sprintf("Secret %s (not read by --validate: it needs the API server), intermediates minted from root %q of %s, valid until %s",
			o.Secret, root.Cert.Subject.String(), o.RootDir, root.Cert.NotAfter.UTC().Format("2006-01-02")), nil
	case o.Upstream != nil:
		return fmt.Sprintf("Secret %s (not read by --validate: it needs the API server), %s intermediates of %v issued by %s (not reached by --validate)",
			o.Secret, o.KeyType, o.CATTL, o.Upstream.Describe()), nil
	}
	return fmt.Sprintf("Secret %s (not read by --validate: it needs the API server), self-signed %s roots of %v, rotated at half-life",
		o.Secret, o.KeyType, o.CATTL), nil
}

// describeDir loads --ca-dir with key and checks that an authority would
// take it.
func (o *Options) describeDir(key crypto.Signer) (string, error) {
	if _, err := os.Stat(o.Dir); errors.Is(err, os.ErrNotExist) {
		// Validate allowed it: --ca-dir-create.
		return fmt.Sprintf("directory %s would be created with a self-signed %s root", o.Dir, o.KeyType), nil
	}
	m, err := keystore.LoadDir(o.Dir, key)
	switch {
	case errors.Is(err, keystore.ErrNoMaterial) && key == nil:
		return fmt.Sprintf("directory %s is empty: a self-signed %s root would be generated there", o.Dir, o.KeyType), nil
	case err != nil:
		return "", fmt.Errorf("--ca-dir %s: %w", o.Dir, err)
	}
	if _, err := ca.New(o.authority(), m); err != nil {
		return "", fmt.Errorf("--ca-dir %s: %w", o.Dir, err)
	}
	return fmt.Sprintf("directory %s: signs with %q until %s, %d roots", o.Dir, m.Cert.Subject.String(),
		m.Cert.NotAfter.UTC().Format("2006-01-02"), len(m.Roots)), nil
}
