package castate_test

import (
	"crypto/x509"
	"errors"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/workload-ca/workload-ca/ca/castate"
	"github.com/workload-ca/workload-ca/internal/testca"
)

// The record keeps the first sighting of every root still in the bundle,
// dates new ones now, and forgets the others; a root that comes back
// counts again. It survives state updates, and the state survives it.
func TestRootsSeen(t *testing.T) {
	client := fake.NewClientset()
	store := newStore(t, client)
	if _, err := store.LoadOrCreate(t.Context()); err != nil {
		t.Fatal(err)
	}
	roots := testca.RootCerts(t, 3)
	a, b, c := roots[0], roots[1], roots[2]
	t1, t2, t3 := t0.Add(time.Hour), t0.Add(2*time.Hour), t0.Add(3*time.Hour)

	steps := []struct {
		name   string
		bundle []*x509.Certificate
		now    time.Time
		want   map[*x509.Certificate]time.Time
	}{
		{"first leader sees a", []*x509.Certificate{a}, t1, map[*x509.Certificate]time.Time{a: t1}},
		{"b joins the bundle", []*x509.Certificate{b, a}, t2, map[*x509.Certificate]time.Time{a: t1, b: t2}},
		{"a next leader keeps both times", []*x509.Certificate{a, b}, t3, map[*x509.Certificate]time.Time{a: t1, b: t2}},
		{"a leaves", []*x509.Certificate{b}, t3, map[*x509.Certificate]time.Time{b: t2}},
		{"a comes back and counts again, c is new", []*x509.Certificate{a, b, c}, t3.Add(time.Minute),
			map[*x509.Certificate]time.Time{a: t3.Add(time.Minute), b: t2, c: t3.Add(time.Minute)}},
	}
	for _, s := range steps {
		got, err := store.RootsSeen(t.Context(), s.bundle, s.now)
		if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if len(got) != len(s.want) {
			t.Fatalf("%s: %d roots recorded, want %d", s.name, len(got), len(s.want))
		}
		for r, want := range s.want {
			if at := got[castate.DigestOf(r)]; !at.Equal(want) {
				t.Errorf("%s: %s first seen %v, want %v", s.name, r.Subject, at, want)
			}
		}
	}
	if err := store.Update(t.Context(), func(s castate.State) (castate.State, error) {
		s.Authorities = append(s.Authorities, authority(t, prepared))
		return s, nil
	}); err != nil {
		t.Fatal(err)
	}
	sec := getSecret(t, client)
	if _, err := castate.Decode(sec.Data); err != nil {
		t.Fatalf("the state beside the record: %v", err)
	}
	got, err := store.RootsSeen(t.Context(), []*x509.Certificate{b}, t3.Add(time.Hour))
	if err != nil || !got[castate.DigestOf(b)].Equal(t2) {
		t.Fatalf("after a state update: %v, %v; want b still first seen at %v", got, err, t2)
	}
}

// Nothing is written when the record does not change; a conflict is
// retried; a record that does not parse is replaced.
func TestRootsSeenWrites(t *testing.T) {
	client := fake.NewClientset()
	store := newStore(t, client)
	if _, err := store.LoadOrCreate(t.Context()); err != nil {
		t.Fatal(err)
	}
	root := testca.RootCerts(t, 1)[0]
	updates, conflicts := 0, 1
	client.PrependReactor("update", "secrets", func(k8stesting.Action) (bool, runtime.Object, error) {
		updates++
		if conflicts > 0 {
			conflicts--
			return true, nil, apierrors.NewConflict(secretsGR, testSecret, errors.New("stale"))
		}
		return false, nil, nil
	})
	if _, err := store.RootsSeen(t.Context(), []*x509.Certificate{root}, t0); err != nil || updates != 2 {
		t.Fatalf("first record: %v after %d updates; want success after a conflict", err, updates)
	}
	if _, err := store.RootsSeen(t.Context(), []*x509.Certificate{root}, t0.Add(time.Hour)); err != nil || updates != 2 {
		t.Fatalf("unchanged record: %v, %d updates; want no write", err, updates)
	}

	for _, garbage := range []string{`{"version":2,"roots":[]}`, `{"version":1,"roots":[{"sha256":"zz","firstSeen":"2030-01-01T00:00:00Z"}]}`, `not json`} {
		sec := getSecret(t, client)
		sec.Data[castate.KeyRootsSeen] = []byte(garbage)
		if _, err := client.CoreV1().Secrets(testNS).Update(t.Context(), sec, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		later := t0.Add(2 * time.Hour)
		got, err := store.RootsSeen(t.Context(), []*x509.Certificate{root}, later)
		if err != nil || !got[castate.DigestOf(root)].Equal(later) {
			t.Fatalf("record %q: %v, %v; want it replaced, root seen now", garbage, got, err)
		}
	}
}

func TestRootsSeenNoSecret(t *testing.T) {
	store := newStore(t, fake.NewClientset())
	if _, err := store.RootsSeen(t.Context(), testca.RootCerts(t, 1), t0); err == nil {
		t.Fatalf("RootsSeen without a Secret: %v, want an error", err)
	}
}
