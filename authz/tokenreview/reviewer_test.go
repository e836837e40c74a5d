package tokenreview

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	authnv1 "k8s.io/api/authentication/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	testclock "k8s.io/utils/clock/testing"

	"github.com/workload-ca/workload-ca/authz"
)

func TestAuthenticate(t *testing.T) {
	exp := testEpoch().Add(time.Hour)
	token := tokenExpiringAt(t, exp)
	withStatus := func(edit func(*authnv1.TokenReviewStatus)) respondFunc {
		st := webPod()
		edit(&st)
		return always(st)
	}
	tests := []struct {
		name      string
		token     string
		respond   respondFunc
		want      authz.Caller
		wantErr   error
		wantText  string
		wantCalls int32
	}{{
		name:    "pod-bound token",
		token:   token,
		respond: always(webPod()),
		want: authz.Caller{Namespace: "apps", ServiceAccount: "web", PodName: "web-0", PodUID: "uid-web-0",
			NodeName: "node-a", ExpiresAt: exp},
		wantCalls: 1,
	}, {
		name:      "token not bound to a pod",
		token:     token,
		respond:   withStatus(func(st *authnv1.TokenReviewStatus) { st.User.Extra = nil }),
		want:      authz.Caller{Namespace: "apps", ServiceAccount: "web", ExpiresAt: exp},
		wantCalls: 1,
	}, {
		name:    "token without exp",
		token:   makeJWT(t, map[string]any{"sub": "x"}),
		respond: always(webPod()),
		want: authz.Caller{Namespace: "apps", ServiceAccount: "web", PodName: "web-0", PodUID: "uid-web-0",
			NodeName: "node-a"},
		wantCalls: 1,
	}, {
		name:      "audience not confirmed",
		token:     token,
		respond:   withStatus(func(st *authnv1.TokenReviewStatus) { st.Audiences = []string{"other"} }),
		wantErr:   authz.ErrUnauthenticated,
		wantText:  `token audiences ["other"] include none of ["istio-ca"]`,
		wantCalls: 1,
	}, {
		name:      "apiserver audience only",
		token:     token,
		respond:   withStatus(func(st *authnv1.TokenReviewStatus) { st.Audiences = nil }),
		wantErr:   authz.ErrUnauthenticated,
		wantText:  "include none of",
		wantCalls: 1,
	}, {
		name:      "not authenticated",
		token:     token,
		respond:   always(rejected("service account token has been invalidated")),
		wantErr:   authz.ErrUnauthenticated,
		wantText:  "token not authenticated: service account token has been invalidated",
		wantCalls: 1,
	}, {
		name:      "not authenticated without reason",
		token:     token,
		respond:   always(rejected("")),
		wantErr:   authz.ErrUnauthenticated,
		wantText:  "no reason given",
		wantCalls: 1,
	}, {
		name:      "node username",
		token:     token,
		respond:   withStatus(func(st *authnv1.TokenReviewStatus) { st.User.Username = "system:node:node-a" }),
		wantErr:   authz.ErrUnauthenticated,
		wantText:  `username "system:node:node-a" is not a service account`,
		wantCalls: 1,
	}, {
		name:      "service account username without name",
		token:     token,
		respond:   withStatus(func(st *authnv1.TokenReviewStatus) { st.User.Username = "system:serviceaccount:apps" }),
		wantErr:   authz.ErrUnauthenticated,
		wantText:  "want system:serviceaccount:<namespace>:<name>",
		wantCalls: 1,
	}, {
		name:      "service account username with extra colon",
		token:     token,
		respond:   withStatus(func(st *authnv1.TokenReviewStatus) { st.User.Username = "system:serviceaccount:apps:web:x" }),
		wantErr:   authz.ErrUnauthenticated,
		wantText:  "want system:serviceaccount:<namespace>:<name>",
		wantCalls: 1,
	}, {
		name:      "invalid namespace",
		token:     token,
		respond:   withStatus(func(st *authnv1.TokenReviewStatus) { st.User.Username = "system:serviceaccount:Apps/x:web" }),
		wantErr:   authz.ErrUnauthenticated,
		wantText:  "invalid namespace",
		wantCalls: 1,
	}, {
		name:  "two pod names",
		token: token,
		respond: withStatus(func(st *authnv1.TokenReviewStatus) {
			st.User.Extra[extraPodName] = authnv1.ExtraValue{"a", "b"}
		}),
		wantErr:   authz.ErrUnauthenticated,
		wantText:  "authentication.kubernetes.io/pod-name has 2 values, want 1",
		wantCalls: 1,
	}, {
		name:      "pod name without pod uid",
		token:     token,
		respond:   withStatus(func(st *authnv1.TokenReviewStatus) { delete(st.User.Extra, extraPodUID) }),
		wantErr:   authz.ErrUnauthenticated,
		wantText:  `pod name "web-0" but pod uid ""`,
		wantCalls: 1,
	}, {
		name:  "API error",
		token: token,
		respond: func(int) (authnv1.TokenReviewStatus, error) {
			return authnv1.TokenReviewStatus{}, apierrors.NewServiceUnavailable("etcd is sad")
		},
		wantErr:   authz.ErrUnavailable,
		wantText:  "token review: etcd is sad",
		wantCalls: 1,
	},
		{name: "empty token", token: "", wantErr: authz.ErrUnauthenticated, wantText: "empty bearer token"},
		{name: "garbage token", token: "hunter2", wantErr: authz.ErrUnauthenticated, wantText: "not a JWT"},
		{name: "oversized token", token: strings.Repeat("A", 9000) + ".b.c",
			wantErr: authz.ErrUnauthenticated, wantText: "exceeds"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			respond := tc.respond
			if respond == nil {
				respond = always(webPod())
			}
			api := newFakeAPI(respond)
			r := newReviewer(t, Config{Client: api.AuthenticationV1(), Clock: testclock.NewFakeClock(testEpoch())})
			got, err := r.Authenticate(t.Context(), tc.token)
			checkResult(t, got, err, tc.want, tc.wantErr, tc.wantText)
			if n := api.calls.Load(); n != tc.wantCalls {
				t.Errorf("API calls = %d, want %d", n, tc.wantCalls)
			}
			if err != nil && tc.token != "" && strings.Contains(err.Error(), tc.token) {
				t.Errorf("error text contains the token: %v", err)
			}
		})
	}
}

func checkResult(t *testing.T, got authz.Caller, err error, want authz.Caller, wantErr error, wantText string) {
	t.Helper()
	if wantErr == nil {
		if err != nil {
			t.Fatalf("Authenticate: %v", err)
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Fatalf("caller (-want +got):\n%s", diff)
		}
		return
	}
	if !errors.Is(err, wantErr) || !strings.Contains(err.Error(), wantText) {
		t.Fatalf("Authenticate error = %v; want %v containing %q", err, wantErr, wantText)
	}
	if got != (authz.Caller{}) {
		t.Fatalf("caller %+v returned with error", got)
	}
}

func TestAuthenticateSendsTokenAndAudiences(t *testing.T) {
	token := tokenExpiringAt(t, testEpoch().Add(time.Hour))
	for _, tc := range []struct {
		name      string
		audiences []string
		want      []string
	}{
		{"default audience", nil, []string{"istio-ca"}},
		{"configured audiences", []string{"a", "istio-ca"}, []string{"a", "istio-ca"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			api := newFakeAPI(always(webPod()))
			r := newReviewer(t, Config{Client: api.AuthenticationV1(), Audiences: tc.audiences})
			if _, err := r.Authenticate(t.Context(), token); err != nil {
				t.Fatal(err)
			}
			want := authnv1.TokenReviewSpec{Token: token, Audiences: tc.want}
			if diff := cmp.Diff(want, api.lastSpec()); diff != "" {
				t.Fatalf("TokenReview spec (-want +got):\n%s", diff)
			}
		})
	}
}

func TestAPIErrorChainKept(t *testing.T) {
	api := newFakeAPI(func(int) (authnv1.TokenReviewStatus, error) {
		return authnv1.TokenReviewStatus{}, apierrors.NewForbidden(authnv1.Resource("tokenreviews"), "", errors.New("RBAC"))
	})
	r := newReviewer(t, Config{Client: api.AuthenticationV1()})
	_, err := r.Authenticate(t.Context(), tokenExpiringAt(t, time.Now().Add(time.Hour)))
	if !errors.Is(err, authz.ErrUnavailable) || !apierrors.IsForbidden(err) {
		t.Fatalf("error = %v; want ErrUnavailable wrapping a Forbidden API error", err)
	}
}

func TestNewValidates(t *testing.T) {
	api := newFakeAPI(always(webPod()))
	for _, tc := range []struct {
		name string
		cfg  Config
	}{
		{"no client", Config{}},
		{"negative cache size", Config{Client: api.AuthenticationV1(), CacheSize: -1}},
		{"negative review timeout", Config{Client: api.AuthenticationV1(), ReviewTimeout: -time.Second}},
		{"empty audience", Config{Client: api.AuthenticationV1(), Audiences: []string{"istio-ca", ""}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := New(tc.cfg); err == nil {
				t.Fatal("New accepted an invalid config")
			}
		})
	}
}

func TestAPIErrorRedactsToken(t *testing.T) {
	token := tokenExpiringAt(t, testEpoch().Add(time.Hour))
	api := newFakeAPI(func(int) (authnv1.TokenReviewStatus, error) {
		return authnv1.TokenReviewStatus{}, errors.New("cannot decode body {\"token\":\"" + token + "\"}")
	})
	r := newReviewer(t, Config{Client: api.AuthenticationV1()})
	_, err := r.Authenticate(t.Context(), token)
	if !errors.Is(err, authz.ErrUnavailable) || strings.Contains(err.Error(), token) ||
		!strings.Contains(err.Error(), "<token>") {
		t.Fatalf("error = %v; want ErrUnavailable with the token redacted", err)
	}
}
