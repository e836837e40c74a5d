package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"time"

	"golang.org/x/sync/errgroup"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/workload-ca/workload-ca/e2e/controlplane"
	"github.com/workload-ca/workload-ca/loadtest"
)

// The fixture: nodes bench-node-NNN, each with a ztunnel pod
// (istio-system/ztunnel) and workload pods of distinct service accounts
// taken from benchNamespaces × saPerNamespace.
const (
	audience        = "istio-ca"
	benchNamespaces = 5
	saPerNamespace  = 20
	tokenSeconds    = 12 * 3600
)

// node is one node of the fixture and its ztunnel.
type node struct {
	name       string
	token      string   // the ztunnel pod's token
	identities []string // of the workload pods on the node
}

// createCluster creates nodes nodes with idsPerNode workload pods each and
// a ztunnel pod with a pod-bound token, with a client of its own (the
// harness's client is limited to 100 QPS).
func createCluster(ctx context.Context, cp *controlplane.ControlPlane, nodes, idsPerNode int) ([]node, error) {
	cfg := cp.RESTConfig()
	cfg.QPS, cfg.Burst = 1000, 1000
	kc, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	sas := max(benchNamespaces*saPerNamespace, idsPerNode)
	perNS := (sas + benchNamespaces - 1) / benchNamespaces
	saOf := func(k int) (ns, sa string) {
		k %= sas
		return fmt.Sprintf("bench-%d", k/perNS), fmt.Sprintf("app-%d", k%perNS)
	}

	namespaces := []string{"istio-system"}
	for i := range benchNamespaces {
		namespaces = append(namespaces, fmt.Sprintf("bench-%d", i))
	}
	for _, ns := range namespaces {
		if _, err := kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			return nil, err
		}
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(16)
	createSA := func(ns, name string) {
		g.Go(func() error {
			_, err := kc.CoreV1().ServiceAccounts(ns).Create(gctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}}, metav1.CreateOptions{})
			return err
		})
	}
	createSA("istio-system", "ztunnel")
	for k := range sas {
		createSA(saOf(k))
	}
	out := make([]node, nodes)
	for i := range out {
		out[i].name = fmt.Sprintf("bench-node-%03d", i)
		g.Go(func() error {
			_, err := kc.CoreV1().Nodes().Create(gctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{
				Name: out[i].name, Labels: map[string]string{corev1.LabelHostname: out[i].name}}}, metav1.CreateOptions{})
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return nil, fmt.Errorf("namespaces, service accounts, nodes: %w", err)
	}

	g, gctx = errgroup.WithContext(ctx)
	g.SetLimit(64)
	for i := range out {
		n := &out[i]
		for j := range idsPerNode {
			ns, sa := saOf(i*idsPerNode + j)
			n.identities = append(n.identities, "spiffe://cluster.local/ns/"+ns+"/sa/"+sa)
			g.Go(func() error {
				_, err := createPod(gctx, kc, ns, fmt.Sprintf("w-%03d-%02d", i, j), sa, n.name)
				return err
			})
		}
		g.Go(func() error {
			pod, err := createPod(gctx, kc, "istio-system", fmt.Sprintf("ztunnel-%03d", i), "ztunnel", n.name)
			if err != nil {
				return err
			}
			n.token, err = podToken(gctx, kc, pod)
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return nil, fmt.Errorf("pods and tokens: %w", err)
	}
	return out, nil
}

func createPod(ctx context.Context, kc kubernetes.Interface, ns, name, sa, nodeName string) (*corev1.Pod, error) {
	return kc.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PodSpec{ServiceAccountName: sa, NodeName: nodeName,
			Containers: []corev1.Container{{Name: "pause", Image: controlplane.PauseImage}}},
	}, metav1.CreateOptions{})
}

// podToken mints the pod's service-account token for the CA's audience.
func podToken(ctx context.Context, kc kubernetes.Interface, pod *corev1.Pod) (string, error) {
	exp := int64(tokenSeconds)
	resp, err := kc.CoreV1().ServiceAccounts(pod.Namespace).CreateToken(ctx, pod.Spec.ServiceAccountName, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{Audiences: []string{audience}, ExpirationSeconds: &exp,
			BoundObjectRef: &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID}},
	}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("token for pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	return resp.Status.Token, nil
}

// listPods times one LIST of every pod, what an informer's initial sync
// costs at least, and counts them.
func listPods(ctx context.Context, cp *controlplane.ControlPlane) (time.Duration, int, error) {
	kc, err := kubernetes.NewForConfig(cp.RESTConfig())
	if err != nil {
		return 0, 0, err
	}
	began := time.Now()
	l, err := kc.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return 0, 0, err
	}
	return time.Since(began), len(l.Items), nil
}

// planOf is the load generator's plan for the first ztunnels ztunnels of
// nodes, with the first ids identities of each, sending cluster in the
// clusterid header (empty: the default).
func planOf(nodes []node, ztunnels, ids int, cluster string) loadtest.Plan {
	p := make(loadtest.Plan, 0, ztunnels)
	for _, n := range nodes[:ztunnels] {
		p = append(p, loadtest.Ztunnel{Token: n.token, Identities: n.identities[:ids], ClusterID: cluster})
	}
	return p
}

// writePlan writes plan p to path.
func writePlan(path string, p loadtest.Plan) error {
	b, err := json.Marshal(p)
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o600)
}
