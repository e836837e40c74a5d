package server

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/workload-ca/workload-ca/authz"
	"github.com/workload-ca/workload-ca/ca"
	"github.com/workload-ca/workload-ca/internal/testca"
	"github.com/workload-ca/workload-ca/proto/capb"
)

func meta(kv map[string]*structpb.Value) *structpb.Struct { return &structpb.Struct{Fields: kv} }

// parsedRequest is what the service reads of a request before it signs.
type parsedRequest struct {
	csr       *x509.CertificateRequest
	requested spiffeid.ID
	ttl       time.Duration
}

// parseRequest reads a request as createCertificate does.
func parseRequest(req *capb.IstioCertificateRequest) (parsedRequest, error) {
	requested, err := impersonatedIdentity(req)
	if err != nil {
		return parsedRequest{}, err
	}
	csr, err := ca.ParseCSR([]byte(req.GetCsr()))
	if err != nil {
		return parsedRequest{}, err
	}
	return parsedRequest{csr: csr, requested: requested, ttl: seconds(req.GetValidityDuration())}, nil
}

func TestParseRequest(t *testing.T) {
	web := spiffeid.RequireFromString("spiffe://cluster.local/ns/demo/sa/web")
	csr, _ := testca.ZtunnelCSR(t, web)
	tests := []struct {
		name          string
		req           *capb.IstioCertificateRequest
		wantRequested spiffeid.ID
		wantTTL       time.Duration
		wantErr       error
	}{
		{name: "ztunnel request", req: &capb.IstioCertificateRequest{Csr: string(csr), ValidityDuration: 86400,
			Metadata: meta(map[string]*structpb.Value{ImpersonatedIdentityKey: structpb.NewStringValue(web.String())})},
			wantRequested: web, wantTTL: 24 * time.Hour},
		{name: "own identity, default ttl", req: &capb.IstioCertificateRequest{Csr: string(csr)}},
		{name: "empty impersonated identity means own", req: &capb.IstioCertificateRequest{Csr: string(csr),
			Metadata: meta(map[string]*structpb.Value{ImpersonatedIdentityKey: structpb.NewStringValue("")})}},
		{name: "unknown metadata ignored", req: &capb.IstioCertificateRequest{Csr: string(csr),
			Metadata: meta(map[string]*structpb.Value{"CertSigner": structpb.NewStringValue("x")})}},
		{name: "negative ttl means default", req: &capb.IstioCertificateRequest{Csr: string(csr), ValidityDuration: -5}},
		{name: "huge ttl saturates", req: &capb.IstioCertificateRequest{Csr: string(csr), ValidityDuration: math.MaxInt64}, wantTTL: math.MaxInt64},
		{name: "impersonated identity not a string", req: &capb.IstioCertificateRequest{Csr: string(csr),
			Metadata: meta(map[string]*structpb.Value{ImpersonatedIdentityKey: structpb.NewNumberValue(1)})}, wantErr: errInvalidRequest},
		{name: "impersonated identity not a SPIFFE ID", req: &capb.IstioCertificateRequest{Csr: string(csr),
			Metadata: meta(map[string]*structpb.Value{ImpersonatedIdentityKey: structpb.NewStringValue("https://x/y")})}, wantErr: errInvalidRequest},
		{name: "empty CSR", req: &capb.IstioCertificateRequest{}, wantErr: ca.ErrInvalidCSR},
		{name: "garbage CSR", req: &capb.IstioCertificateRequest{Csr: "-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n"}, wantErr: ca.ErrInvalidCSR},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseRequest(tt.req)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("parseRequest() error = %v, want %v", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("parseRequest() error = %v", err)
			}
			if got.requested != tt.wantRequested || got.ttl != tt.wantTTL || got.csr == nil {
				t.Fatalf("parseRequest() = %v %v, want %v %v", got.requested, got.ttl, tt.wantRequested, tt.wantTTL)
			}
		})
	}
}

func TestBearerToken(t *testing.T) {
	tests := []struct {
		name string
		md   metadata.MD
		want string
	}{
		{name: "bearer", md: metadata.Pairs("authorization", "Bearer abc.def.ghi"), want: "abc.def.ghi"},
		{name: "scheme is case-insensitive", md: metadata.Pairs("authorization", "bearer abc"), want: "abc"},
		{name: "two values are refused", md: metadata.Pairs("authorization", "Bearer b1", "authorization", "Bearer b2")},
		{name: "another scheme beside a bearer is refused", md: metadata.Pairs("authorization", "Basic x", "authorization", "Bearer b1")},
		{name: "missing header", md: metadata.MD{}},
		{name: "other scheme", md: metadata.Pairs("authorization", "Basic abc")},
		{name: "empty token", md: metadata.Pairs("authorization", "Bearer   ")},
		{name: "oversized token", md: metadata.Pairs("authorization", "Bearer "+strings.Repeat("a", authz.MaxTokenSize+1))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := bearerToken(tt.md.Get("authorization"))
			if tt.want == "" {
				if !errors.Is(err, authz.ErrUnauthenticated) {
					t.Fatalf("bearerToken() = %q, %v; want unauthenticated", got, err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("bearerToken() = %q, %v; want %q", got, err, tt.want)
			}
		})
	}
}

// FuzzParseRequest feeds arbitrary CSRs, lifetimes and impersonated
// identities: parsing never panics, and what it accepts is consistent.
func FuzzParseRequest(f *testing.F) {
	web := spiffeid.RequireFromString("spiffe://cluster.local/ns/demo/sa/web")
	csr, _ := testca.ZtunnelCSR(f, web)
	f.Add(string(csr), int64(86400), web.String())
	f.Add(string(csr), int64(-1), "")
	f.Add("", int64(0), "spiffe://")
	f.Add("-----BEGIN CERTIFICATE REQUEST-----\n\n-----END CERTIFICATE REQUEST-----", int64(math.MaxInt64), "spiffe://a/b/../c")
	f.Fuzz(func(t *testing.T, csr string, ttl int64, impersonated string) {
		req := &capb.IstioCertificateRequest{Csr: csr, ValidityDuration: ttl,
			Metadata: meta(map[string]*structpb.Value{ImpersonatedIdentityKey: structpb.NewStringValue(impersonated)})}
		p, err := parseRequest(req)
		if err != nil {
			if !errors.Is(err, ca.ErrInvalidCSR) && !errors.Is(err, errInvalidRequest) {
				t.Fatalf("parseRequest() error %v is neither an invalid CSR nor an invalid request", err)
			}
			return
		}
		if p.csr == nil || p.ttl < 0 || (impersonated != "" && p.requested.String() != impersonated) {
			t.Fatalf("parseRequest() accepted inconsistent result %+v", p)
		}
	})
}

// TestClusterOf: the clusterid header picks the cluster whose checks
// decide the request: the local one, a remote one (only once it is ready),
// or none.
func TestClusterOf(t *testing.T) {
	east := &fakeRemote{}
	notReady := &fakeRemote{ready: fmt.Errorf("%w: not indexed", authz.ErrUnavailable)}
	remotes := func(id string) (RemoteCluster, bool) {
		switch id {
		case "east":
			return east, true
		case "west":
			return notReady, true
		}
		return nil, false
	}
	tests := []struct {
		name      string
		md        metadata.MD
		local     string
		remote    func(string) (RemoteCluster, bool)
		want      string // the cluster picked
		wantAuthn *fakeRemote
		wantErr   error
	}{
		{name: "no cluster configured accepts any", md: metadata.Pairs(ClusterIDKey, "east"), want: ""},
		{name: "our cluster", md: metadata.Pairs(ClusterIDKey, "Kubernetes"), local: "Kubernetes", want: "Kubernetes"},
		{name: "no header", md: metadata.MD{}, local: "Kubernetes", want: "Kubernetes"},
		{name: "another cluster", md: metadata.Pairs(ClusterIDKey, "east"), local: "Kubernetes", wantErr: authz.ErrUnauthenticated},
		{name: "ours and another", md: metadata.Pairs(ClusterIDKey, "Kubernetes", ClusterIDKey, "east"), local: "Kubernetes", wantErr: authz.ErrUnauthenticated},
		{name: "empty value is another cluster", md: metadata.Pairs(ClusterIDKey, ""), local: "Kubernetes", remote: remotes, wantErr: authz.ErrUnauthenticated},
		{name: "a remote cluster decides its callers", md: metadata.Pairs(ClusterIDKey, "east"), local: "Kubernetes", remote: remotes, want: "east", wantAuthn: east},
		{name: "a remote cluster not ready is unavailable", md: metadata.Pairs(ClusterIDKey, "west"), local: "Kubernetes", remote: remotes, want: "west", wantErr: authz.ErrUnavailable},
		{name: "a cluster neither local nor remote", md: metadata.Pairs(ClusterIDKey, "north"), local: "Kubernetes", remote: remotes, wantErr: authz.ErrUnauthenticated},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			local := &fakeRemote{}
			s := &Service{authn: local, authz: local, clusterID: tt.local, remote: tt.remote}
			c, err := s.clusterOf(tt.md.Get(ClusterIDKey))
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("clusterOf() = %v, want %v", err, tt.wantErr)
				}
				return
			}
			want := tt.wantAuthn
			if want == nil {
				want = local
			}
			if err != nil || c.id != tt.want || c.authn != Authenticator(want) || c.authz != Authorizer(want) {
				t.Fatalf("clusterOf() = %q (local checks: %v), %v; want %q", c.id, c.authn == Authenticator(local), err, tt.want)
			}
		})
	}
}

type fakeRemote struct{ ready error }

func (f *fakeRemote) Authenticate(context.Context, string) (authz.Caller, error) {
	return authz.Caller{}, nil
}

func (f *fakeRemote) Authorize(context.Context, authz.Caller, spiffeid.ID) (spiffeid.ID, error) {
	return spiffeid.ID{}, nil
}

func (f *fakeRemote) Ready() error { return f.ready }
