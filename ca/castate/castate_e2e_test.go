package castate_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/workload-ca/workload-ca/internal/testlog"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/workload-ca/workload-ca/ca"
	"github.com/workload-ca/workload-ca/ca/castate"
	"github.com/workload-ca/workload-ca/e2e/controlplane"
)

const raceRounds = 10

// TestE2E runs stores against a real kube-apiserver, as a user holding
// exactly the RBAC the package documents.
func TestE2E(t *testing.T) {
	cp := controlplane.StartForTest(t, controlplane.Options{})
	if _, err := cp.CreateNamespace(t.Context(), testNS); err != nil {
		t.Fatal(err)
	}
	names := []string{"follow", "concurrent", "restore"}
	for i := range raceRounds {
		names = append(names, fmt.Sprintf("race-%d", i))
	}
	client := grantStore(t, cp, "castate-store", names)
	admin := cp.Client()

	t.Run("racing LoadOrCreate ends with one root", func(t *testing.T) { testRace(t, client) })
	t.Run("follower sees Updates and ignores bad edits", func(t *testing.T) { testFollow(t, client, admin) })
	t.Run("concurrent Updates each applied once", func(t *testing.T) { testConcurrentUpdates(t, client) })
	t.Run("a deleted Secret is restored from the last state", func(t *testing.T) { testRestore(t, client, admin) })
	t.Run("RBAC reaches no other Secret", func(t *testing.T) { testRBAC(t, client(), admin) })
}

// testRace makes two stores find the Secret absent and generate a root
// each (Generate waits for both), then create it: one create wins, and
// both stores must end with the winner's root.
func testRace(t *testing.T, client func() kubernetes.Interface) {
	for i := range raceRounds {
		name := fmt.Sprintf("race-%d", i)
		var inGenerate sync.WaitGroup
		inGenerate.Add(2)
		gen := func(_ context.Context, now time.Time) (*ca.Material, error) {
			inGenerate.Done()
			inGenerate.Wait() // both saw NotFound before either creates
			return generate(context.Background(), now)
		}
		states := make([]castate.State, 2)
		errs := make([]error, 2)
		var wg sync.WaitGroup
		for j := range 2 {
			s, err := castate.NewSecretStore(castate.SecretConfig{
				Client: client(), Namespace: testNS, Name: name, Generate: gen, Logger: testlog.New(t),
			})
			if err != nil {
				t.Fatal(err)
			}
			wg.Go(func() { states[j], errs[j] = s.LoadOrCreate(t.Context()) })
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
		stored := e2eStore(t, client(), name, nil)
		got, err := stored.LoadOrCreate(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if !sameState(t, states[0], states[1]) || !sameState(t, states[0], got) {
			t.Fatalf("round %d: the stores ended with different roots", i)
		}
	}
}

func testFollow(t *testing.T, client func() kubernetes.Interface, admin kubernetes.Interface) {
	leader := e2eStore(t, client(), "follow", testlog.New(t))
	initial, err := leader.LoadOrCreate(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	msgs := make(chan string, 64)
	follower := e2eStore(t, client(), "follow", slog.New(msgHandler{testlog.New(t).Handler(), msgs}))
	states := follow(t, follower)
	if got := next(t, states, "initial state"); !sameState(t, got, initial) {
		t.Fatal("first state differs from the created one")
	}
	// The informer counts the initial list as handled once onChange has
	// returned, a moment after the state above was sent.
	if err := wait.PollUntilContextTimeout(t.Context(), 10*time.Millisecond, e2eTimeout, true, func(context.Context) (bool, error) {
		return follower.HasSynced(), nil
	}); err != nil {
		t.Fatal("HasSynced stays false after the initial state was delivered")
	}

	prep := authority(t, prepared)
	if err := leader.Update(t.Context(), appendAuthority(prep)); err != nil {
		t.Fatal(err)
	}
	updated := next(t, states, "state after Update")
	if len(updated.Authorities) != 2 || !updated.Authorities[1].Cert.Equal(prep.Cert) || !sameState(t, follower.Current(), updated) {
		t.Fatal("follower did not get the leader's update")
	}

	sec, err := admin.CoreV1().Secrets(testNS).Get(t.Context(), "follow", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	good := sec.Data
	putGarbage(t, admin, "follow", map[string][]byte{castate.KeyState: []byte(`{"version": 1, "authorities": [`)})
	for msg := ""; msg != "ignoring an invalid CA state in the Secret; the previous state keeps serving"; {
		msg = next(t, msgs, "log of the invalid state")
	}
	if !sameState(t, follower.Current(), updated) {
		t.Error("the invalid edit replaced the follower's state")
	}
	if err := leader.Update(t.Context(), appendAuthority(authority(t, retiring))); !errors.Is(err, castate.ErrInvalidState) {
		t.Errorf("Update over the invalid Secret = %v, want ErrInvalidState (never overwrite)", err)
	}
	putGarbage(t, admin, "follow", good)
	if got := next(t, states, "state after the repair"); !sameState(t, got, updated) {
		t.Error("repaired Secret not followed")
	}
}

// testRestore deletes the Secret under a following store: the store
// re-creates it with the state it last saw, so a restart cannot mint a
// root nobody trusts.
func testRestore(t *testing.T, client func() kubernetes.Interface, admin kubernetes.Interface) {
	store := e2eStore(t, client(), "restore", testlog.New(t))
	initial, err := store.LoadOrCreate(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	states := follow(t, store)
	next(t, states, "initial state")
	before, err := admin.CoreV1().Secrets(testNS).Get(t.Context(), "restore", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := admin.CoreV1().Secrets(testNS).Delete(t.Context(), "restore", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(e2eTimeout)
	for {
		sec, err := admin.CoreV1().Secrets(testNS).Get(t.Context(), "restore", metav1.GetOptions{})
		if err == nil && sec.UID != before.UID {
			got, err := castate.Decode(sec.Data)
			if err != nil || !sameState(t, got, initial) {
				t.Fatalf("restored Secret holds another state (%v)", err)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the deleted Secret was not restored within %v (last error: %v)", e2eTimeout, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// testConcurrentUpdates forces a conflict (the first fn waits until
// another Update has written), then runs four free Updates at once.
func testConcurrentUpdates(t *testing.T, client func() kubernetes.Interface) {
	a, b := e2eStore(t, client(), "concurrent", nil), e2eStore(t, client(), "concurrent", nil)
	if _, err := a.LoadOrCreate(t.Context()); err != nil {
		t.Fatal(err)
	}
	ra, rb := authority(t, retiring), authority(t, retiring)
	inFn, bDone := make(chan struct{}), make(chan struct{})
	var calls atomic.Int32
	var wg sync.WaitGroup
	wg.Go(func() {
		err := a.Update(t.Context(), func(s castate.State) (castate.State, error) {
			if calls.Add(1) == 1 {
				close(inFn)
				<-bDone
			}
			return appendAuthority(ra)(s)
		})
		if err != nil {
			t.Errorf("Update a: %v", err)
		}
	})
	<-inFn
	if err := b.Update(t.Context(), appendAuthority(rb)); err != nil {
		t.Fatal(err)
	}
	close(bDone)
	wg.Wait()
	if calls.Load() != 2 {
		t.Errorf("fn of the conflicting Update ran %d times, want 2", calls.Load())
	}
	more := []castate.Authority{authority(t, retiring), authority(t, retiring), authority(t, retiring), authority(t, retiring)}
	for _, x := range more {
		wg.Go(func() {
			if err := e2eStore(t, client(), "concurrent", nil).Update(t.Context(), appendAuthority(x)); err != nil {
				t.Errorf("Update: %v", err)
			}
		})
	}
	wg.Wait()
	final, err := e2eStore(t, client(), "concurrent", nil).LoadOrCreate(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range append([]castate.Authority{rb, ra}, more...) {
		if n := count(final, x); n != 1 {
			t.Errorf("authority %x appears %d times, want once", x.Cert.SerialNumber, n)
		}
	}
}

// testRBAC checks that the documented Role reaches the named Secrets only:
// a Secret of another name cannot be read, nor all Secrets listed.
func testRBAC(t *testing.T, user, admin kubernetes.Interface) {
	createSecret(t, admin, "someone-elses")
	secrets := user.CoreV1().Secrets(testNS)
	if _, err := secrets.Get(t.Context(), "someone-elses", metav1.GetOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("get another Secret = %v, want Forbidden", err)
	}
	if _, err := secrets.List(t.Context(), metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("list without a name selector = %v, want Forbidden", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), e2eTimeout)
	defer cancel()
	if _, err := secrets.List(ctx, metav1.ListOptions{FieldSelector: "metadata.name=follow"}); err != nil {
		t.Errorf("list by name = %v, want allowed", err)
	}
}

// appendAuthority returns an Update function adding a. It does not check
// whether a is there already: a state with a twice is invalid, so an
// Update applied twice would fail.
func appendAuthority(a castate.Authority) func(castate.State) (castate.State, error) {
	return func(s castate.State) (castate.State, error) {
		s.Authorities = append(slices.Clone(s.Authorities), a)
		return s, nil
	}
}

func count(s castate.State, a castate.Authority) int {
	n := 0
	for _, x := range s.Authorities {
		if x.Cert.Equal(a.Cert) {
			n++
		}
	}
	return n
}
