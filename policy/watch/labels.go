package watch

import (
	"fmt"
	"sync/atomic"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/metadata/metadatainformer"
	"k8s.io/client-go/tools/cache"

	"github.com/workload-ca/workload-ca/issuance"
)

var (
	namespacesGVR = schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}
	nodesGVR      = schema.GroupVersionResource{Version: "v1", Resource: "nodes"}
)

// labelIndex is the labels of the local cluster's namespaces and nodes
// (policy.Labels), from metadata-only informers whose store keeps a name
// and labels per object.
type labelIndex struct {
	cluster           string
	namespaces, nodes cache.SharedIndexInformer
	// nsSynced and nodesSynced are set once the informers have listed:
	// HasSynced takes the informers' queue lock, and a request may look
	// up labels for every policy.
	nsSynced, nodesSynced atomic.Bool
}

func newLabelIndex(client metadata.Interface, cluster string) (*labelIndex, error) {
	l := &labelIndex{cluster: cluster}
	for _, x := range []struct {
		gvr schema.GroupVersionResource
		to  *cache.SharedIndexInformer
	}{{namespacesGVR, &l.namespaces}, {nodesGVR, &l.nodes}} {
		inf := metadatainformer.NewFilteredMetadataInformer(client, x.gvr, metav1.NamespaceAll, 0, cache.Indexers{}, nil).Informer()
		if err := inf.SetTransform(keepLabels); err != nil {
			return nil, err
		}
		*x.to = inf
	}
	return l, nil
}

// keepLabels is the informers' transform: a name and labels are all the
// store keeps.
func keepLabels(obj any) (any, error) {
	m, ok := obj.(*metav1.PartialObjectMetadata)
	if !ok {
		return obj, nil
	}
	return &metav1.PartialObjectMetadata{TypeMeta: m.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{Name: m.Name, Labels: m.Labels, ResourceVersion: m.ResourceVersion}}, nil
}

func (l *labelIndex) synced() bool {
	return isSynced(&l.nsSynced, l.namespaces) && isSynced(&l.nodesSynced, l.nodes)
}

// isSynced is whether inf has listed, remembered in flag once it has.
func isSynced(flag *atomic.Bool, inf cache.SharedIndexInformer) bool {
	if flag.Load() {
		return true
	}
	if inf.HasSynced() {
		flag.Store(true)
		return true
	}
	return false
}

// NamespaceLabels is a namespace's labels (policy.Labels).
func (l *labelIndex) NamespaceLabels(cluster, name string) (map[string]string, error) {
	return l.lookup(l.namespaces, &l.nsSynced, "namespace", cluster, name)
}

// NodeLabels is a node's labels (policy.Labels).
func (l *labelIndex) NodeLabels(cluster, name string) (map[string]string, error) {
	return l.lookup(l.nodes, &l.nodesSynced, "node", cluster, name)
}

func (l *labelIndex) lookup(inf cache.SharedIndexInformer, synced *atomic.Bool, kind, cluster, name string) (map[string]string, error) {
	if cluster != "" && cluster != l.cluster {
		return nil, fmt.Errorf("%w: the labels of cluster %q are not watched", issuance.ErrPolicyUnavailable, cluster)
	}
	if !isSynced(synced, inf) {
		return nil, fmt.Errorf("%w: the %s labels are not listed yet", issuance.ErrPolicyUnavailable, kind)
	}
	if name == "" {
		return nil, nil
	}
	obj, ok, err := inf.GetStore().GetByKey(name)
	switch {
	case err != nil:
		return nil, fmt.Errorf("%w: %w", issuance.ErrPolicyUnavailable, err)
	case !ok:
		// The node rule has just seen a pod of it, so it exists: the
		// informer has not seen it yet. Labels not seen are unknown,
		// not absent.
		return nil, fmt.Errorf("%w: %s %q is not listed yet", issuance.ErrPolicyUnavailable, kind, name)
	}
	return obj.(*metav1.PartialObjectMetadata).Labels, nil
}
