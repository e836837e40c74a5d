package rotation_test

import (
	"context"
	"crypto/x509"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/workload-ca/workload-ca/ca"
	"github.com/workload-ca/workload-ca/ca/castate"
	"github.com/workload-ca/workload-ca/ca/keystore"
	"github.com/workload-ca/workload-ca/ca/rotation"
	"github.com/workload-ca/workload-ca/internal/testca"
)

// pluginRoot returns an operator's root CA valid from notBefore to
// notAfter.
func pluginRoot(t testing.TB, notBefore, notAfter time.Time) *testca.CA {
	t.Helper()
	return testca.NewRoot(t, testca.P256, testca.Validity(notBefore, notAfter))
}

// intermediateGenerator returns a Generate function minting intermediates
// of lifetime d from root, as the CA does with --ca-root-dir.
func intermediateGenerator(root *testca.CA, d time.Duration) func(context.Context, time.Time) (*ca.Material, error) {
	return func(_ context.Context, now time.Time) (*ca.Material, error) {
		return keystore.GenerateIntermediate(root.Material(), keystore.GenerateOptions{TrustDomain: testTD, Lifetime: d}, now)
	}
}

// inter returns an authority with a new intermediate of root valid from
// notBefore to notAfter, and status st dated at.
func inter(t testing.TB, root *testca.CA, notBefore, notAfter time.Time, st castate.Status, at time.Time) castate.Authority {
	t.Helper()
	c := testca.NewIntermediate(t, root, testca.P256, testca.Validity(notBefore, notAfter))
	a := dated(st, at)
	a.Cert, a.Key = c.Cert, c.Key
	return a
}

// dated is an authority without certificate, with status st dated at
// like root dates it.
func dated(st castate.Status, at time.Time) castate.Authority {
	a := castate.Authority{Status: st, PreparedAt: at}
	switch st {
	case castate.StatusActive:
		a.ActivatedAt = at
	case castate.StatusRetiring:
		a.ActivatedAt, a.RetiringSince = at, at
	}
	return a
}

func interState(as ...castate.Authority) castate.State {
	return castate.State{Kind: castate.KindIntermediates, Authorities: as}
}

// TestPlanIntermediates runs the default policy over intermediates: the
// same steps at the same fractions as roots, without PropagationDelay.
// The active intermediate A lives from t0 to t0+730d under a 10-year root.
func TestPlanIntermediates(t *testing.T) {
	p := rotation.DefaultPolicy()
	p.LeafMaxTTL = 90 * day // the arithmetic below is in 90-day leaves
	d := func(days float64) time.Time { return t0.Add(time.Duration(days * float64(day))) }
	pr := pluginRoot(t, d(-1), d(3650))
	a := inter(t, pr, t0, d(730), active, t0)
	next := func(n float64) castate.Authority { return inter(t, pr, d(n).Add(-time.Hour), d(n+730), prepared, d(n)) }
	tests := []planCase{
		{"steady: prepare at 1/2", interState(a), t0, rotation.StepPrepare, d(365)},
		{"prepared on time: activate at 5/6", interState(a, next(365)), d(365), rotation.StepActivate, d(730 * 5.0 / 6)},
		{"prepared late: activate at once, no propagation delay", interState(a, next(620)), d(620), rotation.StepActivate, d(620)},
		{"prepared after A's signing deadline: activate at once", interState(a, next(700)), d(700), rotation.StepActivate, d(700)},
		{"prepared, not yet valid: activate at its notBefore", interState(a, inter(t, pr, d(700), d(1430), prepared, d(699))), d(699),
			rotation.StepActivate, d(700)},
		{"active expired: activate at once", interState(a, next(729.9)), d(730.1), rotation.StepActivate, d(730.1)},
		{"prepared outlives no leaf: abandon it", interState(a, inter(t, pr, d(365), d(365+60), prepared, d(365))), d(366),
			rotation.StepRetireStart, d(366)},
		{"retiring: remove at retiringSince + LeafMaxTTL + margin",
			interState(inter(t, pr, d(-365), d(365), retiring, d(243)), inter(t, pr, t0, d(730), active, d(243))), d(243),
			rotation.StepRemove, d(243 + 90).Add(time.Hour)},
		// With no delay the successor is prepared at half-life rather
		// than a delay before the handover.
		{"181-day intermediate (cut by its root): prepare at half-life", interState(inter(t, pr, t0, d(181), active, t0)), t0,
			rotation.StepPrepare, d(90.5)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			step, at := rotation.Plan(tt.state, tt.now, p)
			if step != tt.step || !near(at, tt.at) {
				t.Errorf("Plan = %s at %v (day %.3f), want %s at %v", step, at, at.Sub(t0).Hours()/24, tt.step, tt.at)
			}
		})
	}
	// The same prepared-late state of roots waits for propagation.
	roots := state(root(t, t0, d(730), active, t0), root(t, d(620).Add(-time.Hour), d(1350), prepared, d(620)))
	if step, at := rotation.Plan(roots, d(620), p); step != rotation.StepActivate || !near(at, d(621)) {
		t.Errorf("roots prepared late: Plan = %s at day %.3f, want activate a day later", step, at.Sub(t0).Hours()/24)
	}
}

func TestApplyIntermediates(t *testing.T) {
	now := t0.Add(100 * day)
	pr := pluginRoot(t, t0.Add(-day), t0.Add(3650*day))
	bundle := []*x509.Certificate{pr.Cert}
	r, a, p := inter(t, pr, t0, t0.Add(730*day), retiring, t0), inter(t, pr, t0, t0.Add(730*day), active, t0), inter(t, pr, t0, t0.Add(730*day), prepared, t0)
	m, err := intermediateGenerator(pr, 730*day)(context.Background(), now)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		in   castate.State
		step rotation.Step
		want []castate.Status
	}{
		{"prepare appends", interState(r, a), rotation.StepPrepare, []castate.Status{retiring, active, prepared}},
		{"activate swaps in one write", interState(r, a, p), rotation.StepActivate, []castate.Status{retiring, retiring, active}},
		{"retire-start abandons the prepared", interState(a, p), rotation.StepRetireStart, []castate.Status{active, retiring}},
		{"remove drops the longest retiring", interState(r, a), rotation.StepRemove, []castate.Status{active}},
		{"activate without prepared: unchanged", interState(r, a), rotation.StepActivate, []castate.Status{retiring, active}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := rotation.Apply(tt.in, tt.step, now, m)
			if s := statuses(got); !slices.Equal(s, tt.want) || got.Kind != castate.KindIntermediates {
				t.Errorf("after %s: statuses %v, kind %q; want %v, intermediates", tt.step, s, got.Kind, tt.want)
			}
			if err := got.ValidateUnder(bundle); err != nil {
				t.Errorf("result is invalid under the plug-in root: %v", err)
			}
		})
	}
}

// interHarness is a harness whose store holds one intermediate of a
// 10-year plug-in root, active since t0, and whose Generate mints
// intermediates from that root.
func interHarness(t *testing.T) (*harness, *testca.CA) {
	p := rotation.DefaultPolicy()
	p.LeafMaxTTL = 90 * day // the arithmetic below is in 90-day leaves
	pr := pluginRoot(t, t0.Add(-day), t0.Add(3650*day))
	h := &harness{t: t, clk: testingclock.NewFakeClock(t0), policy: p, gen: intermediateGenerator(pr, p.CATTL)}
	first, err := h.gen(context.Background(), t0)
	if err != nil {
		t.Fatal(err)
	}
	h.store = newMemStore(t, interState(castate.Authority{Cert: first.Cert, Key: first.Signer, Status: active, PreparedAt: t0, ActivatedAt: t0}))
	return h, pr
}

// TestRotatorIntermediates runs a Rotator through two rotations of
// intermediates, the second one with the leader away through its window,
// and checks after every step that the state fits the plug-in root and
// that a leaf issued then verifies against it.
func TestRotatorIntermediates(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h, pr := interHarness(t)
		_, stop := h.start()
		check := func(what string) {
			t.Helper()
			checkIntermediates(t, h.store.state(), pr, h.clk.Now(), h.policy, what)
		}
		check("start")
		first := h.store.state().Active()

		h.expectStep(rotation.StepPrepare)
		check("first prepare")
		prepared := h.store.state().Authorities[1]
		activated := h.expectStep(rotation.StepActivate)
		check("first activate")
		if s := h.store.state(); !s.Active().Cert.Equal(prepared.Cert) || s.Authorities[0].Status != retiring {
			t.Fatal("after activate: want the prepared intermediate signing, the first retiring")
		}
		if got, want := activated, first.Cert.NotBefore.Add(time.Duration(float64(first.Cert.NotAfter.Sub(first.Cert.NotBefore))*h.policy.ActivateAt)); !near(got, want) {
			t.Errorf("activated at %v, want at 5/6 of the first intermediate's life, %v", got, want)
		}
		removed := h.expectStep(rotation.StepRemove)
		check("first remove")
		if got, want := removed.Sub(activated), h.policy.LeafMaxTTL+h.policy.SkewMargin; got != want {
			t.Errorf("retiring intermediate removed %v after activation, want %v", got, want)
		}
		if s := h.store.state(); len(s.Authorities) != 1 || s.Authorities[0].Cert.Equal(first.Cert) {
			t.Fatal("after remove: want the second intermediate alone")
		}

		// The leader is away through the second prepare and past the
		// second activation time: back, it prepares and activates at
		// once, with no propagation delay in between.
		stop()
		_, prepareAt := h.due()
		second := h.store.state().Active()
		activateAt := second.Cert.NotBefore.Add(time.Duration(float64(second.Cert.NotAfter.Sub(second.Cert.NotBefore)) * h.policy.ActivateAt))
		if !prepareAt.Before(activateAt) {
			t.Fatalf("prepare due %v, not before the activation time %v", prepareAt, activateAt)
		}
		h.advanceTo(activateAt.Add(time.Hour))
		check("leader away")
		writes := h.store.writeCount()
		obs, stop := h.start()
		defer stop()
		if got := h.store.writeCount() - writes; got != 2 || obs.steps() != "prepare,activate" {
			t.Fatalf("back after the activation time: %d writes, steps %q; want prepare and activate at once", got, obs.steps())
		}
		check("second activate")
		if s := h.store.state(); s.Active().Cert.Equal(second.Cert) || s.Active().ActivatedAt.Sub(s.Active().PreparedAt) != 0 {
			t.Fatal("want a new intermediate, activated the moment it was prepared")
		}
		h.expectStep(rotation.StepRemove)
		check("second remove")
		if s := h.store.state(); len(s.Authorities) != 1 || s.Kind != castate.KindIntermediates {
			t.Fatalf("after two rotations: %d authorities of kind %q, want one intermediate", len(s.Authorities), s.Kind)
		}
		h.expectStep(rotation.StepPrepare) // and so on
		check("third prepare")
	})
}

// TestRotatorRefusesIntermediateCutByRoot: a root expiring in less than
// a leaf's lifetime cannot issue the next intermediate; nothing is
// written and the active one keeps signing.
func TestRotatorRefusesIntermediateCutByRoot(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h, _ := interHarness(t)
		_, at := h.due()
		dying := pluginRoot(t, t0.Add(-day), at.Add(h.policy.LeafMaxTTL-day))
		h.gen = intermediateGenerator(dying, h.policy.CATTL)
		_, stop := h.start()
		defer stop()
		h.advanceTo(at)
		h.advanceTo(at.Add(rotation.MinRetryDelay))
		if h.store.writeCount() != 0 {
			t.Fatal("prepared an intermediate that cannot outlive a leaf")
		}
	})
}

// TestRotatorAcceptsIntermediateWithoutPropagationRoom: an intermediate
// that outlives a leaf but not PropagationDelay plus a leaf is fine, as
// it can sign at once; a root that short is refused.
func TestRotatorAcceptsIntermediateWithoutPropagationRoom(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h, pr := interHarness(t)
		_, at := h.due()
		life := h.policy.LeafMaxTTL + h.policy.PropagationDelay/2
		h.gen = func(_ context.Context, now time.Time) (*ca.Material, error) {
			return keystore.GenerateIntermediate(pr.Material(), keystore.GenerateOptions{TrustDomain: testTD, Lifetime: life}, now)
		}
		_, stop := h.start()
		defer stop()
		h.advanceTo(at)
		if h.store.writeCount() != 1 || h.store.state().Phase() != castate.PhasePrepared {
			t.Fatal("refused an intermediate that can sign a full leaf at once")
		}
	})
}

// checkIntermediates checks a state of intermediates at now: valid under
// the plug-in root, the active intermediate issued by it and valid, and a
// leaf issued from the state's material verifying against the root with
// the chain the CA returns.
func checkIntermediates(t *testing.T, s castate.State, pr *testca.CA, now time.Time, p rotation.Policy, what string) {
	t.Helper()
	bundle := []*x509.Certificate{pr.Cert}
	m, err := s.MaterialUnder(bundle)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	c := m.Cert
	if err := c.CheckSignatureFrom(pr.Cert); err != nil || now.Before(c.NotBefore) || now.After(c.NotAfter) {
		t.Fatalf("%s: active intermediate (valid %v to %v) at %v: issued by the plug-in root: %v", what, c.NotBefore, c.NotAfter, now, err)
	}
	if c.NotAfter.Before(now.Add(p.LeafMaxTTL)) {
		t.Errorf("%s: the active intermediate cannot outlive a leaf issued now", what)
	}
	a, err := ca.New(ca.Config{TrustDomain: testTD, Clock: testingclock.NewFakePassiveClock(now)}, m)
	if err != nil {
		t.Fatalf("%s: ca.New: %v", what, err)
	}
	id := spiffeid.RequireFromPath(testTD, "/ns/a/sa/b")
	csrPEM, _ := testca.ZtunnelCSR(t, id)
	csr, err := ca.ParseCSR(csrPEM)
	if err != nil {
		t.Fatal(err)
	}
	issued, err := a.Sign(context.Background(), ca.Request{CSR: csr, ID: id})
	if err != nil {
		t.Fatalf("%s: Sign: %v", what, err)
	}
	if len(issued.Chain) != 3 {
		t.Fatalf("%s: chain of %d elements, want [leaf, intermediate, roots]", what, len(issued.Chain))
	}
	opts := x509.VerifyOptions{Roots: x509.NewCertPool(), Intermediates: x509.NewCertPool(), CurrentTime: now}
	opts.Roots.AppendCertsFromPEM([]byte(issued.Chain[2]))
	opts.Intermediates.AppendCertsFromPEM([]byte(issued.Chain[1]))
	if _, err := issued.Cert.Verify(opts); err != nil {
		t.Errorf("%s: leaf does not verify against the plug-in root: %v", what, err)
	}
}
