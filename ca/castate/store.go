package castate

import (
	"bytes"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/clock"

	"github.com/workload-ca/workload-ca/ca"
)

// Labels every Secret the store writes carries.
const (
	LabelManagedBy = "app.kubernetes.io/managed-by"
	ManagedByValue = "workload-ca"
)

// SecretConfig configures a SecretStore. Client, Namespace and Name are
// required.
type SecretConfig struct {
	Client    kubernetes.Interface
	Namespace string
	Name      string
	// Generate returns a new self-signed root, or with Roots a new
	// intermediate issued by one of them (keystore.GenerateIntermediate);
	// LoadOrCreate calls it when the Secret does not exist. Nil means load
	// only: LoadOrCreate then fails on a missing Secret.
	Generate func(ctx context.Context, now time.Time) (*ca.Material, error)
	// Roots, when set, are the external roots (a plug-in root CA's trust
	// bundle): the Secret then holds intermediates issued by them
	// (KindIntermediates), never their keys. Every state the store reads
	// or writes must be valid under Roots (State.ValidateUnder): a Secret
	// of the other kind, or with an intermediate none of Roots issued, is
	// refused like any invalid state.
	Roots []*x509.Certificate
	// Upstream: the Secret holds intermediates an upstream CA issued
	// (KindUpstream), which Generate returns with the upstream's chain as
	// Intermediates and its trust anchor as the only root. Not with Roots.
	Upstream bool
	// Clock dates the first authority. Default the real clock.
	Clock  clock.PassiveClock
	Logger *slog.Logger
}

// SecretStore keeps the CA state in one Secret and follows it.
type SecretStore struct {
	client   kubernetes.Interface
	ns, name string
	generate func(context.Context, time.Time) (*ca.Material, error)
	upstream bool
	roots    atomic.Pointer[[]*x509.Certificate] // see SetRoots
	clock    clock.PassiveClock
	log      *slog.Logger

	current atomic.Pointer[State]
	follow  atomic.Pointer[follower] // set while or after Run runs
	running atomic.Bool
}

// NewSecretStore checks cfg and returns a store; nothing is read yet.
func NewSecretStore(cfg SecretConfig) (*SecretStore, error) {
	switch {
	case cfg.Client == nil:
		return nil, errors.New("castate: missing Client")
	case cfg.Namespace == "" || cfg.Name == "":
		return nil, errors.New("castate: missing Secret namespace or name")
	case cfg.Upstream && len(cfg.Roots) > 0:
		return nil, errors.New("castate: upstream intermediates carry their own roots: no external Roots")
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	s := &SecretStore{
		client:   cfg.Client,
		ns:       cfg.Namespace,
		name:     cfg.Name,
		generate: cfg.Generate,
		upstream: cfg.Upstream,
		clock:    cfg.Clock,
		log:      cfg.Logger.With("secret", cfg.Namespace+"/"+cfg.Name),
	}
	roots := slices.Clone(cfg.Roots)
	s.roots.Store(&roots)
	return s, nil
}

// Roots returns the external roots the store validates states under (nil
// for self-signed roots).
func (s *SecretStore) Roots() []*x509.Certificate { return *s.roots.Load() }

// SetRoots replaces the external roots, e.g. after the plug-in root's
// directory changed. The current state must be valid under the new roots
// (every intermediate in it issued by one of them), so a bundle that drops
// a root whose intermediates are still in use is refused; so is a switch
// between self-signed roots and external ones. States read or written
// afterwards are validated under the new roots, and the Secret as last
// seen is checked again (a state refused under the old roots may fit the
// new ones; Run's onChange gets it).
func (s *SecretStore) SetRoots(roots []*x509.Certificate) error {
	if (len(roots) > 0) != (len(s.Roots()) > 0) {
		return errors.New("castate: cannot switch between self-signed roots and external roots")
	}
	if cur := s.current.Load(); cur != nil {
		if err := cur.fitsRoots(roots); err != nil {
			return fmt.Errorf("castate: the current CA state does not fit the new roots: %w", err)
		}
	}
	roots = slices.Clone(roots)
	s.roots.Store(&roots)
	if f := s.follow.Load(); f != nil {
		f.recheck() // a state refused under the old roots may fit now
	}
	return nil
}

// Current returns the last valid state the store saw (from LoadOrCreate or
// Run), or the zero State before any. It does not reflect Update until Run
// delivers the write.
func (s *SecretStore) Current() State {
	if st := s.current.Load(); st != nil {
		return *st
	}
	return State{}
}

// LoadOrCreate returns the state in the Secret. If there is no Secret, it
// generates a root and creates the Secret; if another replica created it
// meanwhile, it loads theirs. It never overwrites: an invalid Secret is an
// error.
func (s *SecretStore) LoadOrCreate(ctx context.Context) (State, error) {
	st, err := s.load(ctx)
	if !apierrors.IsNotFound(err) {
		return st, err
	}
	st, err = s.create(ctx)
	if !apierrors.IsAlreadyExists(err) {
		return st, err
	}
	s.log.InfoContext(ctx, "another replica created the CA Secret first; loading it")
	return s.load(ctx)
}

func (s *SecretStore) load(ctx context.Context) (State, error) {
	sec, err := s.get(ctx)
	if err != nil {
		return State{}, err
	}
	st, err := s.decode(sec.Data)
	if err != nil {
		return State{}, fmt.Errorf("castate: Secret %s/%s: %w", s.ns, s.name, err)
	}
	s.current.Store(&st)
	return st, nil
}

func (s *SecretStore) create(ctx context.Context) (State, error) {
	if s.generate == nil {
		return State{}, fmt.Errorf("castate: Secret %s/%s does not exist and the store has no Generate", s.ns, s.name)
	}
	now := s.clock.Now()
	m, err := s.generate(ctx, now)
	if err != nil {
		return State{}, fmt.Errorf("castate: generating the first %s: %w", s.noun(), err)
	}
	st := State{Kind: s.kind(), Authorities: []Authority{{
		Cert: m.Cert, Key: m.Signer, Status: StatusActive, PreparedAt: now, ActivatedAt: now, Chain: UpstreamChain(s.kind(), m),
	}}}
	if err := s.write(ctx, st); err != nil {
		return State{}, err
	}
	s.log.InfoContext(ctx, "created the CA Secret with a new "+s.noun(), "serial", fmt.Sprintf("%x", m.Cert.SerialNumber))
	s.current.Store(&st)
	return st, nil
}

// write creates the Secret holding st; it never replaces an existing one.
func (s *SecretStore) write(ctx context.Context, st State) error {
	if err := st.ValidateUnder(s.Roots()); err != nil {
		return err
	}
	data, err := encode(st)
	if err != nil {
		return err
	}
	sec := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: s.ns, Name: s.name, Labels: map[string]string{LabelManagedBy: ManagedByValue}},
		Type:       corev1.SecretTypeOpaque,
		Data:       data,
	}
	if _, err := s.client.CoreV1().Secrets(s.ns).Create(ctx, sec, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create Secret %s/%s: %w", s.ns, s.name, err)
	}
	return nil
}

// restore re-creates a deleted Secret from the last state seen, so that a
// deleted Secret followed by restarts cannot mint a new root that nobody
// trusts. A Secret that exists again (another replica restored it first,
// or an operator created one) is left alone.
func (s *SecretStore) restore(ctx context.Context) {
	cur := s.current.Load()
	if cur == nil {
		return
	}
	err := s.write(ctx, *cur)
	switch {
	case err == nil:
		s.log.WarnContext(ctx, "the CA Secret was deleted; restored it from the last state seen", "phase", cur.Phase())
	case apierrors.IsAlreadyExists(err):
	default:
		s.log.ErrorContext(ctx, "the CA Secret was deleted and could not be restored; the last state keeps serving", "error", err)
	}
}

// Update changes the state with fn, read-modify-write: it reads the Secret,
// calls fn with its state, validates the result and writes it with the
// resourceVersion it read. On a conflict it starts over, so fn may be
// called several times and must decide from the state it is given. If fn
// returns a state that encodes to what the Secret holds, nothing is
// written. An invalid Secret is an error: Update never replaces what it
// cannot read.
func (s *SecretStore) Update(ctx context.Context, fn func(State) (State, error)) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		return s.updateOnce(ctx, fn)
	})
}

func (s *SecretStore) updateOnce(ctx context.Context, fn func(State) (State, error)) error {
	sec, err := s.get(ctx)
	if err != nil {
		return err
	}
	cur, err := s.decode(sec.Data)
	if err != nil {
		return fmt.Errorf("castate: Secret %s/%s: %w", s.ns, s.name, err)
	}
	next, err := fn(cur)
	if err != nil {
		return err
	}
	if err := next.ValidateUnder(s.Roots()); err != nil {
		return err
	}
	data, err := encode(next)
	if err != nil {
		return err
	}
	if sameData(sec, data) {
		return nil
	}
	upd := sec.DeepCopy()
	if upd.Data == nil {
		upd.Data = map[string][]byte{}
	}
	maps.Copy(upd.Data, data) // keys others added stay
	if upd.Labels == nil {
		upd.Labels = map[string]string{}
	}
	upd.Labels[LabelManagedBy] = ManagedByValue
	if _, err := s.client.CoreV1().Secrets(s.ns).Update(ctx, upd, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("update Secret %s/%s: %w", s.ns, s.name, err)
	}
	return nil
}

// decode is Decode, and checks that the state fits the store's roots
// (Decode has validated the rest).
func (s *SecretStore) decode(data map[string][]byte) (State, error) {
	st, err := Decode(data)
	if err == nil {
		err = st.fitsRoots(s.Roots())
	}
	if err != nil {
		return State{}, err
	}
	return st, nil
}

// kind is the Kind of the states the store keeps.
func (s *SecretStore) kind() Kind {
	if s.upstream {
		return KindUpstream
	}
	if len(s.Roots()) > 0 {
		return KindIntermediates
	}
	return KindRoots
}

// noun names an authority of the store's kind in messages.
func (s *SecretStore) noun() string {
	if s.upstream || len(s.Roots()) > 0 {
		return "intermediate"
	}
	return "root"
}

// UpstreamChain is the Authority.Chain of material m in a state of kind k:
// for KindUpstream, m's intermediates and then its first root (the
// upstream's trust anchor); nil for the other kinds.
func UpstreamChain(k Kind, m *ca.Material) []*x509.Certificate {
	if k != KindUpstream || len(m.Roots) == 0 {
		return nil
	}
	return append(slices.Clone(m.Intermediates), m.Roots[0])
}

// sameData reports whether sec already holds data and our label.
func sameData(sec *corev1.Secret, data map[string][]byte) bool {
	for k, v := range data {
		if !bytes.Equal(sec.Data[k], v) {
			return false
		}
	}
	return sec.Labels[LabelManagedBy] == ManagedByValue
}

func (s *SecretStore) get(ctx context.Context) (*corev1.Secret, error) {
	sec, err := s.client.CoreV1().Secrets(s.ns).Get(ctx, s.name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("get Secret %s/%s: %w", s.ns, s.name, err)
	}
	return sec, nil
}
