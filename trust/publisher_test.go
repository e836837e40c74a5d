package trust

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"

	"github.com/workload-ca/workload-ca/internal/testlog"
	"github.com/workload-ca/workload-ca/internal/testobs"
	"github.com/workload-ca/workload-ca/internal/testwait"
)

// listTarget reconciles fixed keys with fixed outcomes, and counts them.
type listTarget struct {
	queue    workqueue.TypedRateLimitingInterface[string]
	outcomes map[string]error
	mu       sync.Mutex
	done     map[string]int
}

func (l *listTarget) Queue() workqueue.TypedRateLimitingInterface[string] { return l.queue }
func (l *listTarget) Informers() []cache.Controller                       { return nil }
func (l *listTarget) Keys() []string {
	keys := make([]string, 0, len(l.outcomes))
	for k := range l.outcomes {
		keys = append(keys, k)
	}
	return keys
}
func (l *listTarget) Reconcile(_ context.Context, key string) (string, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.done[key]++
	switch err := l.outcomes[key]; {
	case errors.Is(err, ErrRequeue):
		return ResultRequeued, err
	case err != nil:
		return ResultError, err
	}
	return ResultUnchanged, nil
}
func (l *listTarget) count(key string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.done[key]
}

func TestPublisherRun(t *testing.T) {
	logs := &testlog.Buffer{}
	obs := &testobs.Results{}
	opts, err := Options{TrustDomain: spiffeid.RequireTrustDomainFromString("example.org"),
		Roots: func() []*x509.Certificate { return nil }, Observer: obs,
		Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))}.WithDefaults()
	if err != nil {
		t.Fatal(err)
	}
	p := NewPublisher(Kind{Name: "Thing", Key: "namespace"}, opts)
	target := &listTarget{queue: NewQueue(clock.RealClock{}), done: map[string]int{},
		outcomes: map[string]error{"ok": nil, "raced": fmt.Errorf("%w: edited", ErrRequeue), "broken": errors.New("boom")}}

	if err := p.Run(t.Context(), func(context.Context) (Target, error) { return nil, errors.New("not allowed") }); err == nil || err.Error() != "not allowed" {
		t.Fatalf("Run with a failing start = %v; want its error", err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx, func(context.Context) (Target, error) { return target, nil }) }()
	testwait.Eventually(t, "every key reconciled", func() bool { return target.count("ok") == 1 && target.count("raced") > 0 && target.count("broken") > 0 })
	if err := p.Run(t.Context(), func(context.Context) (Target, error) { return target, nil }); err == nil || !strings.Contains(err.Error(), "already running") {
		t.Fatalf("second Run = %v; want already running", err)
	}
	p.Trigger()
	testwait.Eventually(t, "Trigger to reconcile every key again", func() bool { return target.count("ok") == 2 })
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run = %v after ctx ended; want nil", err)
	}
	if obs.Count(ResultUnchanged) < 2 || obs.Count(ResultRequeued) == 0 || obs.Count(ResultError) == 0 {
		t.Errorf("results: %d unchanged, %d requeued, %d error; want unchanged twice, requeued and error reported",
			obs.Count(ResultUnchanged), obs.Count(ResultRequeued), obs.Count(ResultError))
	}
	out := logs.String()
	if !strings.Contains(out, `level=ERROR msg="publishing Thing failed, will retry" namespace=broken`) {
		t.Errorf("a failed reconcile is not logged as an error:\n%s", out)
	}
	if !strings.Contains(out, `level=DEBUG msg="Thing changed while publishing, will retry" namespace=raced`) ||
		strings.Contains(out, `level=ERROR msg="publishing Thing failed, will retry" namespace=raced`) {
		t.Errorf("a lost race is not logged at debug level only:\n%s", out)
	}
}
