package podcert

import (
	"context"
	"errors"
	"fmt"

	certv1 "k8s.io/api/certificates/v1"
	certv1beta1 "k8s.io/api/certificates/v1beta1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// The versions of certificates.k8s.io that serve PodCertificateRequests:
// v1 from Kubernetes 1.37, v1beta1 in 1.35 and 1.36.
const (
	APIv1      = "v1"
	APIv1beta1 = "v1beta1"
)

// ErrNotServed is returned by Run when the API server serves
// PodCertificateRequests in neither version.
var ErrNotServed = errors.New("PodCertificateRequests are not served")

// item is a request as the informer's store holds it: in v1's form
// whatever version was read, with v1beta1's deprecated key fields (a
// request of a 1.35 kubelet carries a PKIX public key and a proof of
// possession instead of a stub CSR).
type item struct {
	*certv1.PodCertificateRequest
	pkixPublicKey, proofOfPossession []byte
}

// requestAPI is one served version: where to list and watch, how a
// stored object becomes an item, and how a status is written.
type requestAPI struct {
	version      string
	rest         rest.Interface
	object       runtime.Object
	toItem       func(obj any) (*item, bool)
	updateStatus func(ctx context.Context, it *item) error
}

// detectAPI picks v1 if the API server serves PodCertificateRequests
// there, else v1beta1; want forces one.
func detectAPI(ctx context.Context, client kubernetes.Interface, want string) (*requestAPI, error) {
	switch want {
	case APIv1:
		return v1API(client), nil
	case APIv1beta1:
		return v1beta1API(client), nil
	case "":
	default:
		return nil, fmt.Errorf("podcert: API version %q: want v1, v1beta1 or empty (discover)", want)
	}
	for _, gv := range []string{certv1.SchemeGroupVersion.String(), certv1beta1.SchemeGroupVersion.String()} {
		list, err := client.Discovery().ServerResourcesForGroupVersionWithContext(ctx, gv)
		switch {
		case apierrors.IsNotFound(err):
			continue
		case err != nil:
			return nil, fmt.Errorf("podcert: discovery of %s: %w", gv, err)
		}
		for _, r := range list.APIResources {
			if r.Name != "podcertificaterequests" {
				continue
			}
			if gv == certv1.SchemeGroupVersion.String() {
				return v1API(client), nil
			}
			return v1beta1API(client), nil
		}
	}
	return nil, fmt.Errorf("podcert: %w in certificates.k8s.io v1 or v1beta1", ErrNotServed)
}

func v1API(client kubernetes.Interface) *requestAPI {
	return &requestAPI{
		version: APIv1,
		rest:    client.CertificatesV1().RESTClient(),
		object:  &certv1.PodCertificateRequest{},
		toItem: func(obj any) (*item, bool) {
			p, ok := obj.(*certv1.PodCertificateRequest)
			return &item{PodCertificateRequest: p}, ok
		},
		updateStatus: func(ctx context.Context, it *item) error {
			_, err := client.CertificatesV1().PodCertificateRequests(it.Namespace).UpdateStatus(ctx, it.PodCertificateRequest, metav1.UpdateOptions{})
			return err
		},
	}
}

func v1beta1API(client kubernetes.Interface) *requestAPI {
	return &requestAPI{
		version: APIv1beta1,
		rest:    client.CertificatesV1beta1().RESTClient(),
		object:  &certv1beta1.PodCertificateRequest{},
		toItem: func(obj any) (*item, bool) {
			p, ok := obj.(*certv1beta1.PodCertificateRequest)
			if !ok {
				return nil, false
			}
			return fromV1beta1(p), true
		},
		updateStatus: func(ctx context.Context, it *item) error {
			_, err := client.CertificatesV1beta1().PodCertificateRequests(it.Namespace).UpdateStatus(ctx, toV1beta1(it), metav1.UpdateOptions{})
			return err
		},
	}
}

// fromV1beta1 is p in v1's form; the two versions differ only in the
// deprecated key fields, kept beside it.
func fromV1beta1(p *certv1beta1.PodCertificateRequest) *item {
	s := p.Spec
	return &item{
		PodCertificateRequest: &certv1.PodCertificateRequest{
			TypeMeta:   metav1.TypeMeta{Kind: "PodCertificateRequest", APIVersion: certv1.SchemeGroupVersion.String()},
			ObjectMeta: p.ObjectMeta,
			Spec: certv1.PodCertificateRequestSpec{SignerName: s.SignerName, PodName: s.PodName, PodUID: s.PodUID,
				ServiceAccountName: s.ServiceAccountName, ServiceAccountUID: s.ServiceAccountUID, NodeName: s.NodeName, NodeUID: s.NodeUID,
				MaxExpirationSeconds: s.MaxExpirationSeconds, StubPKCS10Request: s.StubPKCS10Request,
				UnverifiedUserAnnotations: s.UnverifiedUserAnnotations},
			Status: certv1.PodCertificateRequestStatus{Conditions: p.Status.Conditions, CertificateChain: p.Status.CertificateChain,
				NotBefore: p.Status.NotBefore, BeginRefreshAt: p.Status.BeginRefreshAt, NotAfter: p.Status.NotAfter},
		},
		pkixPublicKey:     s.PKIXPublicKey,     //nolint:staticcheck // a 1.35 kubelet's key form, read on purpose
		proofOfPossession: s.ProofOfPossession, //nolint:staticcheck // a 1.35 kubelet's key form, read on purpose
	}
}

// toV1beta1 is it back in v1beta1's form, for its status update.
func toV1beta1(it *item) *certv1beta1.PodCertificateRequest {
	s, st := it.Spec, it.Status
	return &certv1beta1.PodCertificateRequest{
		TypeMeta:   metav1.TypeMeta{Kind: "PodCertificateRequest", APIVersion: certv1beta1.SchemeGroupVersion.String()},
		ObjectMeta: it.ObjectMeta,
		Spec: certv1beta1.PodCertificateRequestSpec{SignerName: s.SignerName, PodName: s.PodName, PodUID: s.PodUID,
			ServiceAccountName: s.ServiceAccountName, ServiceAccountUID: s.ServiceAccountUID, NodeName: s.NodeName, NodeUID: s.NodeUID,
			MaxExpirationSeconds: s.MaxExpirationSeconds, StubPKCS10Request: s.StubPKCS10Request,
			PKIXPublicKey: it.pkixPublicKey, ProofOfPossession: it.proofOfPossession, //nolint:staticcheck // kept as read
			UnverifiedUserAnnotations: s.UnverifiedUserAnnotations},
		Status: certv1beta1.PodCertificateRequestStatus{Conditions: st.Conditions, CertificateChain: st.CertificateChain,
			NotBefore: st.NotBefore, BeginRefreshAt: st.BeginRefreshAt, NotAfter: st.NotAfter},
	}
}
