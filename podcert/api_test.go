package podcert

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"errors"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

func TestDetectAPI(t *testing.T) {
	served := func(gvs ...string) *fake.Clientset {
		c := fake.NewClientset()
		for _, gv := range gvs {
			c.Resources = append(c.Resources, &metav1.APIResourceList{GroupVersion: gv,
				APIResources: []metav1.APIResource{{Name: "podcertificaterequests"}, {Name: "podcertificaterequests/status"}}})
		}
		return c
	}
	for _, tc := range []struct {
		name    string
		client  *fake.Clientset
		want    string // version chosen, or empty for an error
		force   string
		wantErr error
	}{
		{name: "v1 and v1beta1 served: v1", client: served("certificates.k8s.io/v1", "certificates.k8s.io/v1beta1"), want: APIv1},
		{name: "only v1beta1 (1.35, 1.36): v1beta1", client: served("certificates.k8s.io/v1beta1"), want: APIv1beta1},
		{name: "neither: not served", client: served(), wantErr: ErrNotServed},
		{name: "v1beta1 asked for", client: served("certificates.k8s.io/v1"), force: APIv1beta1, want: APIv1beta1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			api, err := detectAPI(context.Background(), tc.client, tc.force)
			switch {
			case tc.wantErr != nil:
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("detectAPI: %v, want %v", err, tc.wantErr)
				}
			case err != nil:
				t.Fatal(err)
			case api.version != tc.want:
				t.Errorf("chose %s, want %s", api.version, tc.want)
			}
		})
	}
}

// A request in v1beta1's deprecated form is decided by its PKIX key, once
// its proof of possession is the key's signature of the pod's UID.
func TestDecideDeprecatedKeyForm(t *testing.T) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	pkix, err := x509.MarshalPKIXPublicKey(key.Public())
	if err != nil {
		t.Fatal(err)
	}
	pcr := newPCR(t, "apps", "web", "web-sa", testSigner, key, 3600)
	pcr.Spec.StubPKCS10Request = nil
	sign := func(uid string) []byte {
		sum := sha256.Sum256([]byte(uid))
		sig, err := ecdsa.SignASN1(rand.Reader, key, sum[:])
		if err != nil {
			t.Fatal(err)
		}
		return sig
	}
	good := decide(&item{PodCertificateRequest: pcr, pkixPublicKey: pkix, proofOfPossession: sign(string(pcr.Spec.PodUID))}, testTD)
	if good.reason != "" || !good.req.CSR.PublicKey.(*ecdsa.PublicKey).Equal(key.Public()) || good.req.ID.String() != "spiffe://cluster.local/ns/apps/sa/web-sa" {
		t.Fatalf("decision %+v, want the pod's SVID for the PKIX key", good)
	}
	for name, it := range map[string]*item{
		"proof of another pod's UID": {PodCertificateRequest: pcr, pkixPublicKey: pkix, proofOfPossession: sign("someone-else")},
		"no proof":                   {PodCertificateRequest: pcr, pkixPublicKey: pkix},
		"key garbage":                {PodCertificateRequest: pcr, pkixPublicKey: []byte("not DER"), proofOfPossession: sign(string(pcr.Spec.PodUID))},
	} {
		if d := decide(it, testTD); d.reason != ReasonInvalidRequest {
			t.Errorf("%s: decision %+v, want denied %s", name, d, ReasonInvalidRequest)
		}
	}
}
