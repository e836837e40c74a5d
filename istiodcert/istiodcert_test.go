package istiodcert

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	authzv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	testclock "k8s.io/utils/clock/testing"

	"github.com/workload-ca/workload-ca/ca"
	"github.com/workload-ca/workload-ca/internal/rbac"
	"github.com/workload-ca/workload-ca/internal/testaccess"
	"github.com/workload-ca/workload-ca/internal/testca"
	"github.com/workload-ca/workload-ca/internal/testlog"
	"github.com/workload-ca/workload-ca/internal/testobs"
	"github.com/workload-ca/workload-ca/internal/testwait"
	"github.com/workload-ca/workload-ca/trust"
	"github.com/workload-ca/workload-ca/trust/rootset"
)

var testTD = spiffeid.RequireTrustDomainFromString("example.org")

const testNS = "istio-system"

// fakeCluster returns a fake clientset holding objs that answers access
// reviews with allow (the fake's default answer is "denied").
func fakeCluster(allow func(*authzv1.ResourceAttributes) bool, objs ...runtime.Object) *fake.Clientset {
	client := fake.NewClientset(objs...)
	return testaccess.Answer(client, allow)
}

var allowAll = testaccess.AllowAll

func newAuthority(t *testing.T, clk *testclock.FakeClock, c *testca.CA) *ca.Authority {
	t.Helper()
	a, err := ca.New(ca.Config{TrustDomain: testTD, Clock: clk}, c.Material())
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func rootsPEM(t testing.TB, roots []*x509.Certificate) string {
	t.Helper()
	s, err := rootset.PEM(roots)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// held returns the Secret's certificate, verified as a TLS client holding
// only ca.crt verifies istiod, or nil if there is no usable one.
func held(t *testing.T, c kubernetes.Interface, now time.Time, name string) *x509.Certificate {
	t.Helper()
	s, err := c.CoreV1().Secrets(testNS).Get(context.Background(), DefaultSecretName, metav1.GetOptions{})
	if err != nil {
		return nil
	}
	pair, err := tls.X509KeyPair(s.Data[CertKey], s.Data[KeyKey])
	if err != nil {
		return nil // edited, not yet reissued
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(s.Data[RootsKey]) {
		t.Fatal("no roots in ca.crt")
	}
	inter := x509.NewCertPool()
	for _, der := range pair.Certificate[1:] {
		c, err := x509.ParseCertificate(der)
		if err != nil {
			t.Fatal(err)
		}
		inter.AddCert(c)
	}
	if _, err := pair.Leaf.Verify(x509.VerifyOptions{DNSName: name, Roots: roots, Intermediates: inter, CurrentTime: now}); err != nil {
		t.Fatalf("istiod's certificate does not verify with ca.crt: %v", err)
	}
	if s.Type != corev1.SecretTypeTLS || s.Labels[LabelManagedBy] != ManagedBy || s.Labels[LabelTrustDomain] != testTD.Name() {
		t.Fatalf("Secret type %q, labels %v", s.Type, s.Labels)
	}
	return pair.Leaf
}

// TestRun drives Run against the fake clientset: the Secret is created,
// left alone while its certificate is good, reissued two thirds into its
// life, after an edit, after a deletion and when the CA signs with
// another certificate; a Secret that is not ours is never written.
func TestRun(t *testing.T) {
	clk := testclock.NewFakeClock(time.Now())
	root := testca.NewRoot(t, testca.P256)
	mid := testca.NewIntermediate(t, root, testca.P256)
	authority := newAuthority(t, clk, mid)
	client := fakeCluster(allowAll)
	rec := &testobs.Results{}
	var notAfter atomic.Pointer[time.Time]
	p, err := New(Config{Client: client, Issuer: authority, Namespace: testNS, TTL: 3 * time.Hour,
		Holding: func(t time.Time) { notAfter.Store(&t) },
		Options: trust.Options{TrustDomain: testTD, Roots: authority.Roots, Observer: rec, Clock: clk, Logger: testlog.New(t)}})
	if err != nil {
		t.Fatal(err)
	}
	testwait.Run(t, p.Run)

	const name = "istiod." + testNS + ".svc"
	var first *x509.Certificate
	testwait.Eventually(t, "the Secret created", func() bool {
		first = held(t, client, clk.Now(), name)
		return first != nil
	})
	if got := first.NotAfter.Sub(first.NotBefore); got < 3*time.Hour || got > 3*time.Hour+time.Hour {
		t.Errorf("lifetime %v, want 3h (and the backdate)", got)
	}
	// The results are reported after the write; once the Secret has been
	// seen unchanged, its creation has been counted.
	testwait.Eventually(t, "the created Secret seen unchanged", func() bool { return rec.Count(trust.ResultUnchanged) > 0 })
	if rec.Count(trust.ResultCreated) != 1 {
		t.Errorf("created %d times, want 1", rec.Count(trust.ResultCreated))
	}
	if got := notAfter.Load(); got == nil || !got.Equal(first.NotAfter) {
		t.Errorf("Holding told %v, want %v", got, first.NotAfter)
	}

	// Two thirds into its life, it is reissued by the wake-up the last
	// reconcile scheduled.
	clk.Step(first.NotAfter.Sub(clk.Now()) - time.Hour + time.Minute)
	testwait.Eventually(t, "reissued two thirds into its life", func() bool {
		c := held(t, client, clk.Now(), name)
		return c != nil && c.SerialNumber.Cmp(first.SerialNumber) != 0
	})

	// Edited: a key that does not match the certificate.
	s, err := client.CoreV1().Secrets(testNS).Get(context.Background(), DefaultSecretName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	before := held(t, client, clk.Now(), name)
	s.Data[KeyKey] = testca.NewRoot(t, testca.P256).KeyPEM(t)
	if _, err := client.CoreV1().Secrets(testNS).Update(context.Background(), s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, "reissued after an edit", func() bool {
		c := held(t, client, clk.Now(), name)
		return c != nil && c.SerialNumber.Cmp(before.SerialNumber) != 0
	})

	// Deleted.
	if err := client.CoreV1().Secrets(testNS).Delete(context.Background(), DefaultSecretName, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, "recreated after a deletion", func() bool { return held(t, client, clk.Now(), name) != nil })

	// The CA signs with another intermediate of the same root.
	before = held(t, client, clk.Now(), name)
	next := testca.NewIntermediate(t, root, testca.P256)
	if err := authority.SetMaterial(next.Material()); err != nil {
		t.Fatal(err)
	}
	p.Trigger()
	testwait.Eventually(t, "reissued under the new signing certificate", func() bool {
		c := held(t, client, clk.Now(), name)
		return c != nil && c.CheckSignatureFrom(next.Cert) == nil
	})
}

// TestRunLeavesForeignSecret: a Secret of that name written by someone
// else (istio-csr, cert-manager) is never written over.
func TestRunLeavesForeignSecret(t *testing.T) {
	clk := testclock.NewFakeClock(time.Now())
	authority := newAuthority(t, clk, testca.NewRoot(t, testca.P256))
	foreign := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: DefaultSecretName, Namespace: testNS, Labels: map[string]string{"controller.cert-manager.io/fao": "true"}},
		Type:       corev1.SecretTypeTLS,
		Data:       map[string][]byte{CertKey: []byte("theirs")},
	}
	client := fakeCluster(allowAll, foreign)
	rec := &testobs.Results{}
	logs := &testlog.Buffer{}
	p, err := New(Config{Client: client, Issuer: authority, Namespace: testNS,
		Options: trust.Options{TrustDomain: testTD, Roots: authority.Roots, Observer: rec, Clock: clk, Logger: slog.New(slog.NewTextHandler(logs, nil))}})
	if err != nil {
		t.Fatal(err)
	}
	testwait.Run(t, p.Run)
	testwait.Eventually(t, "the foreign Secret skipped", func() bool { return rec.Count(trust.ResultSkipped) > 0 })
	for _, a := range client.Actions() {
		if a.GetResource().Resource == "secrets" && a.GetVerb() != "list" && a.GetVerb() != "watch" {
			t.Errorf("%s on a Secret that is not ours", a.GetVerb())
		}
	}
	if !strings.Contains(logs.String(), "is not ours") {
		t.Errorf("the refusal is not logged:\n%s", logs.String())
	}
}

// TestRunChecksPermissions: without the Secret permissions Run says which
// are missing and writes nothing.
func TestRunChecksPermissions(t *testing.T) {
	clk := testclock.NewFakeClock(time.Now())
	authority := newAuthority(t, clk, testca.NewRoot(t, testca.P256))
	client := fakeCluster(func(a *authzv1.ResourceAttributes) bool { return a.Verb != "update" })
	p, err := New(Config{Client: client, Issuer: authority, Namespace: testNS,
		Options: trust.Options{TrustDomain: testTD, Roots: authority.Roots, Clock: clk}})
	if err != nil {
		t.Fatal(err)
	}
	err = p.Run(context.Background())
	if !errors.Is(err, rbac.ErrPermissionDenied) || !strings.Contains(err.Error(), `verb update on secrets, resourceName "istiod-tls"`) {
		t.Fatalf("Run = %v, want the missing update permission named", err)
	}
}

func TestNew(t *testing.T) {
	clk := testclock.NewFakeClock(time.Now())
	authority := newAuthority(t, clk, testca.NewRoot(t, testca.P256))
	valid := func() Config {
		return Config{Client: fake.NewClientset(), Issuer: authority, Namespace: testNS,
			Options: trust.Options{TrustDomain: testTD, Roots: authority.Roots}}
	}
	for _, tc := range []struct {
		name   string
		change func(*Config)
		want   string // "" for accepted
	}{
		{"defaults", func(*Config) {}, ""},
		{"names and TTL", func(c *Config) {
			c.DNSNames, c.TTL = []string{"istiod.istio-system.svc", "istiod-canary.istio-system.svc"}, time.Hour
		}, ""},
		{"no client", func(c *Config) { c.Client = nil }, "missing Client"},
		{"no issuer", func(c *Config) { c.Issuer = nil }, "missing Issuer"},
		{"no namespace", func(c *Config) { c.Namespace = "" }, "namespace"},
		{"bad namespace", func(c *Config) { c.Namespace = "Istio System" }, "namespace"},
		{"bad Secret name", func(c *Config) { c.SecretName = "istiod_tls" }, "Secret name"},
		{"bad DNS name", func(c *Config) { c.DNSNames = []string{"istiod..svc"} }, "DNS name"},
		{"negative TTL", func(c *Config) { c.TTL = -time.Second }, "TTL"},
		{"no roots", func(c *Config) { c.Roots = nil }, "missing Roots"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := valid()
			tc.change(&cfg)
			_, err := New(cfg)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("New = %v, want accepted", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("New = %v, want an error about %q", err, tc.want)
			}
		})
	}
}
