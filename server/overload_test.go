package server_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/workload-ca/workload-ca/ca"
	"github.com/workload-ca/workload-ca/internal/testca"
	"github.com/workload-ca/workload-ca/issuance"
	"github.com/workload-ca/workload-ca/proto/capb"
	"github.com/workload-ca/workload-ca/server"
)

// heldSigner signs once release is closed, telling held when a signature
// is waiting.
type heldSigner struct {
	issuance.Signer
	held    chan struct{}
	release chan struct{}
}

func (h heldSigner) Sign(ctx context.Context, r ca.Request) (*ca.Issued, error) {
	h.held <- struct{}{}
	<-h.release
	return h.Signer.Sign(ctx, r)
}

// TestOverloadRefusalSaysWhenToComeBack: with the only signing slot held
// and node-a's one queue place taken, node-a's next request is refused at
// once with Unavailable, a grpc-retry-pushback-ms trailer and a RetryInfo
// detail; the refusals get one summary audit record, not one each, while
// the issued requests keep theirs.
func TestOverloadRefusalSaysWhenToComeBack(t *testing.T) {
	signer := heldSigner{held: make(chan struct{}, 4), release: make(chan struct{})}
	e := newEnv(t, testca.NewRoot(t, testca.P256).Material(), func(c *envConfig) {
		c.wrapSigner = func(s issuance.Signer) issuance.Signer { signer.Signer = s; return signer }
		c.service = func(cfg *server.Config) { cfg.MaxConcurrentSigns, cfg.MaxQueuedPerNode = 1, 1 }
	})
	client := capb.NewIstioCertificateServiceClient(e.conn(t))
	req := ztunnelRequest(t)
	ctx := withToken(ctxT(t), "ztunnel-token") // a node agent on node-a
	done := make(chan error, 2)
	go func() { _, err := client.CreateCertificate(ctx, req); done <- err }()
	<-signer.held // the slot is taken
	// The first request may still count as queued for its signing step
	// for a moment after the step started.
	waitFor(t, "the first request out of the queue", func() bool { return e.svc.Queued() == 0 })
	go func() { _, err := client.CreateCertificate(ctx, req); done <- err }()
	waitFor(t, "a request queued", func() bool { return e.svc.Queued() == 1 })

	const refused = 5
	for range refused {
		var trailer metadata.MD
		start := time.Now()
		_, err := client.CreateCertificate(ctx, req, grpc.Trailer(&trailer))
		st := status.Convert(err)
		if st.Code() != codes.Unavailable || time.Since(start) > 5*time.Second {
			t.Fatalf("CreateCertificate() = %v after %v, want Unavailable at once", err, time.Since(start))
		}
		ms, perr := strconv.Atoi(firstOf(trailer.Get("grpc-retry-pushback-ms")))
		if perr != nil || ms <= 0 {
			t.Errorf("grpc-retry-pushback-ms = %q, want a positive number of milliseconds", trailer.Get("grpc-retry-pushback-ms"))
		}
		var info *errdetails.RetryInfo
		for _, d := range st.Details() {
			if ri, ok := d.(*errdetails.RetryInfo); ok {
				info = ri
			}
		}
		if info == nil || info.GetRetryDelay().AsDuration() != time.Duration(ms)*time.Millisecond {
			t.Errorf("details %v, want a RetryInfo of %dms", st.Details(), ms)
		}
	}
	close(signer.release)
	for range 2 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	if got := len(auditRecords(t, e.audit)); got != 2 {
		t.Fatalf("%d audit records before the summary, want the 2 issued ones:\n%s", got, e.audit.String())
	}
	e.svc.FlushAudit()
	records := auditRecords(t, e.audit)
	if len(records) != 3 {
		t.Fatalf("%d audit records after the summary, want 3:\n%s", len(records), e.audit.String())
	}
	sum := records[2]
	if sum["msg"] != "certificate requests refused (summary)" || sum["count"] != float64(refused) ||
		sum["reason"] != "overloaded" || sum["caller"] != "istio-system/ztunnel" || sum["node"] != "node-a" {
		t.Errorf("summary record = %v, want %d overloaded refusals of istio-system/ztunnel on node-a", sum, refused)
	}
	if got := e.obs.count("unavailable/overloaded"); got != refused {
		t.Errorf("observer counted %d overloaded refusals, want %d", got, refused)
	}
	e.svc.FlushAudit()
	if got := len(auditRecords(t, e.audit)); got != 3 {
		t.Errorf("a second flush wrote %d more records, want none", got-3)
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func firstOf(v []string) string {
	if len(v) == 0 {
		return ""
	}
	return v[0]
}
