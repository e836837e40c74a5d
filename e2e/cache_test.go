package e2e_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/workload-ca/workload-ca/e2e/cahost"
)

// testTokenReviewCache sends 20 requests (8 at once, then 12 one by one)
// with a ztunnel token the CA has never seen, and counts TokenReviews in
// the audit log: none, since the suite's CA verifies pod-bound tokens
// locally (TestTokenVerificationMatchesTokenReview counts them with
// --token-verification=tokenreview). Audit events at Metadata level do not
// say which token was reviewed, so this runs alone and counts the
// difference.
func (s *suite) testTokenReviewCache(t *testing.T) {
	const concurrent, sequential = 8, 12
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	tok, err := s.mint(ctx, "istio-system/ztunnel-a", audience, 43200)
	if err != nil {
		t.Fatal(err)
	}
	before := s.settledTokenReviews(t)
	args := cahost.RequestArgs{Token: tok, Identity: id("demo", "web"), Impersonate: true}

	var wg sync.WaitGroup
	errs := make([]error, concurrent)
	for i := range concurrent {
		wg.Go(func() { _, errs[i] = s.ca.Request(ctx, args) })
	}
	wg.Wait()
	for range sequential {
		_, err := s.ca.Request(ctx, args)
		errs = append(errs, err)
	}
	for i, err := range errs {
		if err != nil {
			t.Errorf("request %d: %v", i+1, err)
		}
	}

	after := s.settledTokenReviews(t)
	t.Logf("%d requests with one new token: %d TokenReview(s)", concurrent+sequential, after-before)
	if after-before != 0 {
		t.Errorf("%d TokenReviews for %d requests with one token, want none", after-before, concurrent+sequential)
	}
}

// settledTokenReviews returns the number of TokenReviews in the audit log
// once it has stopped growing for 500ms: the apiserver writes an event just
// after its response, so a count taken at once may miss the last ones.
func (s *suite) settledTokenReviews(t *testing.T) int {
	t.Helper()
	last, stableSince := -1, time.Now()
	var n int
	err := pollUntil(t, 10*time.Second, func() (bool, error) {
		var err error
		if n, err = s.cp.CountAudit("create", "tokenreviews"); err != nil {
			return false, err
		}
		if n != last {
			last, stableSince = n, time.Now()
		}
		return time.Since(stableSince) >= 500*time.Millisecond, nil
	})
	if err != nil {
		t.Fatalf("audit log: %v", err)
	}
	return n
}

// testLogsHoldNoToken reads the whole CA log (the CA has stopped) and looks
// for every token the suite handed it, whole or in part.
func (s *suite) testLogsHoldNoToken(t *testing.T) {
	logs := s.ca.Logs()
	if n := strings.Count(logs, "\n"); n < 20 {
		t.Fatalf("the CA logged only %d lines; the check would prove nothing", n)
	}
	n := s.checkNoToken(t, map[string]string{s.ca.LogPath(): logs})
	t.Logf("checked %d tokens against %d log lines", n, strings.Count(logs, "\n"))
}

// secretParts returns the strings of a token that must not be logged: the
// token, and for a JWS its claims and its signature (the header is the
// same for every token of an issuer).
func secretParts(token string) []string {
	parts := []string{token}
	if p := strings.Split(token, "."); len(p) == 3 {
		parts = append(parts, p[1])
		if p[2] != "" {
			parts = append(parts, p[2])
		}
	}
	var long []string
	for _, p := range parts {
		if len(p) >= 8 {
			long = append(long, p)
		}
	}
	return long
}

// pollUntil calls f every 50ms until it reports done, returns an error, or
// timeout passes.
func pollUntil(t *testing.T, timeout time.Duration, f func() (done bool, err error)) error {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		done, err := f()
		switch {
		case err != nil:
			return err
		case done:
			return nil
		case time.Now().After(deadline):
			return fmt.Errorf("not done after %v", timeout)
		}
		select {
		case <-t.Context().Done():
			return t.Context().Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}
