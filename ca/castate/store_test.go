package castate_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/workload-ca/workload-ca/internal/testlog"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/workload-ca/workload-ca/ca"
	"github.com/workload-ca/workload-ca/ca/castate"
)

const (
	testNS     = "workload-ca"
	testSecret = "workload-ca-root"
)

var secretsGR = schema.GroupResource{Resource: "secrets"}

func newStore(t *testing.T, client *fake.Clientset) *castate.SecretStore {
	t.Helper()
	s, err := castate.NewSecretStore(castate.SecretConfig{
		Client: client, Namespace: testNS, Name: testSecret, Generate: generate,
		Clock: testingclock.NewFakePassiveClock(t0), Logger: testlog.New(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestLoadOrCreateCreates(t *testing.T) {
	client := fake.NewClientset()
	st, err := newStore(t, client).LoadOrCreate(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	a := st.Active()
	if len(st.Authorities) != 1 || !a.ActivatedAt.Equal(t0) || !a.PreparedAt.Equal(t0) {
		t.Fatalf("created state = %+v, want one root active since the clock's now", st.Authorities)
	}
	sec := getSecret(t, client)
	if sec.Type != corev1.SecretTypeOpaque || sec.Labels[castate.LabelManagedBy] != castate.ManagedByValue {
		t.Errorf("Secret type %q, labels %v", sec.Type, sec.Labels)
	}
	checkBundle(t, sec.Data[castate.KeyCACert], st)

	again := newStore(t, client)
	loaded, err := again.LoadOrCreate(t.Context())
	if err != nil || !sameState(t, loaded, st) || !sameState(t, again.Current(), st) {
		t.Fatalf("second LoadOrCreate = %v; want the stored state, also as Current", err)
	}
}

// TestLoadOrCreateLosesRace: another replica creates the Secret between
// our GET and our CREATE; we must use its root.
func TestLoadOrCreateLosesRace(t *testing.T) {
	client := fake.NewClientset()
	winner := stateOf(t, active)
	client.PrependReactor("create", "secrets", func(k8stesting.Action) (bool, runtime.Object, error) {
		putSecret(t, client, mustEncode(t, winner))
		return true, nil, apierrors.NewAlreadyExists(secretsGR, testSecret)
	})
	st, err := newStore(t, client).LoadOrCreate(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if !sameState(t, st, winner) {
		t.Fatal("LoadOrCreate kept its own root instead of the winner's")
	}
}

func TestLoadOrCreateNeverOverwrites(t *testing.T) {
	client := fake.NewClientset()
	putSecret(t, client, map[string][]byte{castate.KeyState: []byte("garbage")})
	if _, err := newStore(t, client).LoadOrCreate(t.Context()); !errors.Is(err, castate.ErrInvalidState) {
		t.Fatalf("LoadOrCreate over an invalid Secret = %v, want ErrInvalidState", err)
	}
	if got := string(getSecret(t, client).Data[castate.KeyState]); got != "garbage" {
		t.Errorf("Secret overwritten with %q", got)
	}
	loadOnly, err := castate.NewSecretStore(castate.SecretConfig{Client: fake.NewClientset(), Namespace: testNS, Name: testSecret})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := loadOnly.LoadOrCreate(t.Context()); err == nil {
		t.Error("LoadOrCreate without Generate created a Secret")
	}
}

func TestUpdate(t *testing.T) {
	client := fake.NewClientset()
	store := newStore(t, client)
	if _, err := store.LoadOrCreate(t.Context()); err != nil {
		t.Fatal(err)
	}
	sec := getSecret(t, client)
	sec.Labels["team"], sec.Data["note"] = "pki", []byte("kept")
	if _, err := client.CoreV1().Secrets(testNS).Update(t.Context(), sec, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	next := authority(t, prepared)
	conflicts := 1
	client.PrependReactor("update", "secrets", func(k8stesting.Action) (bool, runtime.Object, error) {
		if conflicts > 0 {
			conflicts--
			return true, nil, apierrors.NewConflict(secretsGR, testSecret, errors.New("stale"))
		}
		return false, nil, nil
	})
	calls := 0
	err := store.Update(t.Context(), func(s castate.State) (castate.State, error) {
		calls++
		s.Authorities = append(s.Authorities, next)
		return s, nil
	})
	if err != nil || calls != 2 {
		t.Fatalf("Update = %v after %d calls of fn; want success after a conflict and 2 calls", err, calls)
	}
	sec = getSecret(t, client)
	got, err := castate.Decode(sec.Data)
	if err != nil || len(got.Authorities) != 2 || !got.Authorities[1].Cert.Equal(next.Cert) {
		t.Fatalf("stored state = %v, %d authorities; want the update applied once", err, len(got.Authorities))
	}
	if sec.Labels["team"] != "pki" || string(sec.Data["note"]) != "kept" || sec.Labels[castate.LabelManagedBy] != castate.ManagedByValue {
		t.Errorf("labels %v, note %q: others' labels and keys must stay", sec.Labels, sec.Data["note"])
	}
}

func TestUpdateWritesNothing(t *testing.T) {
	client := fake.NewClientset()
	store := newStore(t, client)
	if _, err := store.LoadOrCreate(t.Context()); err != nil {
		t.Fatal(err)
	}
	updates := 0
	client.PrependReactor("update", "secrets", func(k8stesting.Action) (bool, runtime.Object, error) {
		updates++
		return false, nil, nil
	})
	unchanged := func(s castate.State) (castate.State, error) { return s, nil }
	if err := store.Update(t.Context(), unchanged); err != nil || updates != 0 {
		t.Errorf("unchanged state: Update = %v with %d writes, want no write", err, updates)
	}
	invalid := func(s castate.State) (castate.State, error) { return castate.State{}, nil }
	if err := store.Update(t.Context(), invalid); !errors.Is(err, castate.ErrInvalidState) || updates != 0 {
		t.Errorf("invalid state: Update = %v with %d writes, want ErrInvalidState and no write", err, updates)
	}
	boom := errors.New("boom")
	failing := func(s castate.State) (castate.State, error) { return s, boom }
	if err := store.Update(t.Context(), failing); !errors.Is(err, boom) || updates != 0 {
		t.Errorf("failing fn: Update = %v with %d writes, want fn's error and no write", err, updates)
	}
}

func TestNewSecretStoreRequires(t *testing.T) {
	for _, cfg := range []castate.SecretConfig{
		{Namespace: testNS, Name: testSecret},
		{Client: fake.NewClientset(), Name: testSecret},
		{Client: fake.NewClientset(), Namespace: testNS},
	} {
		if _, err := castate.NewSecretStore(cfg); err == nil {
			t.Errorf("NewSecretStore(%+v) succeeded", cfg)
		}
	}
}

func TestGenerateErrorIsReturned(t *testing.T) {
	boom := errors.New("no entropy")
	s, err := castate.NewSecretStore(castate.SecretConfig{
		Client: fake.NewClientset(), Namespace: testNS, Name: testSecret,
		Generate: func(context.Context, time.Time) (*ca.Material, error) { return nil, boom },
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.LoadOrCreate(t.Context()); !errors.Is(err, boom) {
		t.Fatalf("LoadOrCreate = %v, want the generator's error", err)
	}
}

func getSecret(t *testing.T, client *fake.Clientset) *corev1.Secret {
	t.Helper()
	sec, err := client.CoreV1().Secrets(testNS).Get(t.Context(), testSecret, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return sec
}

// putSecret stores data directly in the fake's tracker, bypassing reactors.
func putSecret(t *testing.T, client *fake.Clientset, data map[string][]byte) {
	t.Helper()
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: testNS, Name: testSecret}, Data: data}
	if err := client.Tracker().Add(sec); err != nil {
		t.Fatal(err)
	}
}
