package server_test

import (
	"log/slog"
	"sync/atomic"
	"syscall"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

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
		c.service = func(cfg *server.Config) { cfg.Audit = slog.New(slog.NewJSONHandler(disk, nil)) }
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
