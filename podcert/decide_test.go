package podcert

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"testing"
	"time"

	certv1 "k8s.io/api/certificates/v1"
)

func mustKey[K crypto.Signer](k K, err error) crypto.Signer {
	if err != nil {
		panic(err)
	}
	return k
}

func TestDecide(t *testing.T) {
	p256 := mustKey(ecdsa.GenerateKey(elliptic.P256(), rand.Reader))
	p521 := mustKey(ecdsa.GenerateKey(elliptic.P521(), rand.Reader))
	rsa1024 := mustKey(rsa.GenerateKey(rand.Reader, 1024))
	_, edKey, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name       string
		edit       func(*certv1.PodCertificateRequest)
		wantReason string
		wantID     string
		wantMax    time.Duration
	}{
		{name: "P-256: the service account's identity, within maxExpirationSeconds",
			wantID: "spiffe://cluster.local/ns/apps/sa/web-sa", wantMax: time.Hour},
		{name: "Ed25519 key", edit: func(p *certv1.PodCertificateRequest) {
			p.Spec.StubPKCS10Request = newPCR(t, "apps", "x", "web-sa", testSigner, edKey, 3600).Spec.StubPKCS10Request
		},
			wantID: "spiffe://cluster.local/ns/apps/sa/web-sa", wantMax: time.Hour},
		{name: "maxExpirationSeconds unset: the API server's default", edit: func(p *certv1.PodCertificateRequest) { p.Spec.MaxExpirationSeconds = nil },
			wantID: "spiffe://cluster.local/ns/apps/sa/web-sa", wantMax: 24 * time.Hour},
		{name: "P-521 key", edit: func(p *certv1.PodCertificateRequest) {
			p.Spec.StubPKCS10Request = newPCR(t, "apps", "x", "web-sa", testSigner, p521, 3600).Spec.StubPKCS10Request
		},
			wantReason: ReasonUnsupportedKeyType},
		{name: "RSA-1024 key", edit: func(p *certv1.PodCertificateRequest) {
			p.Spec.StubPKCS10Request = newPCR(t, "apps", "x", "web-sa", testSigner, rsa1024, 3600).Spec.StubPKCS10Request
		},
			wantReason: ReasonUnsupportedKeyType},
		{name: "user annotations", edit: func(p *certv1.PodCertificateRequest) {
			p.Spec.UnverifiedUserAnnotations = map[string]string{"example.com/x": "y"}
		}, wantReason: ReasonInvalidUserAnnotations},
		{name: "stub CSR garbage", edit: func(p *certv1.PodCertificateRequest) { p.Spec.StubPKCS10Request = []byte("not DER") },
			wantReason: ReasonInvalidRequest},
		{name: "service account name that is no SPIFFE path segment", edit: func(p *certv1.PodCertificateRequest) { p.Spec.ServiceAccountName = "" },
			wantReason: ReasonInvalidRequest},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pcr := newPCR(t, "apps", "web", "web-sa", testSigner, p256, 3600)
			if tt.edit != nil {
				tt.edit(pcr)
			}
			d := decide(&item{PodCertificateRequest: pcr}, testTD)
			if d.reason != tt.wantReason {
				t.Fatalf("reason %q (%s), want %q", d.reason, d.msg, tt.wantReason)
			}
			if tt.wantReason != "" {
				return
			}
			if d.req.ID.String() != tt.wantID || d.req.MaxValidity != tt.wantMax || d.req.CSR == nil {
				t.Errorf("request for %s, max validity %v; want %s, %v", d.req.ID, d.req.MaxValidity, tt.wantID, tt.wantMax)
			}
		})
	}
}

func TestRefreshAt(t *testing.T) {
	nb := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	tests := []struct {
		name     string
		validity time.Duration
		want     time.Duration // after notBefore
	}{
		{"a day: halfway", 24 * time.Hour, 12 * time.Hour},
		{"an hour: halfway", time.Hour, 30 * time.Minute},
		{"twenty minutes: the earliest the API server accepts", 20 * time.Minute, 10 * time.Minute},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := refreshAt(nb, nb.Add(tt.validity)).Sub(nb); got != tt.want {
				t.Errorf("refresh after %v, want %v", got, tt.want)
			}
		})
	}
}

// Whatever the request, decide never panics, and what it would issue is
// the SVID of the request's own service account, within the request's
// bound, for the stub CSR's key.
func FuzzDecide(f *testing.F) {
	key := mustKey(ecdsa.GenerateKey(elliptic.P256(), rand.Reader))
	good := newPCR(f, "apps", "web", "web-sa", testSigner, key, 3600).Spec.StubPKCS10Request
	f.Add(good, "apps", "web-sa", int32(3600))
	f.Add([]byte("not DER"), "apps", "web-sa", int32(86400))
	f.Add(good[:len(good)/2], "kube-system", "", int32(0))
	f.Fuzz(func(t *testing.T, stub []byte, ns, sa string, maxExpiration int32) {
		pcr := &certv1.PodCertificateRequest{}
		pcr.Namespace, pcr.Spec.ServiceAccountName, pcr.Spec.StubPKCS10Request = ns, sa, stub
		pcr.Spec.MaxExpirationSeconds = &maxExpiration
		d := decide(&item{PodCertificateRequest: pcr}, testTD)
		if d.reason != "" {
			return
		}
		if want := "spiffe://cluster.local/ns/" + ns + "/sa/" + sa; d.req.ID.String() != want {
			t.Fatalf("would issue %s, want %s", d.req.ID, want)
		}
		if d.req.MaxValidity != time.Duration(maxExpiration)*time.Second {
			t.Fatalf("max validity %v for maxExpirationSeconds %d", d.req.MaxValidity, maxExpiration)
		}
		if d.req.CSR == nil || string(d.req.CSR.Raw) != string(stub) {
			t.Fatal("the CSR to sign is not the stub")
		}
	})
}
