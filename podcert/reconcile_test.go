package podcert

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	certv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/workload-ca/workload-ca/authz"
	"github.com/workload-ca/workload-ca/authz/authztest"
	"github.com/workload-ca/workload-ca/ca"
	"github.com/workload-ca/workload-ca/internal/testca"
	"github.com/workload-ca/workload-ca/issuance"
)

// signerFunc adapts a function to Signer, with a signing certificate valid
// for years.
type signerFunc func(context.Context, ca.Request) (*ca.Issued, error)

func (f signerFunc) Sign(ctx context.Context, r ca.Request) (*ca.Issued, error) { return f(ctx, r) }

func (signerFunc) SigningCert() *x509.Certificate {
	return &x509.Certificate{NotAfter: time.Date(2100, 1, 1, 0, 0, 0, 0, time.UTC)}
}

// shortSigner is a signerFunc with the signing certificate given.
type shortSigner struct {
	signerFunc
	cert *x509.Certificate
}

func (s shortSigner) SigningCert() *x509.Certificate { return s.cert }

// errAny stands for any error in a test table.
var errAny = errors.New("any error")

// accountMap is Accounts over namespace/name -> uid.
type accountMap map[string]string

func (a accountMap) ServiceAccount(ns, name string) (string, time.Time, bool) {
	uid, ok := a[ns+"/"+name]
	return uid, time.Time{}, ok
}

func withSpec(p *certv1.PodCertificateRequest, edit func(*certv1.PodCertificateRequestSpec)) *certv1.PodCertificateRequest {
	edit(&p.Spec)
	return p
}

type countingObserver map[string]int

func (o countingObserver) PodCertificate(result string) { o[result]++ }

// TestReconcile drives one reconcile per case against the fake clientset,
// with the informer's store filled by hand.
func TestReconcile(t *testing.T) {
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	root := testca.NewRoot(t, testca.P256, testca.Validity(now.Add(-time.Hour), now.Add(24*time.Hour)))
	short := testca.NewRoot(t, testca.P256, testca.Validity(now.Add(-time.Hour), now.Add(30*time.Minute)))
	authority := func(m *testca.CA, defaultTTL time.Duration) Signer {
		a, err := ca.New(ca.Config{TrustDomain: testTD, Clock: testingclock.NewFakePassiveClock(now), DefaultTTL: defaultTTL}, m.Material())
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	boom := errors.New("CA not ready")
	pods := &authztest.Pods{}
	pods.Add("apps", "web-pod", authz.PodInfo{UID: "uid-pod-web", NodeName: "node-a", ServiceAccount: "web-sa"})
	pods.Add("apps", "old-pod", authz.PodInfo{UID: "uid-pod-old", NodeName: "node-a", ServiceAccount: "web-sa", Deletion: now.Add(-61 * time.Second)})
	accounts := accountMap{"apps/web-sa": "uid-sa-web-sa", "apps/admin": "uid-sa-admin"}
	issued := newPCR(t, "apps", "done", "web-sa", testSigner, key, 3600)
	issued.Status.Conditions = []metav1.Condition{{Type: certv1.PodCertificateRequestConditionTypeIssued, Status: metav1.ConditionTrue}}

	tests := []struct {
		name       string
		pcr        *certv1.PodCertificateRequest
		signer     Signer
		wantErr    error  // errAny: any error
		wantCond   string // "" : no status written
		wantReason string
		wantAudit  string
		wantValid  time.Duration // of an issued certificate, if set
		wantFailed int           // failed attempts counted
		pods       Pods
		accounts   Accounts
	}{
		{name: "issued", pcr: newPCR(t, "apps", "web", "web-sa", testSigner, key, 3600), signer: authority(root, 0),
			wantCond: certv1.PodCertificateRequestConditionTypeIssued, wantReason: "Issued", wantAudit: "certificate issued"},
		{name: "lasts maxExpirationSeconds even when the CA's default TTL is shorter than the hour Kubernetes requires",
			pcr: newPCR(t, "apps", "web", "web-sa", testSigner, key, 7200), signer: authority(root, 30*time.Minute),
			wantCond: certv1.PodCertificateRequestConditionTypeIssued, wantReason: "Issued", wantAudit: "certificate issued", wantValid: 2 * time.Hour},
		{name: "the CA's certificate expires within the hour: left pending and retried, since Failed is final",
			pcr: newPCR(t, "apps", "web", "web-sa", testSigner, key, 3600), signer: authority(short, 0),
			wantErr: errAny, wantFailed: 1},
		{name: "the same, not signed in vain", pcr: newPCR(t, "apps", "web", "web-sa", testSigner, key, 3600),
			signer: shortSigner{signerFunc(func(context.Context, ca.Request) (*ca.Issued, error) {
				t.Error("signed although the signing certificate ends within the hour")
				return nil, boom
			}), short.Cert},
			wantErr: errAny, wantFailed: 1},
		{name: "the CA fails: retried, nothing written", pcr: newPCR(t, "apps", "web", "web-sa", testSigner, key, 3600),
			signer: signerFunc(func(context.Context, ca.Request) (*ca.Issued, error) { return nil, boom }), wantErr: boom, wantFailed: 1},
		{name: "denied before signing", pcr: func() *certv1.PodCertificateRequest {
			p := newPCR(t, "apps", "web", "web-sa", testSigner, key, 3600)
			p.Spec.UnverifiedUserAnnotations = map[string]string{"example.com/x": "y"}
			return p
		}(), signer: signerFunc(func(context.Context, ca.Request) (*ca.Issued, error) {
			t.Error("signed a denied request")
			return nil, boom
		}),
			wantCond: certv1.PodCertificateRequestConditionTypeDenied, wantReason: ReasonInvalidUserAnnotations, wantAudit: "certificate request refused"},
		{name: "already decided: left alone", pcr: issued, signer: authority(root, 0)},
		// What a request names is what the cluster runs, or it is denied
		// (whoever may create requests may write any of these fields).
		{name: "pod, node and service account as the indexes show: issued", pcr: newPCR(t, "apps", "web", "web-sa", testSigner, key, 3600),
			signer: authority(root, 0), pods: pods, accounts: accounts,
			wantCond: certv1.PodCertificateRequestConditionTypeIssued, wantReason: "Issued", wantAudit: "certificate issued"},
		{name: "a service account the pod does not run as: denied", pcr: withSpec(newPCR(t, "apps", "web", "web-sa", testSigner, key, 3600),
			func(s *certv1.PodCertificateRequestSpec) {
				s.ServiceAccountName, s.ServiceAccountUID = "admin", "uid-sa-admin"
			}),
			signer: authority(root, 0), pods: pods, accounts: accounts,
			wantCond: certv1.PodCertificateRequestConditionTypeDenied, wantReason: ReasonPodMismatch, wantAudit: "certificate request refused"},
		{name: "no such pod, while the signing certificate ends within the hour: denied, not retried", pcr: withSpec(newPCR(t, "apps", "web", "web-sa", testSigner, key, 3600),
			func(s *certv1.PodCertificateRequestSpec) { s.PodUID = "uid-invented" }),
			signer: authority(short, 0), pods: pods, accounts: accounts,
			wantCond: certv1.PodCertificateRequestConditionTypeDenied, wantReason: ReasonPodMismatch, wantAudit: "certificate request refused"},
		{name: "no such pod: denied", pcr: withSpec(newPCR(t, "apps", "web", "web-sa", testSigner, key, 3600),
			func(s *certv1.PodCertificateRequestSpec) { s.PodUID = "uid-invented" }),
			signer: authority(root, 0), pods: pods, accounts: accounts,
			wantCond: certv1.PodCertificateRequestConditionTypeDenied, wantReason: ReasonPodMismatch, wantAudit: "certificate request refused"},
		{name: "the pod runs on another node: denied", pcr: withSpec(newPCR(t, "apps", "web", "web-sa", testSigner, key, 3600),
			func(s *certv1.PodCertificateRequestSpec) { s.NodeName = "node-b" }),
			signer: authority(root, 0), pods: pods, accounts: accounts,
			wantCond: certv1.PodCertificateRequestConditionTypeDenied, wantReason: ReasonPodMismatch, wantAudit: "certificate request refused"},
		{name: "the pod terminating for over a minute: denied", pcr: newPCR(t, "apps", "old", "web-sa", testSigner, key, 3600),
			signer: authority(root, 0), pods: pods, accounts: accounts,
			wantCond: certv1.PodCertificateRequestConditionTypeDenied, wantReason: ReasonPodMismatch, wantAudit: "certificate request refused"},
		{name: "the service account created again (another uid): denied", pcr: withSpec(newPCR(t, "apps", "web", "web-sa", testSigner, key, 3600),
			func(s *certv1.PodCertificateRequestSpec) { s.ServiceAccountUID = "uid-sa-before" }),
			signer: authority(root, 0), pods: pods, accounts: accounts,
			wantCond: certv1.PodCertificateRequestConditionTypeDenied, wantReason: ReasonPodMismatch, wantAudit: "certificate request refused"},
		{name: "the pod index cannot tell: retried, nothing written", pcr: newPCR(t, "apps", "web", "web-sa", testSigner, key, 3600),
			signer: authority(root, 0), pods: &authztest.Pods{Err: authz.ErrUnavailable}, accounts: accounts,
			wantErr: authz.ErrUnavailable, wantFailed: 1},
		{name: "the service account not indexed yet: retried, nothing written", pcr: newPCR(t, "apps", "web", "web-sa", testSigner, key, 3600),
			signer: authority(root, 0), pods: pods, accounts: accountMap{},
			wantErr: errAny, wantFailed: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			client := fake.NewClientset(tt.pcr.DeepCopy())
			var audit bytes.Buffer
			obs := countingObserver{}
			clk := testingclock.NewFakeClock(now)
			c, err := New(Config{Client: client, SignerName: testSigner, TrustDomain: testTD, Signer: tt.signer,
				Pipeline: newPipeline(t, tt.signer, &audit, clk), Observer: obs, Clock: clk,
				Pods: tt.pods, Accounts: tt.accounts})
			if err != nil {
				t.Fatal(err)
			}
			store := cache.NewStore(cache.MetaNamespaceKeyFunc)
			if err := store.Add(tt.pcr.DeepCopy()); err != nil {
				t.Fatal(err)
			}
			client.ClearActions()
			err = c.reconcile(context.Background(), store, tt.pcr.Namespace+"/"+tt.pcr.Name)
			if errors.Is(tt.wantErr, errAny) && err == nil || !errors.Is(tt.wantErr, errAny) && !errors.Is(err, tt.wantErr) {
				t.Fatalf("reconcile: %v, want %v", err, tt.wantErr)
			}
			if obs[ResultFailed] != tt.wantFailed {
				t.Errorf("counted %d failed attempts, want %d", obs[ResultFailed], tt.wantFailed)
			}
			got, err := client.CertificatesV1().PodCertificateRequests(tt.pcr.Namespace).Get(context.Background(), tt.pcr.Name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if tt.wantCond == "" {
				if n := len(client.Actions()) - 1; n != 0 { // the Get above
					t.Errorf("%d writes, want none", n)
				}
				// A retried attempt may leave a record of its failure
				// (decision internal or unavailable), never a decision.
				for _, decided := range []string{`"decision":"issued"`, `"decision":"denied"`, `"decision":"invalid"`} {
					if strings.Contains(audit.String(), decided) {
						t.Errorf("audited %q; want no decision", audit.String())
					}
				}
				if obs[ResultIssued]+obs[ResultDenied] != 0 {
					t.Errorf("counted %v; want no decision", obs)
				}
				return
			}
			if n := len(got.Status.Conditions); n != 1 {
				t.Fatalf("%d conditions, want 1", n)
			}
			if c := got.Status.Conditions[0]; c.Type != tt.wantCond || c.Reason != tt.wantReason || c.Status != metav1.ConditionTrue || !c.LastTransitionTime.Time.Equal(now) {
				t.Errorf("condition %+v, want %s/%s at %v", c, tt.wantCond, tt.wantReason, now)
			}
			if (tt.wantCond == certv1.PodCertificateRequestConditionTypeIssued) != (got.Status.CertificateChain != "") {
				t.Errorf("certificate chain %q for condition %s", got.Status.CertificateChain, tt.wantCond)
			}
			if !strings.Contains(audit.String(), tt.wantAudit) || strings.Count(audit.String(), "\n") != 1 {
				t.Errorf("audit %q, want one record %q", audit.String(), tt.wantAudit)
			}
			if sum := obs[ResultIssued] + obs[ResultDenied]; sum != 1 {
				t.Errorf("counted %v, want one decision", obs)
			}
			if tt.wantValid > 0 {
				if v := got.Status.NotAfter.Sub(got.Status.NotBefore.Time); v != tt.wantValid {
					t.Errorf("valid for %v, want %v", v, tt.wantValid)
				}
			}
		})
	}
}

// failingWriter fails every write while failing is set.
type failingWriter struct{ failing bool }

func (w *failingWriter) Write(p []byte) (int, error) {
	if w.failing {
		return 0, errors.New("write audit.log: no space left on device")
	}
	return len(p), nil
}

// With the audit log unwritable, a pod certificate is not handed out: the
// request stays pending (no status written), the attempt counts as
// failed and is retried; once the log can be written, it is issued.
func TestReconcileAuditUnwritable(t *testing.T) {
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	root := testca.NewRoot(t, testca.P256, testca.Validity(now.Add(-time.Hour), now.Add(24*time.Hour)))
	signer, err := ca.New(ca.Config{TrustDomain: testTD, Clock: testingclock.NewFakePassiveClock(now)}, root.Material())
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	pcr := newPCR(t, "apps", "web", "web-sa", testSigner, key, 3600)
	client := fake.NewClientset(pcr.DeepCopy())
	disk := &failingWriter{failing: true}
	obs := countingObserver{}
	clk := testingclock.NewFakeClock(now)
	c, err := New(Config{Client: client, SignerName: testSigner, TrustDomain: testTD, Signer: signer,
		Pipeline: newPipeline(t, signer, disk, clk), Observer: obs, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	store := cache.NewStore(cache.MetaNamespaceKeyFunc)
	if err := store.Add(pcr.DeepCopy()); err != nil {
		t.Fatal(err)
	}
	key0 := pcr.Namespace + "/" + pcr.Name
	client.ClearActions()
	if err := c.reconcile(context.Background(), store, key0); !errors.Is(err, issuance.ErrAuditUnwritable) {
		t.Fatalf("reconcile with the audit log full: %v, want %v", err, issuance.ErrAuditUnwritable)
	}
	if n := len(client.Actions()); n != 0 {
		t.Errorf("%d writes with the audit log full, want none", n)
	}
	if obs[ResultFailed] != 1 || obs[ResultIssued] != 0 {
		t.Errorf("counted %v, want one failed attempt and nothing issued", obs)
	}
	disk.failing = false
	if err := c.reconcile(context.Background(), store, key0); err != nil {
		t.Fatalf("reconcile once the log can be written: %v", err)
	}
	got, err := client.CertificatesV1().PodCertificateRequests("apps").Get(context.Background(), "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Status.CertificateChain == "" || obs[ResultIssued] != 1 {
		t.Errorf("not issued once the log could be written: chain %q, counted %v", got.Status.CertificateChain, obs)
	}
}

// newPipeline is the pipeline a test's controller hands its requests to,
// its records written to audit.
func newPipeline(t testing.TB, signer issuance.Signer, audit io.Writer, clk clock.PassiveClock) *issuance.Pipeline {
	t.Helper()
	p, err := issuance.New(issuance.Config{Signer: signer, Audit: slog.New(slog.NewJSONHandler(audit, nil)), Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	return p
}
