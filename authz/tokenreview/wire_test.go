package tokenreview

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	authnv1 "k8s.io/api/authentication/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/workload-ca/workload-ca/authz"
)

// The fake clientset ignores ctx, so these tests use a real client against
// an httptest server to check what goes over the wire.

func realClient(t *testing.T, h http.HandlerFunc) kubernetes.Interface {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	cfg := &rest.Config{Host: srv.URL, ContentConfig: rest.ContentConfig{ContentType: "application/json"}}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

func TestWireTokenReview(t *testing.T) {
	token := tokenExpiringAt(t, time.Now().Add(time.Hour))
	var got authnv1.TokenReview
	cs := realClient(t, func(w http.ResponseWriter, req *http.Request) {
		if req.Method != http.MethodPost || req.URL.Path != "/apis/authentication.k8s.io/v1/tokenreviews" {
			http.Error(w, "unexpected "+req.Method+" "+req.URL.Path, http.StatusNotFound)
			return
		}
		if err := json.NewDecoder(req.Body).Decode(&got); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		resp := got.DeepCopy()
		resp.Status = webPod()
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(resp)
	})
	r := newReviewer(t, Config{Client: cs.AuthenticationV1()})
	c, err := r.Authenticate(t.Context(), token)
	if err != nil {
		t.Fatal(err)
	}
	if c.String() != "apps/web (pod web-0)" || c.NodeName != "node-a" {
		t.Errorf("caller = %+v", c)
	}
	if diff := cmp.Diff(authnv1.TokenReviewSpec{Token: token, Audiences: []string{"istio-ca"}}, got.Spec); diff != "" {
		t.Errorf("spec sent (-want +got):\n%s", diff)
	}
}

// TestWireReviewTimeoutCancelsHTTPRequest: a review that takes longer than
// the review timeout is cancelled on the wire, whatever its waiters do.
func TestWireReviewTimeoutCancelsHTTPRequest(t *testing.T) {
	cancelled, testDone := make(chan struct{}), make(chan struct{})
	cs := realClient(t, func(w http.ResponseWriter, req *http.Request) {
		// Reading the body lets the server notice the client closing the connection.
		_, _ = io.Copy(io.Discard, req.Body)
		select {
		case <-req.Context().Done(): // the client gave up on this request
			close(cancelled)
		case <-testDone:
		}
	})
	t.Cleanup(func() { close(testDone) }) // before the server closes
	r := newReviewer(t, Config{Client: cs.AuthenticationV1(), ReviewTimeout: 100 * time.Millisecond})
	_, err := r.Authenticate(t.Context(), tokenExpiringAt(t, time.Now().Add(time.Hour)))
	if !errors.Is(err, authz.ErrUnavailable) {
		t.Fatalf("error = %v, want ErrUnavailable", err)
	}
	select {
	case <-cancelled:
	case <-time.After(10 * time.Second):
		t.Fatal("the server never saw the request cancelled")
	}
}
