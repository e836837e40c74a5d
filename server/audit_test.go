package server_test

import (
	"fmt"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/workload-ca/workload-ca/authz"
	"github.com/workload-ca/workload-ca/caclient"
	"github.com/workload-ca/workload-ca/internal/testca"
	"github.com/workload-ca/workload-ca/proto/capb"
	"github.com/workload-ca/workload-ca/server"
)

// fullDisk fails every write with ENOSPC while full is set.
type fullDisk struct {
	full    atomic.Bool
	written atomic.Int32
}

func (d *fullDisk) Write(p []byte) (int, error) {
	if d.full.Load() {
		return 0, &errnoWrite{syscall.ENOSPC}
	}
	d.written.Add(1)
	return len(p), nil
}

type errnoWrite struct{ errno syscall.Errno }

func (e *errnoWrite) Error() string { return "write audit.log: " + e.errno.Error() }
func (e *errnoWrite) Unwrap() error { return e.errno }

// With the audit log unwritable (its disk full), the CA fails closed: a
// request it would issue is answered Unavailable, without the
// certificate, since nobody could account for it; refusals are still
// answered as before. Once the log can be written again, certificates
// are issued, each with its record.
func TestAuditLogUnwritableFailsClosed(t *testing.T) {
	disk := &fullDisk{}
	e := newEnv(t, testca.NewRoot(t, testca.P256).Material(), func(c *envConfig) {
		c.auditTo = disk
	})
	client := capb.NewIstioCertificateServiceClient(e.conn(t))
	req := ztunnelRequest(t)
	disk.full.Store(true)
	for range 3 {
		resp, err := client.CreateCertificate(withToken(ctxT(t), "ztunnel-token"), req)
		if status.Code(err) != codes.Unavailable || resp != nil {
			t.Fatalf("with the audit log full: %v, %v; want Unavailable and no certificate", resp, err)
		}
	}
	if _, err := client.CreateCertificate(withToken(ctxT(t), "no-such-token"), req); status.Code(err) != codes.Unauthenticated {
		t.Errorf("a bad token with the audit log full: %v, want Unauthenticated", err)
	}
	if got := e.obs.count("issued/"); got != 0 {
		t.Errorf("observer counted %d issued with the audit log full, want 0", got)
	}
	if got := e.obs.count("unavailable/"); got != 3 {
		t.Errorf("observer counted %d unavailable, want 3", got)
	}
	disk.full.Store(false)
	if _, err := client.CreateCertificate(withToken(ctxT(t), "ztunnel-token"), req); err != nil {
		t.Fatalf("after the disk has room again: %v", err)
	}
	if disk.written.Load() != 1 {
		t.Errorf("%d records written once the disk had room, want the issuance's", disk.written.Load())
	}
}

// notReadyCluster is a remote cluster that cannot decide yet.
type notReadyCluster struct{ server.RemoteCluster }

func (notReadyCluster) Ready() error { return fmt.Errorf("%w: not indexed yet", authz.ErrUnavailable) }

// summaries are the refusal summaries written by one flush, by their
// records' position after the records already in b.
func flushedSummaries(t *testing.T, e *env) []map[string]any {
	t.Helper()
	before := 0
	if e.audit.String() != "" {
		before = len(auditRecords(t, e.audit))
	}
	e.svc.FlushAudit()
	if e.audit.String() == "" {
		return nil
	}
	return auditRecords(t, e.audit)[before:]
}

// Callers who do not authenticate (no token, a token nobody issued, a
// cluster the CA does not serve) get no audit record each, which anyone
// who can reach the port could use to fill the audit volume and so stop
// every issuance: they are counted into one summary record per cluster,
// result and code and interval. Issued and denied requests keep one
// record each.
func TestUnauthenticatedRefusalsSummarized(t *testing.T) {
	e := newEnv(t, testca.NewRoot(t, testca.P256).Material())
	c := e.client(t)
	web := spiffeid.RequireFromString("spiffe://cluster.local/ns/demo/sa/web")
	refused := []caclient.Request{
		{Identity: web},
		{Token: "no-such-token", Identity: web},
		{Token: "no-such-token", Identity: web, Impersonate: true},
		{Token: "ztunnel-token", Identity: web, Impersonate: true, ClusterID: "east"},
		{Token: "ztunnel-token", Identity: web, Impersonate: true, ClusterID: "north"},
	}
	const rounds = 20
	for range rounds {
		for _, r := range refused {
			if _, err := c.CreateCertificate(ctxT(t), r); status.Code(err) != codes.Unauthenticated {
				t.Fatalf("%+v: %v, want Unauthenticated", r, err)
			}
		}
	}
	if got := e.audit.String(); got != "" {
		t.Fatalf("%d unauthenticated refusals wrote records of their own:\n%.2000s", rounds*len(refused), got)
	}
	if got := e.obs.count("unauthenticated/"); got != rounds*len(refused) {
		t.Errorf("observer counted %d unauthenticated, want %d", got, rounds*len(refused))
	}
	if _, err := c.CreateCertificate(ctxT(t), caclient.Request{Token: "ztunnel-token", Identity: web, Impersonate: true}); err != nil {
		t.Fatal(err)
	}
	db := spiffeid.RequireFromString("spiffe://cluster.local/ns/demo/sa/db")
	if _, err := c.CreateCertificate(ctxT(t), caclient.Request{Token: "ztunnel-token", Identity: db, Impersonate: true}); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("want PermissionDenied, got %v", err)
	}
	if got := auditRecords(t, e.audit); len(got) != 2 || got[0]["decision"] != "issued" || got[1]["decision"] != "denied" {
		t.Fatalf("records before the summary: %v, want one issued and one denied", got)
	}
	sums := flushedSummaries(t, e)
	// The local cluster's (no token, an unknown token) and those that
	// named a cluster the CA does not serve.
	counts := map[string]float64{}
	for _, s := range sums {
		if s["msg"] != "certificate requests refused (summary)" || s["decision"] != "unauthenticated" || s["code"] != "Unauthenticated" {
			t.Errorf("summary %v", s)
		}
		cl, _ := s["cluster"].(string)
		counts[cl] += s["count"].(float64)
	}
	want := map[string]float64{caclient.DefaultClusterID: 3 * rounds, "": 2 * rounds}
	if fmt.Sprint(counts) != fmt.Sprint(want) || len(sums) != 2 {
		t.Errorf("%d summaries counting %v by cluster, want 2 counting %v:\n%s", len(sums), counts, want, e.audit.String())
	}
}

// The strings a caller chooses are clipped in audit records: a 16 KiB
// clusterid header (the most the transport lets through) leaves at most
// 128 bytes of itself, marked as cut, in the summary that tells of it; an
// 8 KiB requested identity at most the 2 KiB a SPIFFE ID may have, in the
// record of its denial and in its error.
func TestAuditHeaderValuesTruncated(t *testing.T) {
	long := "east-" + strings.Repeat("x", 16<<10)
	longID := spiffeid.RequireFromString("spiffe://cluster.local/ns/demo/sa/" + strings.Repeat("x", 8<<10))
	tests := []struct {
		name    string
		req     caclient.Request
		want    codes.Code
		field   string // of the record that tells of it
		maxSize int    // of that record
	}{
		{"a long clusterid header", caclient.Request{Token: "ztunnel-token", Identity: longID, Impersonate: true, ClusterID: long},
			codes.Unauthenticated, "sample_error", 1500},
		{"two clusterid headers, one long", caclient.Request{Token: "ztunnel-token", Identity: longID, Impersonate: true,
			ClusterID: caclient.DefaultClusterID + "\x00" + long}, codes.Unauthenticated, "sample_error", 1500},
		{"a long requested identity", caclient.Request{Token: "ztunnel-token", Identity: longID, Impersonate: true},
			codes.PermissionDenied, "requested", 6000},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, testca.NewRoot(t, testca.P256).Material())
			c := capb.NewIstioCertificateServiceClient(e.conn(t))
			ctx := withToken(ctxT(t), tc.req.Token)
			if tc.req.ClusterID != "" {
				for v := range strings.SplitSeq(tc.req.ClusterID, "\x00") {
					ctx = metadata.AppendToOutgoingContext(ctx, server.ClusterIDKey, v)
				}
			}
			csr, _ := testca.ZtunnelCSR(t, tc.req.Identity)
			req := &capb.IstioCertificateRequest{Csr: string(csr), Metadata: &structpb.Struct{Fields: map[string]*structpb.Value{
				server.ImpersonatedIdentityKey: structpb.NewStringValue(tc.req.Identity.String())}}}
			if _, err := c.CreateCertificate(ctx, req); status.Code(err) != tc.want {
				t.Fatalf("CreateCertificate() = %v, want %v", err, tc.want)
			}
			e.svc.FlushAudit()
			records := auditRecords(t, e.audit)
			if len(records) != 1 {
				t.Fatalf("%d records, want 1:\n%.3000s", len(records), e.audit.String())
			}
			v, _ := records[0][tc.field].(string)
			if !strings.Contains(v, "…[cut: ") {
				t.Errorf("%s = %.300q…, want it cut, with a marker", tc.field, v)
			}
			if n := len(e.audit.String()); n > tc.maxSize {
				t.Errorf("the record is %d bytes, want at most %d:\n%.3000s", n, tc.maxSize, e.audit.String())
			}
		})
	}
}

// Refusal summaries name the cluster of the refused requests: two remote
// clusters not ready yet are two summaries, each naming its cluster, not
// one that names neither.
func TestRefusalSummaryKeyedByCluster(t *testing.T) {
	e := newEnv(t, testca.NewRoot(t, testca.P256).Material(), func(c *envConfig) {
		c.service = func(cfg *server.Config) {
			cfg.Remote = func(id string) (server.RemoteCluster, bool) {
				return notReadyCluster{}, id == "east" || id == "west"
			}
		}
	})
	c := e.client(t)
	web := spiffeid.RequireFromString("spiffe://cluster.local/ns/demo/sa/web")
	for _, cl := range []string{"east", "west", "west"} {
		if _, err := c.CreateCertificate(ctxT(t), caclient.Request{Token: "t", Identity: web, ClusterID: cl}); status.Code(err) != codes.Unavailable {
			t.Fatalf("cluster %s: %v, want Unavailable", cl, err)
		}
	}
	got := map[string]float64{}
	for _, s := range flushedSummaries(t, e) {
		cl, _ := s["cluster"].(string)
		got[cl] += s["count"].(float64)
	}
	if want := map[string]float64{"east": 1, "west": 2}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("summaries count %v by cluster, want %v:\n%s", got, want, e.audit.String())
	}
}
