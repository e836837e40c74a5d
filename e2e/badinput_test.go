package e2e_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/workload-ca/workload-ca/e2e/cahost"
	"github.com/workload-ca/workload-ca/internal/testca"
	"github.com/workload-ca/workload-ca/proto/capb"
)

// badCase is one hostile request: what the CA is sent and the code it must
// answer. Every field left zero is what a well-behaved ztunnel on node-a
// sends for the web workload on its node.
type badCase struct {
	name string
	// md replaces the request headers when set (authorization included).
	md metadata.MD
	// token replaces the ztunnel's token in the authorization header.
	token string
	// identity replaces the ImpersonatedIdentity metadata value.
	identity *structpb.Value
	// csr replaces the CSR.
	csr  string
	want codes.Code
}

// TestBadInputMatrix sends the CA, served against the real apiserver, one
// hostile request after another, each alone on a new connection: malformed
// headers and metadata, every kind of token defect (the spellings of a
// valid token among them), odd SPIFFE IDs, CSR defects and a wrong cluster
// id. Each gets its code, and afterwards the CA's log and audit records
// hold no issuance, no token, no key and no CSR. TTL extremes are the one
// input that is not refused: a lifetime is clamped to --max-ttl, as the
// last part shows.
func TestBadInputMatrix(t *testing.T) {
	f := newLCFixture(t, "badinput")
	ns := f.ns
	s := f.s
	for _, sa := range []string{"web", "db"} {
		if _, err := s.cp.CreateServiceAccount(t.Context(), ns, sa); err != nil {
			t.Fatal(err)
		}
	}
	webPod := s.createPod(t, ns, "web-0", "web", "node-a")
	s.createPod(t, ns, "db-0", "db", "node-b")
	gone := s.createPod(t, ns, "web-gone", "web", "node-a")
	zt := f.ztunnels(t, 1)[0]
	webTok, err := s.mintFor(t.Context(), webPod, audience, 3600)
	if err != nil {
		t.Fatal(err)
	}
	vaultTok, err := s.mintFor(t.Context(), webPod, "vault", 3600)
	if err != nil {
		t.Fatal(err)
	}
	goneTok, err := s.mintFor(t.Context(), gone, audience, 3600)
	if err != nil {
		t.Fatal(err)
	}
	zero := int64(0)
	if err := s.cp.Client().CoreV1().Pods(ns).Delete(t.Context(), gone.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}
	ca := f.start(t, "--max-ttl", "24h", "--cluster-id", "Kubernetes")
	webID := id(ns, "web")
	goodCSRBytes, _ := testca.ZtunnelCSR(t, spiffeid.RequireFromString(webID))
	goodCSR := string(goodCSRBytes)
	str := structpb.NewStringValue
	withID := func(v string) *structpb.Value { return str(v) }
	sig := func(tok string) (rest, seg string) { i := strings.LastIndexByte(tok, '.'); return tok[:i+1], tok[i+1:] }
	sig2 := func(tok string) string { _, seg := sig(tok); return seg }
	payloadOf := func(tok string) (head, seg, tail string) {
		p := strings.Split(tok, ".")
		return p[0] + ".", p[1], "." + p[2]
	}
	// setUnused flips the lowest unused bit of seg's last character, a
	// spelling that lenient decoders read as the same bytes; ok is false
	// when seg's length leaves no unused bit.
	setUnused := func(seg string) (string, bool) {
		const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
		if len(seg)%4 != 2 && len(seg)%4 != 3 {
			return seg, false
		}
		v := strings.IndexByte(alphabet, seg[len(seg)-1])
		return seg[:len(seg)-1] + string(alphabet[v^1]), true
	}
	respelled := func(tok string) string {
		t.Helper()
		p := strings.Split(tok, ".")
		for _, i := range []int{1, 0} { // the claims, else the header
			if seg, ok := setUnused(p[i]); ok {
				p[i] = seg
				return strings.Join(p, ".")
			}
		}
		t.Fatal("neither the claims nor the header of the token has unused bits")
		return ""
	}
	sigSpelled, ok := setUnused(sig2(zt))
	if !ok {
		t.Fatal("the token's signature has no unused bits")
	}
	sigRest, sigSeg := sig(zt)
	head, paySeg, tail := payloadOf(zt)
	_, otherPay, _ := payloadOf(webTok)
	csrOf := func(tmpl *x509.CertificateRequest, key any) string {
		der, err := x509.CreateCertificateRequest(rand.Reader, tmpl, key)
		if err != nil {
			t.Fatal(err)
		}
		return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}))
	}
	uri := func(s string) *url.URL { u, _ := url.Parse(s); return u }
	p256, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	p224, _ := ecdsa.GenerateKey(elliptic.P224(), rand.Reader)
	rsa1024, _ := rsa.GenerateKey(rand.Reader, 1024)
	goodBlock, _ := pem.Decode([]byte(goodCSR))
	badSig := append([]byte(nil), goodBlock.Bytes...)
	badSig[len(badSig)-3] ^= 0xff
	md := metadata.Pairs
	bearer := func(tok string) string { return "Bearer " + tok }

	unauth, invalid, denied := codes.Unauthenticated, codes.InvalidArgument, codes.PermissionDenied
	cases := []badCase{
		// Headers.
		{name: "no authorization header", md: md("clusterid", "Kubernetes"), want: unauth},
		{name: "empty bearer token", md: md("authorization", "Bearer ", "clusterid", "Kubernetes"), want: unauth},
		{name: "Basic credentials", md: md("authorization", "Basic d2ViOnNlY3JldA==", "clusterid", "Kubernetes"), want: unauth},
		{name: "token without a scheme", md: md("authorization", zt, "clusterid", "Kubernetes"), want: unauth},
		{name: "two authorization headers", md: md("authorization", bearer(zt), "authorization", bearer(webTok), "clusterid", "Kubernetes"), want: unauth},
		{name: "a bearer and a Basic header", md: md("authorization", "Basic eDp5", "authorization", bearer(zt), "clusterid", "Kubernetes"), want: unauth},
		{name: "bearer token of 12 KiB", token: strings.Repeat("a", 12<<10), want: unauth},
		// The server's SETTINGS tell the client its header limit, and
		// grpc-go refuses to send more: nothing reaches the CA.
		{name: "headers over the limit (20 KiB)", md: md("authorization", bearer(zt), "clusterid", "Kubernetes", "x-junk", strings.Repeat("j", 20<<10)), want: codes.Internal},
		{name: "another cluster id", md: md("authorization", bearer(zt), "clusterid", "east"), want: unauth},
		{name: "two cluster ids", md: md("authorization", bearer(zt), "clusterid", "Kubernetes", "clusterid", "east"), want: unauth},
		{name: "empty cluster id", md: md("authorization", bearer(zt), "clusterid", ""), want: unauth},
		// Tokens.
		{name: "token with a space inside", token: zt[:20] + " " + zt[20:], want: unauth},
		{name: "token with a second word", token: zt + " " + zt, want: unauth},
		{name: "signature padded", token: zt + "==", want: unauth},
		{name: "signature with unused bits set", token: sigRest + sigSpelled, want: unauth},
		{name: "claims or header with unused bits set", token: respelled(zt), want: unauth},
		{name: "payload padded", token: head + paySeg + "==" + tail, want: unauth},
		{name: "signed by a key the issuer never published", token: foreignSignedJWT(t, zt), want: unauth},
		{name: "alg none", token: unsignedJWT(t, zt), want: unauth},
		{name: "another token's claims under this signature", token: head + otherPay + tail, want: unauth},
		{name: "signature truncated", token: sigRest + sigSeg[:len(sigSeg)-8], want: unauth},
		{name: "signature of another token", token: sigRest + func() string { _, s := sig(webTok); return s }(), want: unauth},
		{name: "token for another audience", token: vaultTok, want: unauth},
		{name: "token of a deleted pod", token: goneTok, want: unauth},
		{name: "three segments of garbage", token: "aaaa.bbbb.cccc", want: unauth},
		{name: "five segments (a JWE)", token: "aaaa.bbbb.cccc.dddd.eeee", want: unauth},
		{name: "header of JSON garbage", token: base64.RawURLEncoding.EncodeToString([]byte(`{"alg":`)) + "." + paySeg + "." + sigSeg, want: unauth},
		{name: "standard base64 alphabet", token: strings.NewReplacer("-", "+", "_", "/").Replace(zt) + "+/", want: unauth},
		// ImpersonatedIdentity metadata.
		{name: "identity as a number", identity: structpb.NewNumberValue(42), want: invalid},
		{name: "identity as a bool", identity: structpb.NewBoolValue(true), want: invalid},
		{name: "identity as a list", identity: structpb.NewListValue(&structpb.ListValue{Values: []*structpb.Value{str(webID)}}), want: invalid},
		{name: "identity as a struct", identity: structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{"id": str(webID)}}), want: invalid},
		{name: "identity as null", identity: structpb.NewNullValue(), want: invalid},
		{name: "identity not a URI", identity: withID("web"), want: invalid},
		{name: "identity of another scheme", identity: withID("https://cluster.local/ns/" + ns + "/sa/web"), want: invalid},
		{name: "identity spiffe:// only", identity: withID("spiffe://"), want: invalid},
		{name: "identity with an upper-case trust domain", identity: withID("spiffe://Cluster.local/ns/" + ns + "/sa/web"), want: invalid},
		{name: "identity with a trailing slash", identity: withID(webID + "/"), want: invalid},
		{name: "identity with a dot segment", identity: withID("spiffe://cluster.local/ns/" + ns + "/sa/../sa/web"), want: invalid},
		{name: "identity percent-encoded", identity: withID("spiffe://cluster.local/ns/" + ns + "/sa/w%65b"), want: invalid},
		{name: "identity with a query", identity: withID(webID + "?x=1"), want: invalid},
		{name: "identity with a fragment", identity: withID(webID + "#x"), want: invalid},
		{name: "identity with leading white space", identity: withID(" " + webID), want: invalid},
		{name: "identity with a port", identity: withID("spiffe://cluster.local:443/ns/" + ns + "/sa/web"), want: invalid},
		{name: "identity with non-ASCII", identity: withID("spiffe://cluster.local/ns/" + ns + "/sa/wéb"), want: invalid},
		{name: "identity of the trust domain alone", identity: withID("spiffe://cluster.local"), want: denied},
		{name: "identity of another trust domain", identity: withID("spiffe://evil.example/ns/" + ns + "/sa/web"), want: denied},
		{name: "identity with an extra segment", identity: withID(webID + "/extra"), want: denied},
		{name: "identity of a namespace Kubernetes cannot hold", identity: withID("spiffe://cluster.local/ns/Web/sa/web"), want: denied},
		{name: "identity of a service account Kubernetes cannot hold", identity: withID("spiffe://cluster.local/ns/" + ns + "/sa/web_1"), want: denied},
		{name: "identity with a 300-byte service account", identity: withID("spiffe://cluster.local/ns/" + ns + "/sa/" + strings.Repeat("a", 300)), want: denied},
		{name: "identity of a workload on another node", identity: withID(id(ns, "db")), want: denied},
		{name: "a workload impersonating another", token: webTok, identity: withID(id(ns, "db")), want: denied},
		// CSRs.
		{name: "empty CSR", csr: " ", want: invalid},
		{name: "CSR not PEM", csr: "MIIB" + strings.Repeat("A", 100), want: invalid},
		{name: "CSR in a CERTIFICATE block", csr: strings.ReplaceAll(goodCSR, "CERTIFICATE REQUEST", "CERTIFICATE"), want: invalid},
		{name: "CSR of garbage DER", csr: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: []byte("garbage")})), want: invalid},
		{name: "two CSRs", csr: goodCSR + goodCSR, want: invalid},
		{name: "CSR with a broken signature", csr: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: badSig})), want: invalid},
		{name: "CSR with PEM headers", csr: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Headers: map[string]string{"Proc-Type": "4,ENCRYPTED"}, Bytes: goodBlock.Bytes})), want: invalid},
		{name: "CSR of an RSA-1024 key", csr: csrOf(&x509.CertificateRequest{URIs: []*url.URL{uri(webID)}}, rsa1024), want: invalid},
		{name: "CSR of a P-224 key", csr: csrOf(&x509.CertificateRequest{URIs: []*url.URL{uri(webID)}}, p224), want: invalid},
		{name: "CSR naming another identity", csr: csrOf(&x509.CertificateRequest{URIs: []*url.URL{uri(id(ns, "db"))}}, p256), want: invalid},
		{name: "CSR with two URIs", csr: csrOf(&x509.CertificateRequest{URIs: []*url.URL{uri(webID), uri(id(ns, "db"))}}, p256), want: invalid},
		{name: "CSR with a DNS name", csr: csrOf(&x509.CertificateRequest{URIs: []*url.URL{uri(webID)}, DNSNames: []string{"kubernetes.default.svc"}}, p256), want: invalid},
		{name: "CSR with an e-mail address", csr: csrOf(&x509.CertificateRequest{URIs: []*url.URL{uri(webID)}, EmailAddresses: []string{"root@example.com"}}, p256), want: invalid},
		{name: "CSR of 70 KiB (over the message limit)", csr: goodCSR + strings.Repeat("#", 70<<10), want: codes.ResourceExhausted},
	}
	if len(cases) < 60 {
		t.Fatalf("%d cases, want at least 60", len(cases))
	}
	logStart := len(ca.Logs())
	svc := rawCAClient(t, ca)
	for _, c := range cases {
		headers := c.md
		if headers == nil {
			tok := zt
			if c.token != "" {
				tok = c.token
			}
			headers = md("authorization", bearer(tok), "clusterid", "Kubernetes")
		}
		idv := c.identity
		if idv == nil {
			idv = str(webID)
		}
		csr := c.csr
		if csr == "" {
			csr = goodCSR
		}
		req := &capb.IstioCertificateRequest{Csr: csr, ValidityDuration: 86400,
			Metadata: &structpb.Struct{Fields: map[string]*structpb.Value{"ImpersonatedIdentity": idv}}}
		ctx, cancel := context.WithTimeout(metadata.NewOutgoingContext(t.Context(), headers), 10*time.Second)
		resp, err := svc(ctx, req)
		cancel()
		if got := status.Code(err); got != c.want || resp != nil {
			t.Errorf("%s: code %s (%v), want %s", c.name, got, err, c.want)
		} else {
			t.Logf("%s: %s: %s", c.name, got, status.Convert(err).Message())
		}
	}
	// The well-formed request the cases are cut from is served, and TTL
	// extremes are clamped, never beyond --max-ttl.
	for _, ttl := range []int64{0, -1, -1 << 62, 1, 25 * 3600, 1 << 62} {
		req := &capb.IstioCertificateRequest{Csr: goodCSR, ValidityDuration: ttl,
			Metadata: &structpb.Struct{Fields: map[string]*structpb.Value{"ImpersonatedIdentity": str(webID)}}}
		ctx := metadata.NewOutgoingContext(t.Context(), md("authorization", bearer(zt), "clusterid", "Kubernetes"))
		resp, err := svc(ctx, req)
		if err != nil {
			t.Fatalf("the well-formed request with validity %d: %v", ttl, err)
		}
		block, _ := pem.Decode([]byte(resp.GetCertChain()[0]))
		leaf, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		if life := leaf.NotAfter.Sub(leaf.NotBefore); life > 24*time.Hour+2*time.Minute {
			t.Errorf("validity %d: the leaf lives %v, over --max-ttl 24h (plus the 2m backdate)", ttl, life)
		}
	}
	logs := ca.Logs()[logStart:]
	if n := strings.Count(logs, `"msg":"certificate issued"`); n != 6 {
		t.Errorf("%d issuance records, want the 6 well-formed requests'", n)
	}
	secrets := map[string]string{"the ztunnel's token": zt, "the web token": webTok, "the vault token": vaultTok,
		"the deleted pod's token": goneTok, "a token's signature": sigSeg, "a token's claims": paySeg,
		"a private key": "BEGIN PRIVATE KEY", "an EC private key": "BEGIN EC PRIVATE KEY", "a CSR": "BEGIN CERTIFICATE REQUEST", "a CSR's body": base64.StdEncoding.EncodeToString(goodBlock.Bytes)[:40]}
	for what, secret := range secrets {
		if strings.Contains(logs, secret) {
			t.Errorf("the CA's log holds %s", what)
		}
	}
	t.Logf("%d hostile requests refused with their codes; log of %d bytes scanned for %d secrets", len(cases), len(logs), len(secrets))
}

// rawCAClient returns the CA's CreateCertificate over a fresh TLS
// connection per call, so that a request the transport refuses cannot
// spoil the next.
func rawCAClient(t *testing.T, ca *cahost.CA) func(context.Context, *capb.IstioCertificateRequest) (*capb.IstioCertificateResponse, error) {
	t.Helper()
	cfg, err := ca.ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	creds := credentials.NewTLS(&tls.Config{MinVersion: tls.VersionTLS13, RootCAs: cfg.Roots, ServerName: cfg.ServerName})
	call := func(ctx context.Context, req *capb.IstioCertificateRequest) (*capb.IstioCertificateResponse, error) {
		conn, err := grpc.NewClient(cfg.Address, grpc.WithTransportCredentials(creds))
		if err != nil {
			return nil, fmt.Errorf("dial: %w", err)
		}
		defer conn.Close()
		return capb.NewIstioCertificateServiceClient(conn).CreateCertificate(ctx, req)
	}
	return call
}
