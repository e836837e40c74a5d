package loadtest

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/workload-ca/workload-ca/ca"
	"github.com/workload-ca/workload-ca/ca/keystore"
	"github.com/workload-ca/workload-ca/caclient"
	"github.com/workload-ca/workload-ca/proto/capb"
)

var td = spiffeid.RequireTrustDomainFromString("cluster.local")

func id(sa string) string { return "spiffe://cluster.local/ns/test/sa/" + sa }

// fakeCA is an IstioCertificateService that records what the load
// generator does: concurrency and connections per token, certificates
// issued per token and identity. It signs one certificate per identity and
// returns it again afterwards, to keep tests fast.
type fakeCA struct {
	capb.UnimplementedIstioCertificateServiceServer
	auth  *ca.Authority
	delay time.Duration
	// holdUntil, when set, holds each token's requests until that many are
	// in flight at once (for at most a second), so a test of the
	// generator's concurrency does not depend on how fast this machine
	// schedules its workers.
	holdUntil int
	// deny refuses these identities with PermissionDenied; wrongSAN answers
	// them with another identity's certificate; flaky fails the first
	// flaky[id] requests of id with Unavailable.
	deny, wrongSAN map[string]bool
	flaky          map[string]int

	mu          sync.Mutex
	chains      map[string][]string
	inFlight    map[string]int
	maxInFlight map[string]int
	peers       map[string]map[string]bool // token -> peer addresses
	clusters    map[string]string          // token -> clusterid header
	issued      map[string]int             // token|identity -> count
	issuedAt    map[string]time.Time       // identity -> when it was issued last
	failures    map[string]int
	failedAt    map[string][]time.Time // identity -> when each failure was answered
}

func (f *fakeCA) CreateCertificate(ctx context.Context, req *capb.IstioCertificateRequest) (*capb.IstioCertificateResponse, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	auth := md.Get("authorization")
	if len(auth) != 1 || !strings.HasPrefix(auth[0], "Bearer ") {
		return nil, status.Error(codes.Unauthenticated, "no token")
	}
	token := strings.TrimPrefix(auth[0], "Bearer ")
	p, _ := peer.FromContext(ctx)
	want := req.GetMetadata().GetFields()["ImpersonatedIdentity"].GetStringValue()

	f.mu.Lock()
	f.inFlight[token]++
	f.maxInFlight[token] = max(f.maxInFlight[token], f.inFlight[token])
	if f.peers[token] == nil {
		f.peers[token] = map[string]bool{}
	}
	f.peers[token][p.Addr.String()] = true
	if f.clusters == nil {
		f.clusters = map[string]string{}
	}
	f.clusters[token] = strings.Join(md.Get("clusterid"), ",")
	fail := f.failures[want] < f.flaky[want]
	if fail {
		f.failures[want]++
		if f.failedAt == nil {
			f.failedAt = map[string][]time.Time{}
		}
		f.failedAt[want] = append(f.failedAt[want], time.Now())
	}
	for deadline := time.Now().Add(time.Second); f.maxInFlight[token] < f.holdUntil && time.Now().Before(deadline) && ctx.Err() == nil; {
		f.mu.Unlock()
		time.Sleep(time.Millisecond)
		f.mu.Lock()
	}
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		f.inFlight[token]--
		f.mu.Unlock()
	}()

	time.Sleep(f.delay)
	switch {
	case fail:
		return nil, status.Error(codes.Unavailable, "flaky")
	case f.deny[want]:
		return nil, status.Error(codes.PermissionDenied, "denied")
	case f.wrongSAN[want]:
		want = id("someone-else")
	}
	chain, err := f.chain(req.GetCsr(), want)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	f.mu.Lock()
	f.issued[token+"|"+want]++
	if f.issuedAt == nil {
		f.issuedAt = map[string]time.Time{}
	}
	f.issuedAt[want] = time.Now()
	f.mu.Unlock()
	return &capb.IstioCertificateResponse{CertChain: chain}, nil
}

func (f *fakeCA) chain(csrPEM, want string) ([]string, error) {
	f.mu.Lock()
	c, ok := f.chains[want]
	f.mu.Unlock()
	if ok {
		return c, nil
	}
	if _, err := ca.ParseCSR([]byte(csrPEM)); err != nil {
		return nil, err
	}
	// Certify a key of our own: the request's CSR may name another identity.
	wid, err := spiffeid.FromString(want)
	if err != nil {
		return nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	own, err := caclient.NewCSR(key, wid)
	if err != nil {
		return nil, err
	}
	csr, err := ca.ParseCSR(own)
	if err != nil {
		return nil, err
	}
	issued, err := f.auth.Sign(context.Background(), ca.Request{CSR: csr, ID: wid})
	if err != nil {
		return nil, err
	}
	f.mu.Lock()
	f.chains[want] = issued.Chain
	f.mu.Unlock()
	return issued.Chain, nil
}

func (f *fakeCA) maxInFlightOf(token string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.maxInFlight[token]
}

func (f *fakeCA) peersOf(token string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for a := range f.peers[token] {
		out = append(out, a)
	}
	return out
}

func (f *fakeCA) clusterOf(token string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.clusters[token]
}

func (f *fakeCA) issuedCount(token, identity string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.issued[token+"|"+identity]
}

// startFake serves f over TLS 1.3 on 127.0.0.1 and returns a Config that
// reaches it.
func startFake(t *testing.T, f *fakeCA) Config {
	t.Helper()
	m, err := keystore.GenerateRoot(keystore.GenerateOptions{TrustDomain: td}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	f.auth, err = ca.New(ca.Config{TrustDomain: td}, m)
	if err != nil {
		t.Fatal(err)
	}
	f.chains, f.inFlight, f.maxInFlight = map[string][]string{}, map[string]int{}, map[string]int{}
	f.peers, f.issued, f.failures = map[string]map[string]bool{}, map[string]int{}, map[string]int{}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	leaf, above, err := f.auth.IssueServing(context.Background(), key.Public(), []string{"localhost"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cert := tls.Certificate{Certificate: [][]byte{leaf.Raw}, PrivateKey: key, Leaf: leaf}
	for _, c := range above {
		cert.Certificate = append(cert.Certificate, c.Raw)
	}
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{cert}})))
	capb.RegisterIstioCertificateServiceServer(srv, f)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	roots := x509.NewCertPool()
	for _, r := range f.auth.Roots() {
		roots.AddCert(r)
	}
	return Config{Address: lis.Addr().String(), Roots: roots, ServerName: "localhost", CSRsPerIdentity: 1}
}

// plan returns n ztunnels with tokens token-0.. and m identities each
// (ztunnel i: sa-i-0 .. sa-i-(m-1)).
func plan(n, m int) Plan {
	p := make(Plan, n)
	for i := range p {
		p[i].Token = fmt.Sprintf("token-%d", i)
		for j := range m {
			p[i].Identities = append(p[i].Identities, id(fmt.Sprintf("sa-%d-%d", i, j)))
		}
	}
	return p
}

// syncWriter serializes writes for a buffer read after the run.
type syncWriter struct {
	mu sync.Mutex
	w  *bytes.Buffer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}
