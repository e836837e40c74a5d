package cluster

import (
	"context"
	"log/slog"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// SecretLabel marks the Secrets that configure remote clusters, with the
// value "true", as istiod's remote secrets are marked (istioctl
// create-remote-secret writes them): each data key is a cluster id, its
// value that cluster's kubeconfig.
const SecretLabel = "istio/multiCluster" //nolint:gosec // a label name, not a credential

// WatchSecrets configures r from the Secrets labelled SecretLabel=true in
// namespace, as they are created, changed and deleted, until ctx ends.
// Only those Secrets are listed and held.
func WatchSecrets(ctx context.Context, client kubernetes.Interface, namespace string, r *Remotes, log *slog.Logger) error {
	selector := SecretLabel + "=true"
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.LabelSelector = selector
			return client.CoreV1().Secrets(namespace).List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.LabelSelector = selector
			return client.CoreV1().Secrets(namespace).Watch(ctx, o)
		},
	}
	inf := cache.NewSharedIndexInformer(lw, &corev1.Secret{}, 10*time.Minute, cache.Indexers{})
	source := func(s *corev1.Secret) string { return "secret " + s.Namespace + "/" + s.Name }
	set := func(obj any) {
		if s, ok := obj.(*corev1.Secret); ok {
			r.Set(source(s), Untrusted, s.Data)
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    set,
		UpdateFunc: func(_, obj any) { set(obj) },
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if s, ok := obj.(*corev1.Secret); ok {
				log.Info("remote cluster Secret deleted", "secret", s.Namespace+"/"+s.Name)
				r.Set(source(s), Untrusted, nil)
			}
		},
	}); err != nil {
		return err
	}
	inf.Run(ctx.Done())
	return nil
}
