package clustertrustbundle

import (
	"context"
	"crypto/x509"
	"errors"
	"strings"
	"testing"
	"time"

	authzv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	testclock "k8s.io/utils/clock/testing"

	"github.com/workload-ca/workload-ca/internal/rbac"
	"github.com/workload-ca/workload-ca/internal/testaccess"
	"github.com/workload-ca/workload-ca/internal/testca"
	"github.com/workload-ca/workload-ca/internal/testlog"
	"github.com/workload-ca/workload-ca/internal/testobs"
	"github.com/workload-ca/workload-ca/internal/testwait"
	"github.com/workload-ca/workload-ca/trust"
)

// fakeCluster returns a fake clientset that serves ClusterTrustBundles in
// the given versions and answers access reviews with allow.
func fakeCluster(allow func(*authzv1.ResourceAttributes) bool, versions ...string) *fake.Clientset {
	client := fake.NewClientset()
	for _, v := range versions {
		client.Resources = append(client.Resources, &metav1.APIResourceList{
			GroupVersion: "certificates.k8s.io/" + v,
			APIResources: []metav1.APIResource{{Name: "clustertrustbundles"}},
		})
	}
	return testaccess.Answer(client, allow)
}

var allowAll = testaccess.AllowAll

func exists(client *fake.Clientset, name string) bool {
	_, err := client.CertificatesV1().ClusterTrustBundles().Get(context.Background(), name, metav1.GetOptions{})
	return err == nil
}

// TestRun drives Run against the fake clientset: first publication, a
// roots change with Trigger, a roots change picked up by the periodic
// resync alone, and repair after a deletion.
func TestRun(t *testing.T) {
	roots := testca.RootCerts(t, 2)
	client := fakeCluster(allowAll, "v1", "v1beta1")
	rs := &testca.Roots{}
	rs.Set(roots[0])
	rec := &testobs.Results{}
	fc := testclock.NewFakeClock(time.Now())
	p, err := New(Config{Client: client, Options: trust.Options{TrustDomain: testTD, Roots: rs.Get, Observer: rec, Clock: fc, Logger: testlog.New(t)}})
	if err != nil {
		t.Fatal(err)
	}
	p.Trigger() // before Run: a no-op
	startRun(t, p)

	first := hashedName(mustContent(t, roots[0]))
	testwait.Eventually(t, "first bundle, seen by the informer", func() bool {
		return exists(client, first) && rec.Count(trust.ResultUnchanged) > 0
	})

	rs.Set(roots[0], roots[1])
	p.Trigger()
	both := hashedName(mustContent(t, roots...))
	testwait.Eventually(t, "rotation bundle replacing the first", func() bool {
		return exists(client, both) && !exists(client, first)
	})

	rs.Set(roots[1])
	last := hashedName(mustContent(t, roots[1]))
	testwait.Eventually(t, "resync to publish new roots without a trigger", func() bool {
		fc.Step(trust.DefaultResyncPeriod)
		return exists(client, last) && !exists(client, both)
	})

	if err := client.CertificatesV1().ClusterTrustBundles().Delete(context.Background(), last, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, "deleted bundle re-created", func() bool { return exists(client, last) })
	if n := rec.Count(trust.ResultError); n != 0 {
		t.Errorf("%d reconciles failed", n)
	}
}

func TestRunFallsBackToV1beta1(t *testing.T) {
	roots := testca.RootCerts(t, 1)
	client := fakeCluster(allowAll, "v1beta1")
	p, err := New(Config{Client: client, Options: trust.Options{TrustDomain: testTD, Roots: func() []*x509.Certificate { return roots }}})
	if err != nil {
		t.Fatal(err)
	}
	startRun(t, p)
	name := hashedName(mustContent(t, roots...))
	testwait.Eventually(t, "v1beta1 bundle", func() bool {
		b, err := client.CertificatesV1beta1().ClusterTrustBundles().Get(context.Background(), name, metav1.GetOptions{})
		return err == nil && b.Spec.SignerName == DefaultSignerName && b.Labels[LabelManagedBy] == ManagedBy
	})
	if exists(client, name) {
		t.Error("a v1 bundle was written too")
	}
}

func TestRunFailsFast(t *testing.T) {
	noAttest := func(ra *authzv1.ResourceAttributes) bool { return ra.Verb != "attest" }
	wildcardOnly := func(ra *authzv1.ResourceAttributes) bool {
		return ra.Verb != "attest" || ra.Name == "workload-ca.io/*"
	}
	tests := []struct {
		name     string
		client   *fake.Clientset
		istio    bool
		wantErr  error
		contains []string
		excludes string
	}{
		{name: "not served", client: fakeCluster(allowAll), wantErr: ErrNotServed},
		{name: "no attest", client: fakeCluster(noAttest, "v1"), istio: true, wantErr: rbac.ErrPermissionDenied,
			contains: []string{`attest on signers, resourceName "workload-ca.io/spiffe"`, `"istio.io/istiod-ca"`}},
		{name: "domain wildcard is enough for our signer", client: fakeCluster(wildcardOnly, "v1"), istio: true,
			wantErr: rbac.ErrPermissionDenied, contains: []string{`"istio.io/istiod-ca"`}, excludes: "spiffe"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, err := New(Config{Client: tc.client, IstioCompatible: tc.istio, Options: trust.Options{TrustDomain: testTD, Roots: func() []*x509.Certificate { return nil }}})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			err = p.Run(ctx)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("Run = %v, want %v", err, tc.wantErr)
			}
			for _, s := range tc.contains {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not contain %q", err, s)
				}
			}
			if tc.excludes != "" && strings.Contains(err.Error(), tc.excludes) {
				t.Errorf("error %q contains %q", err, tc.excludes)
			}
		})
	}
}
