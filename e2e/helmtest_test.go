package e2e_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/workload-ca/workload-ca/e2e/cahost"
)

// checkHelmTest does what helm test's pod does, with what the kubelet
// would give it, against the release's CA: there is no kubelet here, so
// the pod is created bound to a node (as the scheduler would), its
// projected token is a TokenRequest bound to it with the projection's
// audience, and its roots file is the ClusterTrustBundles of the
// projection's signer, merged as the kubelet merges them. The command is
// the pod's own, run by this build of workload-ca; only the address
// becomes the CA's loopback one, with the name the harness serves (the
// Service's name is not served here).
func checkHelmTest(t *testing.T, s *suite, rel chartRelease, ca *cahost.CA, tests []*unstructured.Unstructured) {
	ap := newApplier(t, s.cp.RESTConfig())
	var pod corev1.Pod
	for _, o := range tests {
		switch o.GetKind() {
		case "ServiceAccount":
			if _, err := ap.apply(t.Context(), o, false); err != nil {
				t.Fatalf("apply %s: %v", objName(o), err)
			}
		case "Pod":
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &pod); err != nil {
				t.Fatal(err)
			}
		}
	}
	if pod.Name == "" || len(pod.Spec.Containers) != 1 {
		t.Fatalf("helm test renders no pod with one container")
	}
	client := s.cp.Client()
	pod.Spec.NodeName = "node-a"
	created, err := client.CoreV1().Pods(pod.Namespace).Create(t.Context(), &pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create helm test's pod: %v", err)
	}
	t.Cleanup(func() {
		_ = client.CoreV1().Pods(pod.Namespace).Delete(context.Background(), pod.Name, metav1.DeleteOptions{})
	})

	dir := t.TempDir()
	files := map[string]string{} // mount path → file written here
	for _, v := range pod.Spec.Volumes {
		mount := ""
		for _, m := range pod.Spec.Containers[0].VolumeMounts {
			if m.Name == v.Name {
				mount = m.MountPath
			}
		}
		if v.Projected == nil || len(v.Projected.Sources) != 1 {
			t.Fatalf("volume %s: want one projected source", v.Name)
		}
		src := v.Projected.Sources[0]
		var content []byte
		var path string
		switch {
		case src.ServiceAccountToken != nil:
			seconds := *src.ServiceAccountToken.ExpirationSeconds
			tr, err := client.CoreV1().ServiceAccounts(pod.Namespace).CreateToken(t.Context(), pod.Spec.ServiceAccountName,
				&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
					Audiences: []string{src.ServiceAccountToken.Audience}, ExpirationSeconds: &seconds,
					BoundObjectRef: &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: created.Name, UID: created.UID},
				}}, metav1.CreateOptions{})
			if err != nil {
				t.Fatalf("token for helm test's pod: %v", err)
			}
			s.remember(tr.Status.Token)
			content, path = []byte(tr.Status.Token), src.ServiceAccountToken.Path
		case src.ClusterTrustBundle != nil:
			list, err := client.CertificatesV1().ClusterTrustBundles().List(t.Context(), metav1.ListOptions{})
			if err != nil {
				t.Fatal(err)
			}
			for _, b := range list.Items {
				if src.ClusterTrustBundle.SignerName != nil && b.Spec.SignerName == *src.ClusterTrustBundle.SignerName {
					content = append(content, strings.TrimSpace(b.Spec.TrustBundle)+"\n"...)
				}
			}
			if len(content) == 0 {
				t.Fatalf("no ClusterTrustBundle of signer %v: helm test's pod would not start", src.ClusterTrustBundle.SignerName)
			}
			path = src.ClusterTrustBundle.Path
		default:
			t.Fatalf("volume %s: a source this check does not know", v.Name)
		}
		local := filepath.Join(dir, v.Name+"-"+path)
		if err := os.WriteFile(local, content, 0o600); err != nil {
			t.Fatal(err)
		}
		files[filepath.Join(mount, path)] = local
	}

	var args []string
	var identity string
	for _, a := range pod.Spec.Containers[0].Args {
		name, value, _ := strings.Cut(a, "=")
		switch {
		case name == "--addr":
			args = append(args, "--server-name="+cahost.ServerName)
			a = "--addr=" + ca.Addr()
		case files[value] != "":
			a = name + "=" + files[value]
		case name == "--identity":
			identity = value
		}
		args = append(args, a)
	}
	// Its own identity: the release's trust domain, its namespace and
	// service account.
	if want := "spiffe://" + rel.trustDomain + "/ns/" + pod.Namespace + "/sa/" + pod.Spec.ServiceAccountName; args[0] != "request" || identity != want {
		t.Fatalf("helm test runs %q; want a request for %s", pod.Spec.Containers[0].Args, want)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, os.Getenv(cahost.EnvBinary), args...).CombinedOutput()
	if err != nil || !strings.Contains(string(out), identity) {
		t.Fatalf("helm test's command %q: %v\n%s", args, err, out)
	}
	t.Logf("helm test's request issued %s", identity)
}
