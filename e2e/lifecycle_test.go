package e2e_test

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	certv1 "k8s.io/api/certificates/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/workload-ca/workload-ca/ca/castate"
	"github.com/workload-ca/workload-ca/caclient"
	"github.com/workload-ca/workload-ca/e2e/cahost"
	"github.com/workload-ca/workload-ca/internal/testca"
	"github.com/workload-ca/workload-ca/trust/clustertrustbundle"
)

// Trust distribution and CA lifecycle, against the real apiserver with
// the real binary: replicas sharing one --ca-secret, the ClusterTrustBundles
// their leader publishes, and a plug-in intermediate replaced on disk. The
// rotations are in rotation_test.go.

// TestLifecycleTwoReplicasOneRoot starts two replicas on one --ca-secret at
// the same moment: both find no Secret, both generate a root, one create
// wins. They must end with exactly one root, and both sign with it.
func TestLifecycleTwoReplicasOneRoot(t *testing.T) {
	f := newLCFixture(t, "pair")
	cas := f.startN(t, 2)

	st := f.mustState(t)
	if len(st.Authorities) != 1 || st.Authorities[0].Status != castate.StatusActive {
		t.Fatalf("the Secret holds %d authorities (%v), want one active", len(st.Authorities), st.Phase())
	}
	root := st.Active().Cert
	sec, err := f.secret(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if got, err := pemCerts(sec.Data[castate.KeyRootCert]); err != nil || len(got) != 1 || !got[0].Equal(root) {
		t.Errorf("%s holds %s (%v), want the one authority's root", castate.KeyRootCert, subjects(got), err)
	}

	created := 0
	for i, ca := range cas {
		created += len(logLines(ca, "created the CA Secret with a new root"))
		res := requestFrom(t, ca, f.s.ztunnelA, id("demo", "web"))
		if err := verifiesWith(res.Leaf, res.Chain, []*x509.Certificate{root}, time.Now()); err != nil {
			t.Errorf("replica %d: the leaf does not chain to the Secret's root: %v", i, err)
		}
		if len(res.Roots) != 1 || !res.Roots[0].Equal(root) {
			t.Errorf("replica %d: the response's root bundle is %s, want the Secret's root only", i, subjects(res.Roots))
		}
	}
	if created != 1 {
		t.Errorf("%d replicas logged that they created the Secret, want exactly 1", created)
	}

	// One leader, and the Lease names it.
	leader := theLeader(t, cas)
	holder, err := f.holder(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if ids := leaderIdentities(cas[leader]); !slices.Contains(ids, holder) {
		t.Errorf("Lease holder %q is not the replica reporting %s 1 (it led as %v)", holder, mLeader, ids)
	}
	if ids := leaderIdentities(cas[1-leader]); len(ids) != 0 {
		t.Errorf("the other replica led too, as %v", ids)
	}
}

// TestLifecycleTrustBundles proves the binary's wiring of ca/trustbundle
// (whose own tests go deep): the leader publishes the Secret's root under
// the content-hash name of our signer, with our labels, and in
// Istio-compatible mode as istio.io:istiod-ca:root-cert too; a deleted
// bundle is re-created and an edited one repaired.
func TestLifecycleTrustBundles(t *testing.T) {
	f := newLCFixture(t, "bundle")
	f.start(t, "--istio-compatible")
	root := f.mustState(t).Active().Cert
	content := string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: root.Raw}))
	sum := sha256.Sum256([]byte(content))
	name := strings.ReplaceAll(f.signer, "/", ":") + ":" + hex.EncodeToString(sum[:8])
	bundles := f.s.cp.Client().CertificatesV1().ClusterTrustBundles()

	want := map[string]string{name: f.signer, clustertrustbundle.IstioBundleName: clustertrustbundle.IstioSignerName}
	uids := map[string]types.UID{}
	for n, signer := range want {
		uids[n] = waitBundle(t, f, n, signer, content).UID
	}
	list, err := bundles.List(t.Context(), metav1.ListOptions{FieldSelector: "spec.signerName=" + f.signer})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != 1 {
		t.Errorf("%d bundles of signer %s, want 1", len(list.Items), f.signer)
	}

	t.Run("a deleted bundle is re-created", func(t *testing.T) {
		for n, signer := range want {
			if err := bundles.Delete(t.Context(), n, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			if b := waitBundle(t, f, n, signer, content); b.UID == uids[n] {
				t.Errorf("%s: same UID after delete", n)
			}
		}
	})
	t.Run("an edited bundle is repaired", func(t *testing.T) {
		other := string(testca.NewRoot(t, testca.P256).CertPEM())
		for n, signer := range want {
			b, err := bundles.Get(t.Context(), n, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			b.Spec.TrustBundle = other
			if _, err := bundles.Update(t.Context(), b, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			waitBundle(t, f, n, signer, content)
		}
	})
}

// waitBundle waits until bundle name exists with signer, our labels and
// exactly content.
func waitBundle(t *testing.T, f *lcFixture, name, signer, content string) *certv1.ClusterTrustBundle {
	t.Helper()
	var b *certv1.ClusterTrustBundle
	var last string
	err := pollUntil(t, lcWait, func() (bool, error) {
		var err error
		b, err = f.s.cp.Client().CertificatesV1().ClusterTrustBundles().Get(t.Context(), name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			last = "not found"
		case err != nil:
			return false, err
		case b.Spec.SignerName != signer:
			last = "signer " + b.Spec.SignerName
		case b.Labels[clustertrustbundle.LabelManagedBy] != clustertrustbundle.ManagedBy || b.Labels[clustertrustbundle.LabelTrustDomain] != "cluster.local":
			last = fmt.Sprintf("labels %v", b.Labels)
		case b.Spec.TrustBundle != content:
			last = "other content"
		default:
			return true, nil
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("bundle %s: %v (last: %s)", name, err, last)
	}
	return b
}

// TestLifecyclePluginIntermediateReload runs the CA on a plug-in
// intermediate (Istio cacerts layout) in a directory updated the way the
// kubelet updates a Secret volume (a symlink swapped atomically). A new
// intermediate under the same root is picked up without a restart; a bad
// one (its key does not match) is refused and logged, and the previous
// intermediate keeps signing.
func TestLifecyclePluginIntermediateReload(t *testing.T) {
	f := newLCFixture(t, "plugin")
	root := testca.NewRoot(t, testca.P256)
	i1 := testca.NewIntermediate(t, root, testca.P256)
	i2 := testca.NewIntermediate(t, root, testca.P256)
	i3 := testca.NewIntermediate(t, root, testca.P256)

	work := filepath.Join(f.dir, "replica")
	vol := &volumeDir{dir: filepath.Join(work, "ca")} // cahost's --ca-dir
	vol.write(t, cacerts(t, i1.Cert, i1.Key, root))
	ca, err := f.startReplica(t.Context(), work, false, "--ca-dir-poll-interval", "200ms")
	if err != nil {
		t.Fatal(err)
	}
	f.stopAtCleanup(t, ca)
	pid := ca.Pid()

	issue := func() (*caclient.Result, error) {
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		return requestErr(ctx, ca, f.s.ztunnelA, id("demo", "web"))
	}
	signedBy := func(res *caclient.Result, want *testca.CA) error {
		if len(res.Chain) != 1 || !res.Chain[0].Equal(want.Cert) {
			return fmt.Errorf("chain %s, want %s", subjects(res.Chain), subjects([]*x509.Certificate{want.Cert}))
		}
		if err := res.Leaf.CheckSignatureFrom(want.Cert); err != nil {
			return err
		}
		return verifiesWith(res.Leaf, res.Chain, []*x509.Certificate{root.Cert}, time.Now())
	}
	res, err := issue()
	if err != nil {
		t.Fatal(err)
	}
	if err := signedBy(res, i1); err != nil {
		t.Fatalf("first intermediate: %v", err)
	}

	// A good replacement: every request succeeds, and within a few polls
	// the new intermediate signs.
	vol.write(t, cacerts(t, i2.Cert, i2.Key, root))
	swapped := time.Now()
	var last error
	err = pollUntil(t, 5*time.Second, func() (bool, error) {
		res, err := issue()
		if err != nil {
			return false, fmt.Errorf("request while the intermediate changes: %w", err)
		}
		last = signedBy(res, i2)
		return last == nil, nil
	})
	if err != nil {
		t.Fatalf("the second intermediate does not sign: %v (last: %v)", err, last)
	}
	t.Logf("the second intermediate signs %v after the swap", time.Since(swapped).Round(time.Millisecond))
	if n := len(waitLogLines(t, ca, "reloaded CA material")); n != 1 {
		t.Errorf("%d \"reloaded CA material\" log lines, want 1", n)
	}

	// A bad replacement: i3's certificate with i2's key.
	vol.write(t, cacerts(t, i3.Cert, i2.Key, root))
	refusal := waitLogLines(t, ca, "refused changed CA material")[0]
	if !strings.Contains(refusal, "does not match") {
		t.Errorf("the refusal does not name the mismatch: %s", refusal)
	}
	for range 5 {
		res, err := issue()
		if err != nil {
			t.Fatalf("request after the bad replacement: %v", err)
		}
		if err := signedBy(res, i2); err != nil {
			t.Fatalf("after the bad replacement: %v", err)
		}
	}
	if ca.Exited() || ca.Pid() != pid {
		t.Errorf("the CA restarted (pid %d, was %d; exited %v)", ca.Pid(), pid, ca.Exited())
	}
}

// cacerts returns Istio cacerts files for a CA certificate and key under
// root: the key need not match (to test refusals).
func cacerts(t *testing.T, cert *x509.Certificate, key any, root *testca.CA) map[string][]byte {
	t.Helper()
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw})
	return map[string][]byte{
		"ca-cert.pem":    certPEM,
		"ca-key.pem":     pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}),
		"root-cert.pem":  root.CertPEM(),
		"cert-chain.pem": append(append([]byte{}, certPEM...), root.CertPEM()...),
	}
}

// volumeDir writes files the way the kubelet updates a Secret volume:
// each version in a directory of its own, ..data a symlink to the current
// one (replaced by a rename, atomically), and each file a symlink through
// ..data, so that a reader never sees half an update.
type volumeDir struct {
	dir string
	n   int
}

func (v *volumeDir) write(t *testing.T, files map[string][]byte) {
	t.Helper()
	v.n++
	version := fmt.Sprintf("..v%d", v.n)
	if err := os.MkdirAll(filepath.Join(v.dir, version), 0o700); err != nil {
		t.Fatal(err)
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(v.dir, version, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	tmp := filepath.Join(v.dir, "..data_tmp")
	if err := os.Symlink(version, tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(v.dir, "..data")); err != nil {
		t.Fatal(err)
	}
	for name := range files {
		link := filepath.Join(v.dir, name)
		if _, err := os.Lstat(link); err == nil {
			continue
		}
		if err := os.Symlink(filepath.Join("..data", name), link); err != nil {
			t.Fatal(err)
		}
	}
}

// requestFrom asks ca for identity as the ztunnel of token (impersonating)
// over a new connection verified against the CA's roots, and fails t on
// error.
func requestFrom(t *testing.T, ca *cahost.CA, token, identity string) *caclient.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	res, err := requestErr(ctx, ca, token, identity)
	if err != nil {
		t.Fatalf("request %s from %s: %v", identity, ca.Addr(), err)
	}
	return res
}

func requestErr(ctx context.Context, ca *cahost.CA, token, identity string) (*caclient.Result, error) {
	cfg, err := ca.ClientConfig()
	if err != nil {
		return nil, err
	}
	client, err := caclient.Dial(cfg)
	if err != nil {
		return nil, err
	}
	defer client.Close()
	sid, err := spiffeid.FromString(identity)
	if err != nil {
		return nil, err
	}
	return client.CreateCertificate(ctx, caclient.Request{Token: token, Identity: sid, Impersonate: true})
}
