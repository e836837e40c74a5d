package e2e_test

import (
	"testing"
	"time"

	"github.com/workload-ca/workload-ca/e2e/cahost"
)

// TestLifecycleShutdown stops the leader of two replicas while a client
// that has never called it connects: during --shutdown-delay the stopping
// replica still serves new connections and reviews new tokens, while it has
// already handed the lease over; then it exits cleanly.
func TestLifecycleShutdown(t *testing.T) {
	f := newLCFixture(t, "shutdown")
	tokens := f.ztunnels(t, 2)
	cas := f.startN(t, 2, "--shutdown-delay", "4s",
		"--leader-election-lease-duration", "3s", "--leader-election-renew-deadline", "2s", "--leader-election-retry-period", "500ms")
	leader := theLeader(t, cas)
	stopping, other := cas[leader], cas[1-leader]

	began := time.Now()
	stopped := make(chan error, 1)
	go func() { stopped <- stopping.Stop() }()
	waitLogLines(t, stopping, `"msg":"stopped leading"`)

	// A new client, with a token never reviewed, asks the stopping replica
	// after SIGTERM (it has logged its hand-over): its new connection is
	// accepted only because of the delay.
	res, err := stopping.Request(t.Context(), cahost.RequestArgs{Token: tokens[0], Identity: id("demo", "web"), Impersonate: true})
	if err != nil {
		t.Fatalf("a request during the shutdown delay, %v after SIGTERM: %v", time.Since(began), err)
	}
	if res.SPIFFEID != id("demo", "web") {
		t.Errorf("issued %s", res.SPIFFEID)
	}
	// Meanwhile the other replica has taken the lease.
	if err := pollUntil(t, lcWait, func() (bool, error) { return isLeader(t.Context(), other) }); err != nil {
		t.Errorf("the other replica did not take over during the shutdown delay: %v", err)
	}
	if err := <-stopped; err != nil {
		t.Errorf("the stopping replica: %v", err)
	}
	if took := time.Since(began); took < 4*time.Second {
		t.Errorf("stopped %v after SIGTERM, before the shutdown delay", took)
	}
	// And the other serves the second new client.
	if _, err := other.Request(t.Context(), cahost.RequestArgs{Token: tokens[1], Identity: id("demo", "api"), Impersonate: true}); err != nil {
		t.Errorf("the remaining replica: %v", err)
	}
}
