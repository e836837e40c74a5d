package castate_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/workload-ca/workload-ca/ca/castate"
	"github.com/workload-ca/workload-ca/e2e/controlplane"
)

// e2eTimeout bounds every wait for the apiserver or an informer.
const e2eTimeout = 10 * time.Second

// grantStore gives user the Role the package documents for Secrets names,
// and returns a function that makes a new client acting as user, once the
// apiserver applies the binding.
func grantStore(t *testing.T, cp *controlplane.ControlPlane, user string, names []string) func() kubernetes.Interface {
	t.Helper()
	rules := []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"get", "list", "watch", "update"}, ResourceNames: names},
		{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"create"}},
	}
	rbac := cp.Client().RbacV1()
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: user}, Rules: rules}
	if _, err := rbac.Roles(testNS).Create(t.Context(), role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	binding := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: user},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: user},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}},
	}
	if _, err := rbac.RoleBindings(testNS).Create(t.Context(), binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	newClient := func() kubernetes.Interface {
		c, err := kubernetes.NewForConfig(cp.ImpersonatedConfig(user))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	probe := newClient()
	err := wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, e2eTimeout, true, func(ctx context.Context) (bool, error) {
		_, err := probe.CoreV1().Secrets(testNS).Get(ctx, names[0], metav1.GetOptions{})
		return err == nil || !apierrors.IsForbidden(err), nil
	})
	if err != nil {
		t.Fatalf("RBAC for %s not applied: %v", user, err)
	}
	return newClient
}

// e2eStore returns a store of Secret name acting through client.
func e2eStore(t *testing.T, client kubernetes.Interface, name string, log *slog.Logger) *castate.SecretStore {
	t.Helper()
	s, err := castate.NewSecretStore(castate.SecretConfig{
		Client: client, Namespace: testNS, Name: name, Generate: generate, Logger: log,
	})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// follow runs s until the test ends and returns the states it delivers.
func follow(t *testing.T, s *castate.SecretStore) <-chan castate.State {
	t.Helper()
	states := make(chan castate.State, 16)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx, func(st castate.State) { states <- st }) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return states
}

// next returns the next value from ch, failing after e2eTimeout.
func next[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(e2eTimeout):
		t.Fatalf("no %s after %v", what, e2eTimeout)
		panic("unreachable")
	}
}

// msgHandler passes every record on and sends its message to msgs
// (dropping it if msgs is full).
type msgHandler struct {
	slog.Handler
	msgs chan<- string
}

func (h msgHandler) Handle(ctx context.Context, r slog.Record) error {
	select {
	case h.msgs <- r.Message:
	default:
	}
	return h.Handler.Handle(ctx, r)
}

func (h msgHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return msgHandler{h.Handler.WithAttrs(attrs), h.msgs}
}

func (h msgHandler) WithGroup(name string) slog.Handler {
	return msgHandler{h.Handler.WithGroup(name), h.msgs}
}

func putGarbage(t *testing.T, admin kubernetes.Interface, name string, data map[string][]byte) {
	t.Helper()
	sec, err := admin.CoreV1().Secrets(testNS).Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sec.Data = data
	if _, err := admin.CoreV1().Secrets(testNS).Update(t.Context(), sec, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func createSecret(t *testing.T, admin kubernetes.Interface, name string) {
	t.Helper()
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: testNS}}
	if _, err := admin.CoreV1().Secrets(testNS).Create(t.Context(), sec, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}
