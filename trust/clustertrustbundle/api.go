package clustertrustbundle

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"slices"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	certv1 "k8s.io/api/certificates/v1"
	certv1beta1 "k8s.io/api/certificates/v1beta1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/workload-ca/workload-ca/trust"
)

// ErrNotServed is returned by Run when the apiserver serves neither
// certificates.k8s.io/v1 nor v1beta1 ClusterTrustBundles (before 1.33, or
// 1.33-1.36 without the beta API and feature gate enabled).
var ErrNotServed = errors.New("ClusterTrustBundles are not served")

// bundleAPI is one served version of the ClusterTrustBundle API. The rest
// of the package works with v1 objects; the v1beta1 adapter converts (the
// two versions have the same fields).
type bundleAPI struct {
	version    string
	objectType runtime.Object
	list       func(context.Context, metav1.ListOptions) (runtime.Object, error)
	watch      func(context.Context, metav1.ListOptions) (watch.Interface, error)
	get        func(context.Context, string) (*certv1.ClusterTrustBundle, error)
	create     func(context.Context, *certv1.ClusterTrustBundle) error
	update     func(context.Context, *certv1.ClusterTrustBundle) error
	delete     func(context.Context, string, metav1.DeleteOptions) error
	// client tells the reflector whether watch-list streaming works (not
	// with the fake clientset).
	client kubernetes.Interface
}

// detectAPI picks v1 if the apiserver serves it, else v1beta1.
func detectAPI(ctx context.Context, client kubernetes.Interface) (*bundleAPI, error) {
	d := client.Discovery()
	for _, gv := range []string{certv1.SchemeGroupVersion.String(), certv1beta1.SchemeGroupVersion.String()} {
		ok, err := servesBundles(ctx, d, gv)
		if err != nil {
			return nil, fmt.Errorf("clustertrustbundle: discovery of %s: %w", gv, err)
		}
		if !ok {
			continue
		}
		if gv == certv1.SchemeGroupVersion.String() {
			return v1API(client), nil
		}
		return v1beta1API(client), nil
	}
	return nil, fmt.Errorf("clustertrustbundle: %w: the apiserver serves neither certificates.k8s.io/v1 nor v1beta1 clustertrustbundles", ErrNotServed)
}

func servesBundles(ctx context.Context, d discovery.DiscoveryInterfaces, gv string) (bool, error) {
	list, err := d.ServerResourcesForGroupVersionWithContext(ctx, gv)
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	for _, r := range list.APIResources {
		if r.Name == "clustertrustbundles" {
			return true, nil
		}
	}
	return false, nil
}

func v1API(client kubernetes.Interface) *bundleAPI {
	c := client.CertificatesV1().ClusterTrustBundles()
	return &bundleAPI{
		version:    "v1",
		objectType: &certv1.ClusterTrustBundle{},
		list: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return c.List(ctx, o)
		},
		watch: c.Watch,
		get: func(ctx context.Context, name string) (*certv1.ClusterTrustBundle, error) {
			return c.Get(ctx, name, metav1.GetOptions{})
		},
		create: func(ctx context.Context, b *certv1.ClusterTrustBundle) error {
			_, err := c.Create(ctx, b, metav1.CreateOptions{FieldManager: FieldManager})
			return err
		},
		update: func(ctx context.Context, b *certv1.ClusterTrustBundle) error {
			_, err := c.Update(ctx, b, metav1.UpdateOptions{FieldManager: FieldManager})
			return err
		},
		delete: c.Delete,
		client: client,
	}
}

func v1beta1API(client kubernetes.Interface) *bundleAPI {
	c := client.CertificatesV1beta1().ClusterTrustBundles()
	return &bundleAPI{
		version:    "v1beta1",
		objectType: &certv1beta1.ClusterTrustBundle{},
		list: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return c.List(ctx, o)
		},
		watch: c.Watch,
		get: func(ctx context.Context, name string) (*certv1.ClusterTrustBundle, error) {
			b, err := c.Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return nil, err
			}
			return fromV1beta1(b), nil
		},
		create: func(ctx context.Context, b *certv1.ClusterTrustBundle) error {
			_, err := c.Create(ctx, toV1beta1(b), metav1.CreateOptions{FieldManager: FieldManager})
			return err
		},
		update: func(ctx context.Context, b *certv1.ClusterTrustBundle) error {
			_, err := c.Update(ctx, toV1beta1(b), metav1.UpdateOptions{FieldManager: FieldManager})
			return err
		},
		delete: c.Delete,
		client: client,
	}
}

// listWatch lists and watches the bundles matching fieldSelector.
func (a *bundleAPI) listWatch(fieldSelector string) cache.ListerWatcher {
	return trust.ListWatch(a.client, fieldSelector, a.list, a.watch)
}

// toV1Transform is the informers' transform: it stores every bundle as a
// v1 object without managed fields. It is idempotent, as informers require.
func toV1Transform(obj any) (any, error) {
	switch b := obj.(type) {
	case *certv1.ClusterTrustBundle:
		b.ManagedFields = nil
		return b, nil
	case *certv1beta1.ClusterTrustBundle:
		out := fromV1beta1(b)
		out.ManagedFields = nil
		return out, nil
	}
	return obj, nil // e.g. cache.DeletedFinalStateUnknown
}

func fromV1beta1(b *certv1beta1.ClusterTrustBundle) *certv1.ClusterTrustBundle {
	return &certv1.ClusterTrustBundle{
		ObjectMeta: b.ObjectMeta,
		Spec:       certv1.ClusterTrustBundleSpec{SignerName: b.Spec.SignerName, TrustBundle: b.Spec.TrustBundle},
	}
}

func toV1beta1(b *certv1.ClusterTrustBundle) *certv1beta1.ClusterTrustBundle {
	return &certv1beta1.ClusterTrustBundle{
		ObjectMeta: b.ObjectMeta,
		Spec:       certv1beta1.ClusterTrustBundleSpec{SignerName: b.Spec.SignerName, TrustBundle: b.Spec.TrustBundle},
	}
}

// Find returns the ClusterTrustBundles named name or, with name "", those
// of signer (every bundle when both are empty), from whichever version of
// the API the apiserver serves, as v1 objects.
func Find(ctx context.Context, client kubernetes.Interface, name, signer string) ([]certv1.ClusterTrustBundle, error) {
	api, err := detectAPI(ctx, client)
	if err != nil {
		return nil, err
	}
	var sel string
	switch {
	case name != "":
		sel = "metadata.name=" + name
	case signer != "":
		sel = "spec.signerName=" + signer
	}
	obj, err := api.list(ctx, metav1.ListOptions{FieldSelector: sel})
	if err != nil {
		return nil, fmt.Errorf("list ClusterTrustBundles (%s): %w", api.version, err)
	}
	switch l := obj.(type) {
	case *certv1.ClusterTrustBundleList:
		return l.Items, nil
	case *certv1beta1.ClusterTrustBundleList:
		out := make([]certv1.ClusterTrustBundle, 0, len(l.Items))
		for i := range l.Items {
			out = append(out, *fromV1beta1(&l.Items[i]))
		}
		return out, nil
	}
	return nil, fmt.Errorf("list ClusterTrustBundles: unexpected %T", obj)
}

// SelectRoots returns the roots in the ClusterTrustBundles of signer that
// carry every label of matchLabels, de-duplicated: what a pod mounting
// them with that selector would trust. A bundle that does not parse is an
// error, not skipped.
func SelectRoots(ctx context.Context, client kubernetes.Interface, signer string, matchLabels map[string]string) ([]*x509.Certificate, error) {
	bundles, err := Find(ctx, client, "", signer)
	if err != nil {
		return nil, err
	}
	var out []*x509.Certificate
	for _, b := range bundles {
		if !trust.HasLabels(b.Labels, matchLabels) {
			continue
		}
		// The trust domain only names the bundle here: its roots are kept.
		parsed, err := x509bundle.Parse(spiffeid.RequireTrustDomainFromString("bundle.invalid"), []byte(b.Spec.TrustBundle))
		if err != nil {
			return nil, fmt.Errorf("ClusterTrustBundle %s: %w", b.Name, err)
		}
		for _, c := range parsed.X509Authorities() {
			if !slices.ContainsFunc(out, c.Equal) {
				out = append(out, c)
			}
		}
	}
	return out, nil
}
