package tokenreview

import (
	"strings"
	"testing"
	"time"
)

func benchReviewer(b *testing.B) (*Reviewer, string) {
	api := newFakeAPI(always(webPod()))
	r := newReviewer(b, Config{Client: api.AuthenticationV1(), Pods: &podSet{uids: map[string]bool{"uid-web-0": true}}})
	token := realisticToken(b, time.Now().Add(time.Hour))
	if _, err := r.Authenticate(b.Context(), token); err != nil {
		b.Fatal(err)
	}
	return r, token
}

// realisticToken has the claims and size (about 1.1 KB) of a projected,
// pod-bound service account token signed with RS256.
func realisticToken(b *testing.B, exp time.Time) string {
	uid := "0f8fad5b-d9cb-469f-a165-70867728950e"
	ref := func(name string) map[string]any { return map[string]any{"name": name, "uid": uid} }
	token := makeJWT(b, map[string]any{
		"aud": []string{"istio-ca"}, "exp": exp.Unix(), "iat": exp.Unix() - 3600, "nbf": exp.Unix() - 3600,
		"iss": "https://kubernetes.default.svc.cluster.local", "jti": uid,
		"sub": "system:serviceaccount:istio-system:ztunnel",
		"kubernetes.io": map[string]any{
			"namespace": "istio-system", "node": ref("node-a"), "pod": ref("ztunnel-x7k2p"),
			"serviceaccount": ref("ztunnel"),
		},
	})
	head, _, _ := strings.Cut(token, ".")
	payload := strings.Split(token, ".")[1]
	return head + "." + payload + "." + strings.Repeat("S", 342) // RSA-2048 signature
}

// BenchmarkAuthenticateCached is the hit path: size check, SHA-256, LRU
// lookup, expiry and pod checks (the shape check runs only on a miss).
func BenchmarkAuthenticateCached(b *testing.B) {
	r, token := benchReviewer(b)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := r.Authenticate(b.Context(), token); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAuthenticateCachedParallel shows contention on the cache lock.
func BenchmarkAuthenticateCachedParallel(b *testing.B) {
	r, token := benchReviewer(b)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := r.Authenticate(b.Context(), token); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
