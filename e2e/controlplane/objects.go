package controlplane

import (
	"context"
	"fmt"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

// PauseImage is the image of pods created by CreatePod. Nothing pulls it.
const PauseImage = "registry.k8s.io/pause:3.10"

// CreateNamespace creates namespace name. Nothing creates its "default"
// service account (kube-controller-manager does not run).
func (c *ControlPlane) CreateNamespace(ctx context.Context, name string) (*corev1.Namespace, error) {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	return c.client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{})
}

// CreateServiceAccount creates service account ns/name.
func (c *ControlPlane) CreateServiceAccount(ctx context.Context, ns, name string) (*corev1.ServiceAccount, error) {
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}}
	return c.client.CoreV1().ServiceAccounts(ns).Create(ctx, sa, metav1.CreateOptions{})
}

// CreateNode creates a Node object. No kubelet backs it; its status is empty.
func (c *ControlPlane) CreateNode(ctx context.Context, name string) (*corev1.Node, error) {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{
		Name:   name,
		Labels: map[string]string{corev1.LabelHostname: name},
	}}
	return c.client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
}

// CreatePod creates pod ns/name running as service account sa, bound to
// node through spec.nodeName. The pod stays Pending (no kubelet). With the
// ServiceAccount admission plugin enabled (the default here), sa must exist.
func (c *ControlPlane) CreatePod(ctx context.Context, ns, name, sa, node string) (*corev1.Pod, error) {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PodSpec{
			ServiceAccountName: sa,
			NodeName:           node,
			Containers:         []corev1.Container{{Name: "pause", Image: PauseImage}},
		},
	}
	return c.client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
}

// PodToken mints a token for service account ns/sa bound to pod, with one
// audience, through the TokenRequest API. expirySeconds 0 leaves the server
// default (1h). The server rejects values below 600, and extends exactly
// 3607 to a year when audience is one of --api-audiences (istio-ca is).
func (c *ControlPlane) PodToken(ctx context.Context, ns, sa string, pod *corev1.Pod, audience string, expirySeconds int64) (string, error) {
	return c.BoundToken(ctx, ns, sa, "Pod", pod.Name, pod.UID, audience, expirySeconds)
}

// BoundToken mints a token for service account ns/sa bound to the object
// of kind (Pod, Secret or Node) name with uid, as PodToken does.
func (c *ControlPlane) BoundToken(ctx context.Context, ns, sa, kind, name string, uid types.UID, audience string, expirySeconds int64) (string, error) {
	req := &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{
			Audiences:      []string{audience},
			BoundObjectRef: &authenticationv1.BoundObjectReference{Kind: kind, APIVersion: "v1", Name: name, UID: uid},
		},
	}
	if expirySeconds != 0 {
		req.Spec.ExpirationSeconds = &expirySeconds
	}
	resp, err := c.client.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, req, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("token for %s/%s bound to %s %s: %w", ns, sa, kind, name, err)
	}
	return resp.Status.Token, nil
}

// BindClusterRole creates ClusterRole name with rules and
// ClusterRoleBinding name granting it to subject.
func (c *ControlPlane) BindClusterRole(ctx context.Context, name string, rules []rbacv1.PolicyRule, subject rbacv1.Subject) error {
	rbac := c.client.RbacV1()
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: rules}
	if _, err := rbac.ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create ClusterRole %s: %w", name, err)
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name},
		Subjects:   []rbacv1.Subject{subject},
	}
	if _, err := rbac.ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create ClusterRoleBinding %s: %w", name, err)
	}
	return nil
}

// UserClient grants user the rules cluster-wide (a ClusterRole and
// binding named after the user, see BindClusterRole) and returns a client
// that acts as user. RBAC takes a moment to apply: callers wait until an
// access review of theirs says so.
func (c *ControlPlane) UserClient(ctx context.Context, user string, rules []rbacv1.PolicyRule) (kubernetes.Interface, error) {
	subject := rbacv1.Subject{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}
	if err := c.BindClusterRole(ctx, user, rules, subject); err != nil {
		return nil, err
	}
	return kubernetes.NewForConfig(c.ImpersonatedConfig(user))
}
