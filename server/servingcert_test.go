package server_test

import (
	"bytes"
	"context"
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/workload-ca/workload-ca/ca"
	"github.com/workload-ca/workload-ca/internal/testca"
	"github.com/workload-ca/workload-ca/internal/testlog"
	"github.com/workload-ca/workload-ca/internal/testwait"
	"github.com/workload-ca/workload-ca/server"
)

// flakyIssuer fails while broken is set, and counts its calls.
type flakyIssuer struct {
	*ca.Authority
	mu     sync.Mutex
	broken bool
	calls  int
}

func (f *flakyIssuer) set(broken bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.broken = broken
}

func (f *flakyIssuer) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls
}

func (f *flakyIssuer) IssueServing(ctx context.Context, pub crypto.PublicKey, dns []string, ttl time.Duration) (*x509.Certificate, []*x509.Certificate, error) {
	f.mu.Lock()
	f.calls++
	broken := f.broken
	f.mu.Unlock()
	if broken {
		return nil, nil, errors.New("issuer down")
	}
	return f.Authority.IssueServing(ctx, pub, dns, ttl)
}

func TestServingCertRenewal(t *testing.T) {
	start := time.Now().Truncate(time.Second)
	clk := clocktesting.NewFakeClock(start)
	root := testca.NewRoot(t, testca.P256, testca.Validity(start.Add(-time.Hour), start.Add(365*24*time.Hour)))
	authority, err := ca.New(ca.Config{TrustDomain: td, Clock: clk}, root.Material())
	if err != nil {
		t.Fatal(err)
	}
	issuer := &flakyIssuer{Authority: authority}
	var logs testlog.Buffer
	sc, err := server.NewServingCert(context.Background(), server.ServingCertConfig{
		Issuer: issuer, DNSNames: []string{servingName}, TTL: 3 * time.Hour, RenewRetry: 5 * time.Second, Clock: clk,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	first := mustGet(t, sc)
	if got := first.Leaf.DNSNames; len(got) != 1 || got[0] != servingName {
		t.Fatalf("DNS names = %v", got)
	}
	if _, err := first.Leaf.Verify(x509.VerifyOptions{Roots: pool(root.Cert), DNSName: servingName, CurrentTime: start}); err != nil {
		t.Fatalf("serving certificate does not verify against our root: %v", err)
	}

	clk.Step(time.Hour)
	if got := mustGet(t, sc); got != first {
		t.Fatal("renewed before two thirds of its lifetime")
	}

	clk.Step(90 * time.Minute) // past 2/3 of 3h (+2m backdate)
	issuer.set(true)
	calls := issuer.count()
	if got := mustGet(t, sc); got != first {
		t.Fatal("a handshake waited for the renewal, or a failed renewal replaced the still-valid certificate")
	}
	// Its failure is logged once it has been recorded: the next try may
	// start from then on.
	testwait.Eventually(t, "the background renewal failed", func() bool {
		return strings.Contains(logs.String(), "serving certificate renewal failed")
	})
	for range 3 {
		if got := mustGet(t, sc); got != first {
			t.Fatal("a failed renewal must keep serving the still-valid certificate")
		}
	}
	if n := issuer.count() - calls; n != 1 {
		t.Fatalf("%d renewals tried by four handshakes within RenewRetry, want 1", n)
	}

	issuer.set(false)
	clk.Step(5 * time.Second)
	mustGet(t, sc) // starts the renewal
	testwait.Eventually(t, "the background renewal", func() bool { return sc.Current() != first })
	renewed := mustGet(t, sc)
	if renewed.Leaf.SerialNumber.Cmp(first.Leaf.SerialNumber) == 0 {
		t.Fatal("not renewed after two thirds of its lifetime")
	}
	if !renewed.Leaf.NotAfter.After(first.Leaf.NotAfter) {
		t.Fatalf("renewed NotAfter %v not after %v", renewed.Leaf.NotAfter, first.Leaf.NotAfter)
	}

	other := testca.NewIntermediate(t, root, testca.P256, testca.Validity(start.Add(-time.Hour), start.Add(300*24*time.Hour)))
	if err := authority.SetMaterial(other.Material()); err != nil {
		t.Fatal(err)
	}
	afterSwap := mustGet(t, sc)
	if afterSwap == renewed || !bytes.Equal(afterSwap.Certificate[1], other.Cert.Raw) {
		t.Fatal("not renewed when the CA started signing with another certificate")
	}

	clk.Step(4 * time.Hour) // the renewed certificate has expired too
	issuer.set(true)
	calls = issuer.count()
	for range 2 {
		if _, err := sc.GetCertificate(nil); err == nil {
			t.Fatal("an expired certificate must not be served when renewal fails")
		}
		clk.Step(5 * time.Second)
	}
	if n := issuer.count() - calls; n != 2 {
		t.Fatalf("%d renewals tried by two handshakes RenewRetry apart, want 2", n)
	}
	issuer.set(false)
	if got := mustGet(t, sc); !got.Leaf.NotAfter.After(clk.Now()) {
		t.Fatal("not renewed once the issuer is back")
	}

	// Two spells of failures, the second one failing twice alike: each
	// spell logged once, with its error, and its end.
	out := logs.String()
	if n := strings.Count(out, "serving certificate renewal failed"); n != 2 || strings.Count(out, "issuer down") != 2 {
		t.Errorf("renewal failures logged %d times, want once per spell with the error:\n%s", n, out)
	}
	if n := strings.Count(out, "serving certificate renewed after failures"); n != 2 {
		t.Errorf("recoveries logged %d times, want 2:\n%s", n, out)
	}
}

func mustGet(t *testing.T, sc *server.ServingCert) *tls.Certificate {
	t.Helper()
	c, err := sc.GetCertificate(nil)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func pool(certs ...*x509.Certificate) *x509.CertPool {
	p := x509.NewCertPool()
	for _, c := range certs {
		p.AddCert(c)
	}
	return p
}

// A serving certificate cut at the end of the signing certificate is
// renewed ever less often as that end nears, not on every handshake.
func TestServingCertRenewalNearSigningEnd(t *testing.T) {
	start := time.Now().Truncate(time.Second)
	clk := clocktesting.NewFakeClock(start)
	root := testca.NewRoot(t, testca.P256, testca.Validity(start.Add(-time.Hour), start.Add(10*time.Hour)))
	authority, err := ca.New(ca.Config{TrustDomain: td, Clock: clk}, root.Material())
	if err != nil {
		t.Fatal(err)
	}
	issuer := &flakyIssuer{Authority: authority}
	sc, err := server.NewServingCert(context.Background(), server.ServingCertConfig{
		Issuer: issuer, DNSNames: []string{servingName}, TTL: 24 * time.Hour, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	clk.Step(7 * time.Hour) // past 2/3 of the 10 h it got
	for range 200 {
		mustGet(t, sc)
		time.Sleep(time.Millisecond) // a background renewal may finish
	}
	// Each renewal moves the next to two thirds of what is left: a few.
	if n := issuer.count(); n > 5 {
		t.Fatalf("%d renewals in 200 handshakes near the signing certificate's end, want a few", n)
	}
}
