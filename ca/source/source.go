// Package source is where the CA's material comes from and how it
// changes: a directory (--ca-dir: files hot-reloaded, a self-signed root
// generated in an empty one), or a Secret (--ca-secret: self-signed roots
// rotated by the leader, or with a plug-in root directory, intermediates
// it issues). Open loads the material into a ca.Authority and returns a
// Source that keeps it current through its components: what every
// replica runs (following the files or the Secret), what the leader runs
// (rotation, recording when plug-in roots were first seen), and the
// readiness check of each.
//
// Its Options are serve's flags of the authority and its material
// (identities and lifetimes, CA material, rotation): they are validated,
// described without an API server for serve --validate (Describe), and
// opened with the KMS key and the upstream they name (Options.Open).
//
// It does not sign (package ca), decide when to rotate (ca/rotation), or
// publish roots (trust/).
package source

import (
	"context"
	"crypto"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/workload-ca/workload-ca/ca"
	"github.com/workload-ca/workload-ca/ca/castate"
	"github.com/workload-ca/workload-ca/ca/keystore"
	"github.com/workload-ca/workload-ca/ca/rotation"
	"github.com/workload-ca/workload-ca/internal/component"
)

// Config says where the material is. Exactly one of Dir and Secret is
// set; RootDir only with Secret.
type Config struct {
	// Authority configures the authority the source keeps current.
	Authority ca.Config
	// Dir is a directory of CA material (Istio cacerts or
	// tls.crt/tls.key/ca.crt), reloaded when it changes; without Key, a
	// self-signed root is generated there when it is empty.
	Dir string
	// Secret names the Secret holding the CA's roots (or, with RootDir,
	// intermediates) and rotation state, which Client reads and writes.
	Secret types.NamespacedName
	Client kubernetes.Interface
	// RootDir is, with Secret, a plug-in root CA's directory, reloaded
	// when it changes: the roots are its bundle, and the intermediates
	// the leader mints from its signing root sign the leaves.
	RootDir string
	// Upstream, with Secret, mints the CA's intermediates through an
	// upstream CA (upstream.Minter.Generate): the Secret then holds
	// upstream intermediates (castate.KindUpstream) and the trust bundle
	// is the upstream's anchors. Not with RootDir.
	Upstream func(ctx context.Context, now time.Time) (*ca.Material, error)
	// ReadyMargin, with Upstream, is the least lifetime the active
	// intermediate must have left for the replica to be ready: below it
	// the upstream has failed to issue a successor for most of the
	// intermediate's life.
	ReadyMargin time.Duration
	// Key is the signing key of Dir's certificate or RootDir's root in a
	// KMS or HSM; nil: the key is a file in the directory.
	Key crypto.Signer
	// KeyType is the key type of a generated root or intermediate.
	KeyType string
	// Policy is the rotation policy, with Secret.
	Policy rotation.Policy
	// Poll is how often the directories are checked for changes.
	Poll time.Duration
	// Observer is told each rotation step.
	Observer rotation.Observer
	Logger   *slog.Logger
	// Now is the clock of generated material (default time.Now).
	Now func() time.Time
}

// Source is the CA's material, kept current.
type Source struct {
	cfg        Config
	log        *slog.Logger
	authority  *ca.Authority
	components []component.Component
	// onChange are told after the material changed (OnChange).
	onChange []func()

	// With a Secret: its store and rotator.
	store   *castate.SecretStore
	rotator *rotation.Rotator
	// With RootDir: the current plug-in root (reloaded when the directory
	// changes), when each of its bundle's roots was first seen, and a
	// wake-up for the leader's record of them.
	root        atomic.Pointer[ca.Material]
	seen        rootsSeen
	rootChanged chan struct{}
	// stateChanged wakes livePreviews when the Secret's state changed.
	stateChanged chan struct{}
}

// Open loads the material, from the Secret (the first replica creates it)
// or the directory, and returns the Source that keeps it current once its
// components run.
func Open(ctx context.Context, cfg Config) (*Source, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	s := &Source{cfg: cfg, log: cfg.Logger, rootChanged: make(chan struct{}, 1), stateChanged: make(chan struct{}, 1)}
	var err error
	switch {
	case (cfg.Dir == "") == (cfg.Secret.Name == ""):
		err = errors.New("exactly one of a directory and a Secret is required")
	case cfg.RootDir != "" && cfg.Secret.Name == "":
		err = errors.New("a plug-in root directory requires a Secret (the intermediates it issues are kept there)")
	case cfg.Upstream != nil && cfg.Secret.Name == "":
		err = errors.New("an upstream CA requires a Secret (the intermediates it issues are kept there)")
	case cfg.Upstream != nil && cfg.RootDir != "":
		err = errors.New("an upstream CA and a plug-in root directory cannot both issue the intermediates")
	case cfg.Secret.Name != "":
		err = s.openSecret(ctx)
	default:
		err = s.openDir()
	}
	if err != nil {
		return nil, err
	}
	return s, nil
}

// Authority is the CA the material signs with.
func (s *Source) Authority() *ca.Authority { return s.authority }

// Components are what keeps the material current: run each on every
// replica or on the leader as it says.
func (s *Source) Components() []component.Component { return s.components }

// OnChange has f called after the material changed (a new signing
// certificate or new roots). Call it before the components run.
func (s *Source) OnChange(f func()) { s.onChange = append(s.onChange, f) }

// Phase is the rotation phase of the Secret's state, or "" when the
// material is a directory's.
func (s *Source) Phase() string {
	if s.store == nil {
		return ""
	}
	return s.store.Current().Phase()
}

// Preview returns the roots published only to canaries now (see
// rotation.Policy.Preview): a prepared root in its preview stage. None
// without a Secret or a preview stage.
func (s *Source) Preview() []*x509.Certificate {
	if s.store == nil {
		return nil
	}
	roots, _ := rotation.Previewing(s.store.Current(), s.cfg.Now(), s.cfg.Policy)
	return roots
}

// livePreviews tells whoever follows the material (OnChange) when a
// root's preview stage ends, so that it is published live: a moment
// that changes no state, only the stage of a root.
func (s *Source) livePreviews(ctx context.Context) error {
	for {
		_, until := rotation.Previewing(s.store.Current(), s.cfg.Now(), s.cfg.Policy)
		var wake <-chan time.Time
		var timer *time.Timer
		if !until.IsZero() {
			timer = time.NewTimer(until.Sub(s.cfg.Now()))
			wake = timer.C
		}
		stop := func() {
			if timer != nil {
				timer.Stop()
			}
		}
		select {
		case <-ctx.Done():
			stop()
			return nil
		case <-s.stateChanged:
			stop()
		case <-wake:
			s.log.Info("prepared root goes live: published to every workload, no longer only to canaries")
			for _, f := range s.onChange {
				f()
			}
		}
	}
}

// upstreamReady fails once the active upstream intermediate, or the
// upstream chain above it, has less than ReadyMargin left: the upstream
// has not issued a successor in time (or issued one the CA refused).
func (s *Source) upstreamReady(context.Context) error {
	end, c := s.authority.ChainNotAfter()
	if left := end.Sub(s.cfg.Now()); left <= s.cfg.ReadyMargin {
		what := "the upstream intermediate"
		if c != s.authority.SigningCert() {
			what = fmt.Sprintf("the upstream chain's certificate %q above the intermediate", c.Subject.String())
		}
		return fmt.Errorf("%s expires in %v (at %s) and the CA has no successor from the upstream",
			what, left.Round(time.Second), end.UTC().Format(time.RFC3339))
	}
	return nil
}

// Anchors are, for upstream intermediates, the trust anchors of the
// Secret's current state (castate.State.Anchors): those the CA trusts
// now. Nil otherwise, and before the Secret is loaded.
func (s *Source) Anchors() []*x509.Certificate {
	if s.store == nil {
		return nil
	}
	return s.store.Current().Anchors()
}

// SuccessorMissing reports, for upstream intermediates, whether the
// successor of the active intermediate is overdue (the rotation's prepare
// step is due and not taken: the upstream failed or is unreachable), and
// when the active one (or the first of its upstream chain) expires. False
// otherwise, and for other material.
func (s *Source) SuccessorMissing() (expires time.Time, missing bool) {
	if s.cfg.Upstream == nil || s.rotator == nil {
		return time.Time{}, false
	}
	step, at := s.rotator.Next()
	if step != rotation.StepPrepare || at.After(s.cfg.Now()) {
		return time.Time{}, false
	}
	end, _ := s.authority.ChainNotAfter()
	return end, true
}

// NextRotation is the rotation step next due for the Secret's state and
// when, or rotation.StepNone when the material is a directory's.
func (s *Source) NextRotation() (rotation.Step, time.Time) {
	if s.rotator == nil {
		return rotation.StepNone, time.Time{}
	}
	return s.rotator.Next()
}

// openDir loads the CA from the directory (generating a root there on
// first start, unless the key is in a KMS) and reloads it when the files
// change.
func (s *Source) openDir() error {
	var m *ca.Material
	var err error
	if s.cfg.Key != nil {
		m, err = keystore.LoadDir(s.cfg.Dir, s.cfg.Key)
	} else {
		var created bool
		m, created, err = keystore.LoadOrCreate(s.cfg.Dir, keystore.GenerateOptions{KeyType: s.cfg.KeyType,
			TrustDomain: s.cfg.Authority.TrustDomain}, s.cfg.Now())
		if created {
			s.log.Info("generated a self-signed root", "dir", s.cfg.Dir, "key_type", s.cfg.KeyType)
		}
	}
	if err != nil {
		return err
	}
	if err := s.newAuthority(m); err != nil {
		return err
	}
	w, err := keystore.NewDirWatcher(keystore.DirWatcherConfig{Dir: s.cfg.Dir, Key: s.cfg.Key, Interval: s.cfg.Poll,
		Apply: s.setMaterial, Logger: s.log.With("component", "ca-dir")})
	if err != nil {
		return err
	}
	s.components = append(s.components, component.Component{Name: "ca-dir", Run: w.Run})
	return nil
}

// openSecret loads the CA's roots, or with a plug-in root its
// intermediates, from the Secret (the first replica creates it), follows
// the Secret on every replica, and has the leader drive rotation.
func (s *Source) openSecret(ctx context.Context) error {
	generate, err := s.generator()
	if err != nil {
		return err
	}
	store, err := castate.NewSecretStore(castate.SecretConfig{Client: s.cfg.Client, Namespace: s.cfg.Secret.Namespace,
		Name: s.cfg.Secret.Name, Generate: generate, Roots: s.externalRoots(), Upstream: s.cfg.Upstream != nil,
		Logger: s.log.With("component", "ca-secret")})
	if err != nil {
		return err
	}
	st, err := store.LoadOrCreate(ctx)
	if err != nil {
		return err
	}
	m, err := st.MaterialUnder(store.Roots())
	if err != nil {
		return err
	}
	if err := s.newAuthority(m); err != nil {
		return err
	}
	s.store = store
	var issuer func() rotation.Issuer // nil: self-signed roots, no issuer to follow
	if s.cfg.RootDir != "" {
		issuer = s.issuer
	}
	rot, err := rotation.New(rotation.Config{Store: store, Generate: generate, Policy: s.cfg.Policy,
		Issuer: issuer, Observer: s.cfg.Observer, Logger: s.log.With("component", "rotation")})
	if err != nil {
		return err
	}
	s.rotator = rot
	if err := s.watchRootDir(); err != nil {
		return err
	}
	s.OnChange(rot.Notify)
	s.components = append(s.components,
		component.Component{Name: "ca-secret", Run: func(ctx context.Context) error { return store.Run(ctx, s.followState) },
			Ready: component.Synced(store.HasSynced)},
		component.Component{Name: "rotation", Leader: true, Run: rot.Run})
	if s.cfg.RootDir != "" {
		s.components = append(s.components, component.Component{Name: "roots-seen", Leader: true, Run: s.recordRootsSeen})
	}
	if s.cfg.Upstream != nil {
		s.components = append(s.components, component.Component{Name: "upstream-intermediate", Ready: s.upstreamReady})
	}
	if s.cfg.Policy.Preview > 0 && s.cfg.RootDir == "" && s.cfg.Upstream == nil {
		s.components = append(s.components, component.Component{Name: "root-preview", Run: s.livePreviews})
	}
	return nil
}

// generator returns how the CA's next authority is made: a self-signed
// root, or with a plug-in root an intermediate issued by it, which it
// loads as s.root (the current one at each call: the directory is
// reloaded).
func (s *Source) generator() (func(context.Context, time.Time) (*ca.Material, error), error) {
	opts := keystore.GenerateOptions{KeyType: s.cfg.KeyType, TrustDomain: s.cfg.Authority.TrustDomain, Lifetime: s.cfg.Policy.CATTL}
	if s.cfg.Upstream != nil {
		return s.cfg.Upstream, nil
	}
	if s.cfg.RootDir == "" {
		return func(_ context.Context, now time.Time) (*ca.Material, error) { return keystore.GenerateRoot(opts, now) }, nil
	}
	root, err := keystore.LoadRootDir(s.cfg.RootDir, s.cfg.Key)
	if err != nil {
		return nil, err
	}
	s.root.Store(root)
	s.seen.observe(root.Roots, s.cfg.Now())
	s.log.Info("plug-in root loaded; signing with intermediates issued by it", "dir", s.cfg.RootDir,
		"root", root.Cert.Subject.String(), "not_after", root.Cert.NotAfter, "roots", len(root.Roots))
	return func(_ context.Context, now time.Time) (*ca.Material, error) {
		return keystore.GenerateIntermediate(s.root.Load(), opts, now)
	}, nil
}

// issuer is, with a plug-in root, the current root for the rotator and
// when it is trusted everywhere: the propagation delay after this process
// first saw it in the bundle.
func (s *Source) issuer() rotation.Issuer {
	root := s.root.Load()
	return rotation.Issuer{Cert: root.Cert, TrustedFrom: s.seen.since(root.Cert, s.cfg.Now()).Add(s.cfg.Policy.PropagationDelay)}
}

// externalRoots are the plug-in root's trust bundle, or nil for
// self-signed roots.
func (s *Source) externalRoots() []*x509.Certificate {
	if r := s.root.Load(); r != nil {
		return r.Roots
	}
	return nil
}

// watchRootDir reloads the plug-in root when its directory changes.
func (s *Source) watchRootDir() error {
	if s.cfg.RootDir == "" {
		return nil
	}
	w, err := keystore.NewDirWatcher(keystore.DirWatcherConfig{Dir: s.cfg.RootDir, Root: true, Key: s.cfg.Key,
		Interval: s.cfg.Poll, Apply: s.setPluginRoot, Logger: s.log.With("component", "ca-root-dir")})
	if err != nil {
		return err
	}
	s.components = append(s.components, component.Component{Name: "ca-root-dir", Run: w.Run})
	return nil
}

// setPluginRoot installs a changed plug-in root: its bundle becomes the
// trust bundle (what the Secret's intermediates are checked against) and
// it issues the intermediates minted from now on; a new signing root takes
// over once it has been in the bundle for the propagation delay (see
// rotation.PlanUnder). Bundles that drop the issuer of an intermediate
// still in the Secret are refused, and the previous root keeps serving.
// The store hands the Secret's state to followState again, which installs
// it under the new bundle (and so publishes it); installing it here too
// could race a newer state.
func (s *Source) setPluginRoot(root *ca.Material) error {
	if err := s.store.SetRoots(root.Roots); err != nil {
		return err
	}
	s.seen.observe(root.Roots, s.cfg.Now())
	previous := s.root.Swap(root)
	if previous == nil || !previous.Cert.Equal(root.Cert) {
		s.log.Info("new plug-in signing root: the leader moves to intermediates it issues once every verifier trusts it",
			"root", root.Cert.Subject.String(), "not_after", root.Cert.NotAfter, "trusted_from", s.issuer().TrustedFrom)
	}
	// On the leader, record the new bundle's roots in the Secret.
	select {
	case s.rootChanged <- struct{}{}:
	default:
	}
	// SetRoots woke the rotator before the new root was stored here.
	s.rotator.Notify()
	return nil
}

// followState installs the material of a new CA state seen in the Secret.
func (s *Source) followState(st castate.State) {
	m, err := st.MaterialUnder(s.store.Roots())
	if err == nil {
		err = s.setMaterial(m)
	}
	if err != nil {
		s.log.Error("refused CA state from the Secret; the previous CA keeps serving", "error", err.Error())
		return
	}
	s.log.Info("CA state updated", "phase", st.Phase(), "signing", m.Cert.Subject.String(), "roots", len(m.Roots))
	select {
	case s.stateChanged <- struct{}{}:
	default:
	}
}

func (s *Source) newAuthority(m *ca.Material) error {
	a, err := ca.New(s.cfg.Authority, m)
	if err != nil {
		return err
	}
	s.authority = a
	sc := a.SigningCert()
	s.log.Info("CA loaded", "subject", sc.Subject.String(), "not_after", sc.NotAfter, "roots", len(a.Roots()))
	return nil
}

// setMaterial installs validated material and tells whoever follows it.
func (s *Source) setMaterial(m *ca.Material) error {
	if err := s.authority.SetMaterial(m); err != nil {
		return err
	}
	for _, f := range s.onChange {
		f()
	}
	return nil
}
