package e2e_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/workload-ca/workload-ca/e2e/cahost"
)

// authnCases are tokens the CA must not accept: each gets Unauthenticated.
func (s *suite) authnCases() []testCase {
	table := []struct {
		name  string
		token func(t *testing.T) string
	}{
		{"a token for another audience", func(t *testing.T) string {
			return s.mustMint(t, "istio-system/ztunnel-a", "other-aud")
		}},
		{"an expired token", func(t *testing.T) string {
			expired, err := s.cp.ExpireToken(s.mustMint(t, "istio-system/ztunnel-a", audience), 5*time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			s.remember(expired)
			return expired
		}},
		{"garbage", func(*testing.T) string { return s.rememberRet("not-a-jwt") }},
		{"an unsigned JWT (alg none) with plausible claims", func(t *testing.T) string {
			return s.rememberRet(unsignedJWT(t, s.ztunnelA))
		}},
		{"a JWT with the apiserver's claims signed by another key", func(t *testing.T) string {
			return s.rememberRet(foreignSignedJWT(t, s.ztunnelA))
		}},
		{"an empty token", func(*testing.T) string { return "" }},
	}
	var cases []testCase
	for _, tc := range table {
		cases = append(cases, testCase{"Unauthenticated: " + tc.name, func(t *testing.T) {
			tok := tc.token(t)
			for _, args := range []cahost.RequestArgs{
				{Token: tok, Identity: id("demo", "web"), Impersonate: true},
				{Token: tok, Identity: id("istio-system", "ztunnel")},
			} {
				_, err := s.request(t, args)
				if got := cahost.Code(err); got != codes.Unauthenticated {
					t.Errorf("impersonate=%v: code %s, want Unauthenticated (err: %v)", args.Impersonate, got, err)
				}
			}
		}})
	}
	return append(cases,
		testCase{"Unauthenticated: the token of a deleted pod", s.testTokenOfDeletedPod},
		testCase{"Unauthenticated: a token the CA accepted, once its pod is deleted", s.testCachedTokenOfDeletedPod},
		testCase{"Unauthenticated: a valid ztunnel token that claims another cluster", s.testOtherCluster})
}

// testOtherCluster: with --cluster-id set, a request whose clusterid header
// names another cluster is refused, though its token is valid here.
func (s *suite) testOtherCluster(t *testing.T) {
	args := cahost.RequestArgs{Token: s.ztunnelA, Identity: id("demo", "web"), Impersonate: true}
	if _, err := s.request(t, args); err != nil {
		t.Fatalf("from our cluster: %v", err)
	}
	args.ClusterID = "east"
	if _, err := s.request(t, args); cahost.Code(err) != codes.Unauthenticated {
		t.Fatalf("from cluster east: %v, want Unauthenticated", err)
	}
}

// testTokenOfDeletedPod: a token minted for a pod that is then deleted is
// refused, though it has not expired, whoever it asks for. The API
// server's and the CA's pod informers may lag the deletion by a moment,
// and meanwhile the CA answers as for a live pod (here PermissionDenied:
// the service account may neither impersonate nor ask for an identity not
// its own), so the refusal must come within maxDenialDelay.
func (s *suite) testTokenOfDeletedPod(t *testing.T) {
	pod := s.createPod(t, "demo", "gone-0", "gone", "node-a")
	tok, err := s.mintFor(t.Context(), pod, audience, 3600)
	if err != nil {
		t.Fatal(err)
	}
	s.deletePod(t, pod)
	for _, args := range []cahost.RequestArgs{
		{Token: tok, Identity: id("demo", "web"), Impersonate: true},
		{Token: tok, Identity: id("istio-system", "ztunnel")},
	} {
		s.waitRefused(t, args, codes.Unauthenticated, codes.PermissionDenied)
	}
}

// testCachedTokenOfDeletedPod: a token reviewed (and cached) while its pod
// lived must stop working when the pod is deleted, though it has not
// expired.
func (s *suite) testCachedTokenOfDeletedPod(t *testing.T) {
	sa := s.runName("cached")
	if _, err := s.cp.CreateServiceAccount(t.Context(), "demo", sa); err != nil {
		t.Fatal(err)
	}
	pod := s.createPod(t, "demo", sa+"-0", sa, "node-a")
	tok, err := s.mintFor(t.Context(), pod, audience, 3600)
	if err != nil {
		t.Fatal(err)
	}
	args := cahost.RequestArgs{Token: tok, Identity: id("demo", sa)}
	if _, err := s.request(t, args); err != nil {
		t.Fatalf("while the pod lives: %v", err)
	}
	s.deletePod(t, pod)
	deleted := time.Now()
	// The CA drops its cached review when the pod leaves its index. The
	// fresh TokenReview may still succeed while kube-apiserver's own token
	// cache (10s for successes) holds the token, so the CA checks the pod
	// itself: the denial must come as fast as the pod index learns.
	s.waitRefused(t, args, codes.Unauthenticated, codes.OK)
	t.Logf("pod deletion → Unauthenticated for its cached token in %v", time.Since(deleted).Round(time.Millisecond))
}

func (s *suite) mustMint(t *testing.T, pod, aud string) string {
	t.Helper()
	tok, err := s.mint(t.Context(), pod, aud, 3600)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func (s *suite) rememberRet(token string) string {
	s.remember(token)
	return token
}

// unsignedJWT returns token's claims under {"alg":"none"} with an empty
// signature.
func unsignedJWT(t *testing.T, token string) string {
	t.Helper()
	header := base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"none","typ":"JWT"}`))
	return header + "." + jwtPart(t, token, 1) + "."
}

// foreignSignedJWT returns token's header and claims signed with a fresh
// ES256 key the apiserver does not know.
func foreignSignedJWT(t *testing.T, token string) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	input := jwtPart(t, token, 0) + "." + jwtPart(t, token, 1)
	digest := sha256.Sum256([]byte(input))
	r, sgn, err := ecdsa.Sign(rand.Reader, key, digest[:])
	if err != nil {
		t.Fatal(err)
	}
	sig := make([]byte, 64)
	r.FillBytes(sig[:32])
	sgn.FillBytes(sig[32:])
	return input + "." + base64.RawURLEncoding.EncodeToString(sig)
}

// jwtPart returns part i of a compact JWS after checking it decodes (the
// header and claims as JSON).
func jwtPart(t *testing.T, token string, i int) string {
	t.Helper()
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		t.Fatalf("not a compact JWS")
	}
	b, err := base64.RawURLEncoding.DecodeString(parts[i])
	if err != nil || (i < 2 && !json.Valid(b)) {
		t.Fatalf("JWS part %d does not decode: %v", i, err)
	}
	return parts[i]
}
