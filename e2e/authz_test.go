package e2e_test

import (
	"crypto/x509"
	"slices"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc/codes"

	"github.com/workload-ca/workload-ca/caclient"
	"github.com/workload-ca/workload-ca/e2e/cahost"
)

// maxDenialDelay bounds how long a deleted pod's identity may still be
// issued to the node agent.
const maxDenialDelay = 10 * time.Second

// authzCases are the node-scoped policy cases: who may have which identity.
func (s *suite) authzCases() []testCase {
	table := []struct {
		name        string
		token       string
		identity    string
		impersonate bool
		want        codes.Code
	}{
		{"ztunnel on node-b gets demo/db, which has a pod there", s.ztunnelB, id("demo", "db"), true, codes.OK},
		{"ztunnel on node-a is denied demo/db, whose pods are all on node-b", s.ztunnelA, id("demo", "db"), true, codes.PermissionDenied},
		{"ztunnel is denied a service account with no pod at all", s.ztunnelA, id("demo", "nobody"), true, codes.PermissionDenied},
		{"ztunnel is denied demo/web in a foreign trust domain", s.ztunnelA, "spiffe://evil.example/ns/demo/sa/web", true, codes.PermissionDenied},
		{"ztunnel gets its own identity without impersonation", s.ztunnelA, id("istio-system", "ztunnel"), false, codes.OK},
		{"workload demo/web gets its own identity without impersonation", s.webToken, id("demo", "web"), false, codes.OK},
		{"workload demo/web gets its own identity when it names it as impersonated", s.webToken, id("demo", "web"), true, codes.OK},
		{"workload demo/web is denied impersonating demo/db", s.webToken, id("demo", "db"), true, codes.PermissionDenied},
		{"workload demo/web is denied impersonating demo/api on its own node", s.webToken, id("demo", "api"), true, codes.PermissionDenied},
		{"workload demo/web whose CSR names demo/api without impersonation is refused", s.webToken, id("demo", "api"), false, codes.InvalidArgument},
	}
	cases := []testCase{
		{"ztunnel on node-a gets demo/web (impersonation)", s.testImpersonation},
		{"ztunnel loses demo/temp once its pod on node-a is deleted", s.testDeletedPodDenied},
		{"a pod created just now is issued at once (informer lag)", s.testInformerLag},
		{"a ztunnel service account outside istio-system is not a node agent", s.testOtherNamespaceZtunnel},
	}
	for _, tc := range table {
		cases = append(cases, testCase{tc.name, func(t *testing.T) {
			res, err := s.request(t, cahost.RequestArgs{Token: tc.token, Identity: tc.identity, Impersonate: tc.impersonate})
			if got := cahost.Code(err); got != tc.want {
				t.Fatalf("code %s, want %s (err: %v)", got, tc.want, err)
			}
			if tc.want == codes.OK && res.SPIFFEID != tc.identity {
				t.Errorf("issued %s, want %s", res.SPIFFEID, tc.identity)
			}
		}})
	}
	return cases
}

// testImpersonation checks ztunnel's normal request end to end: the JSON of
// `workload-ca request`, then the certificate itself through caclient.
func (s *suite) testImpersonation(t *testing.T) {
	web := id("demo", "web")
	res, err := s.request(t, cahost.RequestArgs{Token: s.ztunnelA, Identity: web, Impersonate: true, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if res.SPIFFEID != web || res.Serial == "" || len(res.Roots) == 0 {
		t.Errorf("result %+v: want %s, a serial and a root", res, web)
	}
	if life := res.NotAfter.Sub(res.NotBefore); life < time.Hour || life > time.Hour+10*time.Minute {
		t.Errorf("lifetime %v for a 1h request", life)
	}

	// The certificate itself, as ztunnel and its peers would see it.
	cfg, err := s.ca.ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	client, err := caclient.Dial(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	got, err := client.CreateCertificate(t.Context(), caclient.Request{
		Token: s.ztunnelA, Identity: spiffeid.RequireFromString(web), Impersonate: true, TTL: time.Hour,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := got.Verify(); err != nil {
		t.Errorf("chain does not verify against the returned roots: %v", err)
	}
	s.checkLeaf(t, got, web)
}

// checkLeaf checks an SVID against the CA's root on disk.
func (s *suite) checkLeaf(t *testing.T, got *caclient.Result, want string) {
	t.Helper()
	leaf := got.Leaf
	if len(leaf.URIs) != 1 || leaf.URIs[0].String() != want {
		t.Errorf("URI SANs %v, want exactly %s", leaf.URIs, want)
	}
	if leaf.IsCA || len(leaf.DNSNames)+len(leaf.IPAddresses)+len(leaf.EmailAddresses) > 0 {
		t.Errorf("leaf: CA=%v DNS=%v IP=%v email=%v", leaf.IsCA, leaf.DNSNames, leaf.IPAddresses, leaf.EmailAddresses)
	}
	for _, eku := range []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth} {
		if !slices.Contains(leaf.ExtKeyUsage, eku) {
			t.Errorf("leaf EKU %v lacks %v", leaf.ExtKeyUsage, eku)
		}
	}
	roots, err := s.ca.Roots()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: certPool(got.Chain),
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth}}); err != nil {
		t.Errorf("leaf does not verify against %s: %v", s.ca.RootCertPath(), err)
	}
	for _, r := range got.Roots {
		if _, err := r.Verify(x509.VerifyOptions{Roots: roots}); err != nil || !r.IsCA {
			t.Errorf("returned root %s is not a root of %s (CA=%v, %v)", r.Subject, s.ca.RootCertPath(), r.IsCA, err)
		}
	}
}

// testDeletedPodDenied gets demo/temp for ztunnel on node-a, deletes the
// only pod of demo/temp, and polls until the CA refuses.
func (s *suite) testDeletedPodDenied(t *testing.T) {
	temp := id("demo", "temp")
	pod := s.createPod(t, "demo", "temp-0", "temp", "node-a")
	args := cahost.RequestArgs{Token: s.ztunnelA, Identity: temp, Impersonate: true}
	if _, err := s.request(t, args); err != nil {
		t.Fatalf("before deletion: %v", err)
	}
	s.deletePod(t, pod)
	deleted := time.Now()
	s.waitRefused(t, args, codes.PermissionDenied, codes.OK)
	t.Logf("pod deletion → PermissionDenied in %v", time.Since(deleted).Round(time.Millisecond))
}

// waitRefused repeats args until the CA answers want, within
// maxDenialDelay of a pod's deletion; meanwhile it may still answer as
// while the pod lived (alive: OK, or the refusal the live pod got). Any
// other code fails t.
func (s *suite) waitRefused(t *testing.T, args cahost.RequestArgs, want, alive codes.Code) {
	t.Helper()
	err := pollUntil(t, maxDenialDelay, func() (bool, error) {
		_, err := s.request(t, args)
		switch cahost.Code(err) {
		case alive:
			return false, nil
		case want:
			return true, nil
		default:
			return false, err
		}
	})
	if err != nil {
		t.Fatalf("after deletion: %v", err)
	}
}

// testInformerLag asks for identities of pods created a moment before,
// which the CA's pod informer may not have seen yet.
func (s *suite) testInformerLag(t *testing.T) {
	for _, sa := range []string{"fresh-1", "fresh-2", "fresh-3"} {
		sa = s.runName(sa)
		if _, err := s.cp.CreateServiceAccount(t.Context(), "demo", sa); err != nil {
			t.Fatal(err)
		}
		s.createPod(t, "demo", sa+"-0", sa, "node-a")
		res, err := s.request(t, cahost.RequestArgs{Token: s.ztunnelA, Identity: id("demo", sa), Impersonate: true})
		if err != nil {
			t.Fatalf("%s right after its pod was created: %v", sa, err)
		}
		if res.SPIFFEID != id("demo", sa) {
			t.Errorf("issued %s", res.SPIFFEID)
		}
	}
}

// testOtherNamespaceZtunnel: other/ztunnel on node-a is an ordinary
// workload; node agents are namespace/name, not a name.
func (s *suite) testOtherNamespaceZtunnel(t *testing.T) {
	tok, err := s.mint(t.Context(), "other/ztunnel-a", audience, 3600)
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.request(t, cahost.RequestArgs{Token: tok, Identity: id("demo", "web"), Impersonate: true})
	if got := cahost.Code(err); got != codes.PermissionDenied {
		t.Fatalf("code %s, want PermissionDenied (err: %v)", got, err)
	}
	res, err := s.request(t, cahost.RequestArgs{Token: tok, Identity: id("other", "ztunnel")})
	if err != nil || res.SPIFFEID != id("other", "ztunnel") {
		t.Fatalf("own identity: %+v, %v", res, err)
	}
}
