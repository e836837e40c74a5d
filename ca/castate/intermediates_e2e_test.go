package castate_test

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/workload-ca/workload-ca/internal/testlog"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/workload-ca/workload-ca/ca"
	"github.com/workload-ca/workload-ca/ca/castate"
	"github.com/workload-ca/workload-ca/e2e/controlplane"
	"github.com/workload-ca/workload-ca/internal/testca"
)

const intermediateRaceRounds = 5

// TestE2EIntermediates runs stores of intermediates under a plug-in root
// against a real kube-apiserver, as a user holding exactly the RBAC the
// package documents.
func TestE2EIntermediates(t *testing.T) {
	cp := controlplane.StartForTest(t, controlplane.Options{})
	if _, err := cp.CreateNamespace(t.Context(), testNS); err != nil {
		t.Fatal(err)
	}
	names := []string{"intermediates", "roots-change"}
	for i := range intermediateRaceRounds {
		names = append(names, fmt.Sprintf("race-intermediates-%d", i))
	}
	client := grantStore(t, cp, "castate-intermediates", names)
	// The stores run on the real clock.
	now := time.Now()
	root := testca.NewRoot(t, testca.P256, testca.Validity(now.Add(-time.Hour), now.Add(10*365*24*time.Hour)))

	t.Run("round trip, followed", func(t *testing.T) { testIntermediatesRoundTrip(t, client, cp.Client(), root) })
	t.Run("racing LoadOrCreate ends with one intermediate", func(t *testing.T) { testIntermediatesRace(t, client, root) })
	t.Run("a state refused under old roots is delivered after SetRoots", func(t *testing.T) { testSetRootsRechecks(t, client, root) })
}

// testSetRootsRechecks: the leader's directory already has a new root and
// mints an intermediate of it; a replica whose directory has not caught up
// refuses that state, and takes it once its roots are set to the new
// bundle.
func testSetRootsRechecks(t *testing.T, client func() kubernetes.Interface, root *testca.CA) {
	const name = "roots-change"
	now := time.Now()
	newRoot := testca.NewRoot(t, testca.P256, testca.Validity(now.Add(-time.Hour), now.Add(10*365*24*time.Hour)))
	leader := intermediateStore(t, client(), name, intermediates(root), root.Cert, newRoot.Cert)
	if _, err := leader.LoadOrCreate(t.Context()); err != nil {
		t.Fatal(err)
	}
	msgs := make(chan string, 64)
	replica := loggedIntermediateStore(t, client(), name, nil, slog.New(msgHandler{testlog.New(t).Handler(), msgs}), root.Cert)
	if _, err := replica.LoadOrCreate(t.Context()); err != nil {
		t.Fatal(err)
	}
	states := follow(t, replica)
	first := next[castate.State](t, states, "first state")
	if len(first.Authorities) != 1 {
		t.Fatalf("first state has %d authorities, want 1", len(first.Authorities))
	}
	m, err := intermediates(newRoot)(context.Background(), now)
	if err != nil {
		t.Fatal(err)
	}
	err = leader.Update(t.Context(), func(st castate.State) (castate.State, error) {
		st.Authorities = append(st.Authorities, castate.Authority{Cert: m.Cert, Key: m.Signer, Status: castate.StatusPrepared, PreparedAt: now})
		return st, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// Refused, as it should be: the replica logs the refusal once its
	// informer holds the new state, which SetRoots then re-reads.
	for msg := ""; msg != "ignoring an invalid CA state in the Secret; the previous state keeps serving"; {
		msg = next(t, msgs, "log of the refused state")
	}
	select {
	case st := <-states:
		t.Fatalf("state with %d authorities delivered under roots that did not issue one of them", len(st.Authorities))
	default:
	}
	if err := replica.SetRoots([]*x509.Certificate{root.Cert, newRoot.Cert}); err != nil {
		t.Fatal(err)
	}
	if st := next[castate.State](t, states, "the state after SetRoots"); len(st.Authorities) != 2 {
		t.Errorf("state after SetRoots has %d authorities, want 2", len(st.Authorities))
	}
}

func intermediateStore(t *testing.T, client kubernetes.Interface, name string, gen func(context.Context, time.Time) (*ca.Material, error), roots ...*x509.Certificate) *castate.SecretStore {
	t.Helper()
	return loggedIntermediateStore(t, client, name, gen, testlog.New(t), roots...)
}

func loggedIntermediateStore(t *testing.T, client kubernetes.Interface, name string, gen func(context.Context, time.Time) (*ca.Material, error), log *slog.Logger, roots ...*x509.Certificate) *castate.SecretStore {
	t.Helper()
	s, err := castate.NewSecretStore(castate.SecretConfig{
		Client: client, Namespace: testNS, Name: name, Generate: gen, Roots: roots, Logger: log,
	})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func testIntermediatesRoundTrip(t *testing.T, client func() kubernetes.Interface, admin kubernetes.Interface, root *testca.CA) {
	const name = "intermediates"
	leader := intermediateStore(t, client(), name, intermediates(root), root.Cert)
	created, err := leader.LoadOrCreate(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if created.Kind != castate.KindIntermediates || len(created.Authorities) != 1 {
		t.Fatalf("created a state of kind %q with %d authorities, want one intermediate", created.Kind, len(created.Authorities))
	}
	follower := intermediateStore(t, client(), name, nil, root.Cert)
	states := follow(t, follower)
	if got := next(t, states, "initial state"); !sameState(t, got, created) {
		t.Fatal("the follower's first state differs from the created one")
	}

	m, err := intermediates(root)(context.Background(), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	prep := castate.Authority{Cert: m.Cert, Key: m.Signer, Status: prepared, PreparedAt: time.Now()}
	if err := leader.Update(t.Context(), appendAuthority(prep)); err != nil {
		t.Fatal(err)
	}
	updated := next(t, states, "state after Update")
	if len(updated.Authorities) != 2 || !updated.Authorities[1].Cert.Equal(prep.Cert) || updated.Kind != castate.KindIntermediates {
		t.Fatal("the follower did not get the leader's update")
	}
	m, err = updated.MaterialUnder([]*x509.Certificate{root.Cert})
	if err != nil || !m.Cert.Equal(created.Active().Cert) {
		t.Fatalf("material of the followed state: %v; want the first intermediate still signing", err)
	}

	sec, err := admin.CoreV1().Secrets(testNS).Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(sec.Data) != 1 || sec.Labels[castate.LabelManagedBy] != castate.ManagedByValue {
		t.Errorf("Secret data has %d keys, labels %v; want %s only, and our label", len(sec.Data), sec.Labels, castate.KeyState)
	}
	stored, err := castate.Decode(sec.Data)
	if err != nil || !sameState(t, stored, updated) {
		t.Fatalf("stored state: %v; want what the follower saw", err)
	}

	for what, s := range map[string]*castate.SecretStore{
		"without roots":    intermediateStore(t, client(), name, nil),
		"with other roots": intermediateStore(t, client(), name, nil, pluginRoot(t).Cert),
	} {
		if _, err := s.LoadOrCreate(t.Context()); !errors.Is(err, castate.ErrInvalidState) {
			t.Errorf("store %s: LoadOrCreate = %v, want ErrInvalidState", what, err)
		}
	}
}

// testIntermediatesRace makes two stores find the Secret absent and mint
// an intermediate each (Generate waits for both), then create it: one
// create wins, and both stores must end with the winner's intermediate.
func testIntermediatesRace(t *testing.T, client func() kubernetes.Interface, root *testca.CA) {
	for i := range intermediateRaceRounds {
		name := fmt.Sprintf("race-intermediates-%d", i)
		var inGenerate sync.WaitGroup
		inGenerate.Add(2)
		gen := func(_ context.Context, now time.Time) (*ca.Material, error) {
			inGenerate.Done()
			inGenerate.Wait() // both saw NotFound before either creates
			return intermediates(root)(context.Background(), now)
		}
		states := make([]castate.State, 2)
		errs := make([]error, 2)
		var wg sync.WaitGroup
		for j := range 2 {
			s := intermediateStore(t, client(), name, gen, root.Cert)
			wg.Go(func() { states[j], errs[j] = s.LoadOrCreate(t.Context()) })
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
		got, err := intermediateStore(t, client(), name, nil, root.Cert).LoadOrCreate(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if !sameState(t, states[0], states[1]) || !sameState(t, states[0], got) || len(got.Authorities) != 1 {
			t.Fatalf("round %d: the stores ended with different intermediates", i)
		}
		if err := got.Active().Cert.CheckSignatureFrom(root.Cert); err != nil {
			t.Fatalf("round %d: the stored intermediate is not issued by the plug-in root: %v", i, err)
		}
	}
}
