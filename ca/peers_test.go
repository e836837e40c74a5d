package ca_test

import (
	"slices"
	"testing"
	"time"

	"github.com/workload-ca/workload-ca/internal/testca"
)

// TestPeerRootsInTheAnswer: peer roots are appended to every answer's
// root element, after the CA's own, survive a change of material, and are
// not among the CA's Roots.
func TestPeerRootsInTheAnswer(t *testing.T) {
	now := testNow()
	root := testca.NewRoot(t, testca.P256)
	peer := testca.NewRoot(t, testca.P256)
	a := newAuthority(t, root.Material(), now)
	last := func() []string {
		t.Helper()
		chain := signZtunnel(t, a, time.Hour).Chain
		var subjects []string
		for _, c := range parseChain(t, chain)[len(chain)-1] {
			subjects = append(subjects, string(c.Raw))
		}
		return subjects
	}
	own, peerRaw := string(root.Cert.Raw), string(peer.Cert.Raw)
	if got := last(); !slices.Equal(got, []string{own}) {
		t.Fatalf("before: %d roots in the answer", len(got))
	}
	a.SetPeerRoots(peer.Material().Roots)
	if got := last(); !slices.Equal(got, []string{own, peerRaw}) {
		t.Fatalf("with a peer: %d roots in the answer, want the own root then the peer's", len(got))
	}
	if r := a.Roots(); len(r) != 1 || string(r[0].Raw) != own {
		t.Errorf("Roots() = %d certificates, want only the CA's own", len(r))
	}
	next := testca.NewRoot(t, testca.P256)
	if err := a.SetMaterial(next.Material()); err != nil {
		t.Fatal(err)
	}
	if got := last(); !slices.Equal(got, []string{string(next.Cert.Raw), peerRaw}) {
		t.Errorf("after new material: the peer root is not kept")
	}
	a.SetPeerRoots(nil)
	if got := last(); len(got) != 1 {
		t.Errorf("peers removed: %d roots in the answer", len(got))
	}
	verifySVID(t, signZtunnel(t, a, time.Hour).Chain, now)
}
