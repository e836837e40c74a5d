package e2e_test

import (
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/workload-ca/workload-ca/ca/castate"
	"github.com/workload-ca/workload-ca/trust/clustertrustbundle"
)

// TestLifecycleRotationCanary rotates a root with a preview stage: the new
// root is first published only in the preview ClusterTrustBundle
// (k8s.spiffe.io/canarying: preview), then in the live one, and it signs
// no sooner than the propagation delay after it went live.
func TestLifecycleRotationCanary(t *testing.T) {
	t.Parallel()
	const preview = 3 * time.Second
	f := newLCFixture(t, "canary")
	began := time.Now()
	// A 60s root 33s old: prepare is due at once, activation at +17s.
	oldRoot := f.seed(t, began.Add(-33*time.Second), began.Add(27*time.Second))
	f.startN(t, 1, append(slices.Clone(fastRotation), "--rotation-preview", preview.String())...)

	// The stages of the bundles holding the new root, polled until it
	// signs.
	var sawPreviewOnly, sawLive time.Time
	err := pollUntil(t, 40*time.Second, func() (bool, error) {
		list, err := f.s.cp.Client().CertificatesV1().ClusterTrustBundles().List(t.Context(), metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		st, err := f.state(t.Context())
		if err != nil {
			return false, err
		}
		i := slices.IndexFunc(st.Authorities, func(a castate.Authority) bool { return !a.Cert.Equal(oldRoot) })
		if i < 0 {
			return false, nil // not prepared yet
		}
		next := st.Authorities[i].Cert
		inPreview, inLive := false, false
		for _, b := range list.Items {
			if b.Spec.SignerName != f.signer || b.Labels[clustertrustbundle.LabelTrustDomain] != "cluster.local" {
				continue
			}
			certs, _ := pemCerts([]byte(b.Spec.TrustBundle))
			if !slices.ContainsFunc(certs, next.Equal) {
				continue
			}
			switch b.Labels[clustertrustbundle.LabelSPIFFECanarying] {
			case clustertrustbundle.CanaryingPreview:
				inPreview = true
			case clustertrustbundle.CanaryingLive:
				inLive = true
			}
		}
		now := time.Now()
		if inPreview && !inLive && sawPreviewOnly.IsZero() && sawLive.IsZero() {
			sawPreviewOnly = now
		}
		if inLive && sawLive.IsZero() {
			sawLive = now
		}
		return !st.Active().Cert.Equal(oldRoot), nil
	})
	if err != nil {
		t.Fatalf("the new root never signs: %v", err)
	}
	st, err := f.state(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	act := st.Active()
	t.Logf("prepared %+.1fs, preview only seen %+.1fs, live seen %+.1fs, activated %+.1fs",
		act.PreparedAt.Sub(began).Seconds(), sawPreviewOnly.Sub(began).Seconds(), sawLive.Sub(began).Seconds(), act.ActivatedAt.Sub(began).Seconds())
	switch {
	case sawPreviewOnly.IsZero():
		t.Error("the new root was never in the preview bundle alone")
	case sawLive.IsZero():
		t.Error("the new root never went live before it signed")
	case !sawPreviewOnly.Before(sawLive):
		t.Error("the canary label did not flip from preview to live")
	}
	if d := act.ActivatedAt.Sub(act.PreparedAt); d < preview+fastPropagation {
		t.Errorf("activated %v after it was prepared, want at least preview %v + propagation %v", d, preview, fastPropagation)
	}
	if !sawLive.IsZero() && act.ActivatedAt.Sub(sawLive) < fastPropagation-500*time.Millisecond {
		t.Errorf("live %v before it signed, want about the propagation delay %v", act.ActivatedAt.Sub(sawLive), fastPropagation)
	}
}
