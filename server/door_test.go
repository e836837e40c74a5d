package server

import (
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/workload-ca/workload-ca/internal/testlog"
)

// A panic in a gRPC handler that did not recover it itself (health, and
// any handler added later) answers Internal with nothing of the panic or
// the server's stack; the log has both.
func TestPanicInAHandlerAnswersInternal(t *testing.T) {
	var logs testlog.Buffer
	intercept := recovery.UnaryServerInterceptor(recovery.WithRecoveryHandler(recoverPanic(slog.New(slog.NewJSONHandler(&logs, nil)))))
	resp, err := intercept(context.Background(), nil, &grpc.UnaryServerInfo{FullMethod: "/grpc.health.v1.Health/Check"},
		func(context.Context, any) (any, error) { panicInHandler(); return nil, nil })
	if resp != nil || status.Code(err) != codes.Internal || status.Convert(err).Message() != "internal error" {
		t.Fatalf("= %v, %v; want nil, Internal \"internal error\"", resp, err)
	}
	out := logs.String()
	if !strings.Contains(out, "handler exploded") || !strings.Contains(out, "panicInHandler") {
		t.Errorf("log has not the panic and its stack:\n%s", out)
	}
}

func panicInHandler() { panic("handler exploded") }
