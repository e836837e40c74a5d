package tokenreview

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/workload-ca/workload-ca/authz"
)

func testEpoch() time.Time { return time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC) }

// makeJWT returns a JWT-shaped token with the given claims and a dummy
// signature: only the apiserver (here: a fake) judges it.
func makeJWT(t testing.TB, claims map[string]any) string {
	t.Helper()
	payload, err := json.Marshal(claims)
	if err != nil {
		t.Fatal(err)
	}
	enc := base64.RawURLEncoding
	return enc.EncodeToString([]byte(`{"alg":"RS256","kid":"k1"}`)) + "." +
		enc.EncodeToString(payload) + "." + enc.EncodeToString([]byte("not-a-real-signature"))
}

// tokenExpiringAt is a pod-bound-looking token with the given exp.
func tokenExpiringAt(t testing.TB, exp time.Time) string {
	return makeJWT(t, map[string]any{
		"aud": []string{"istio-ca"},
		"exp": exp.Unix(),
		"sub": "system:serviceaccount:apps:web",
	})
}

func podBound(ns, sa, pod, uid, node string) authnv1.TokenReviewStatus {
	return authnv1.TokenReviewStatus{
		Authenticated: true,
		Audiences:     []string{"istio-ca"},
		User: authnv1.UserInfo{
			Username: "system:serviceaccount:" + ns + ":" + sa,
			UID:      "sa-uid",
			Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"},
			Extra: map[string]authnv1.ExtraValue{
				extraPodName:  {pod},
				extraPodUID:   {uid},
				extraNodeName: {node},
				"authentication.kubernetes.io/credential-id": {"JTI=7c1f"},
			},
		},
	}
}

func webPod() authnv1.TokenReviewStatus {
	return podBound("apps", "web", "web-0", "uid-web-0", "node-a")
}

func rejected(reason string) authnv1.TokenReviewStatus {
	return authnv1.TokenReviewStatus{Authenticated: false, Error: reason}
}

// respondFunc scripts the apiserver: n counts calls from 1.
type respondFunc func(n int) (authnv1.TokenReviewStatus, error)

func always(st authnv1.TokenReviewStatus) respondFunc {
	return func(int) (authnv1.TokenReviewStatus, error) { return st, nil }
}

// fakeAPI is a fake clientset whose tokenreviews reactor counts calls and
// remembers the last request.
type fakeAPI struct {
	*fake.Clientset
	calls   atomic.Int32
	mu      sync.Mutex
	last    authnv1.TokenReviewSpec
	respond respondFunc
}

func newFakeAPI(respond respondFunc) *fakeAPI {
	api := &fakeAPI{Clientset: fake.NewClientset(), respond: respond}
	api.PrependReactor("create", "tokenreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		n := int(api.calls.Add(1))
		req := a.(k8stesting.CreateAction).GetObject().(*authnv1.TokenReview)
		api.mu.Lock()
		api.last = req.Spec
		respond := api.respond
		api.mu.Unlock()
		st, err := respond(n)
		if err != nil {
			return true, nil, err
		}
		resp := req.DeepCopy()
		resp.Status = st
		return true, resp, nil
	})
	return api
}

// setRespond changes how the API answers from now on.
func (a *fakeAPI) setRespond(respond respondFunc) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.respond = respond
}

func (a *fakeAPI) lastSpec() authnv1.TokenReviewSpec {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.last
}

// countingObserver records what the reviewer reports.
type countingObserver struct {
	mu       sync.Mutex
	hits     int
	misses   int
	forged   int
	results  map[string]int
	verdicts map[string]int
}

func (o *countingObserver) Forged() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.forged++
}

func (o *countingObserver) LocalDecision(verdict string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.verdicts == nil {
		o.verdicts = map[string]int{}
	}
	o.verdicts[verdict]++
}

func (o *countingObserver) CacheLookup(hit bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if hit {
		o.hits++
	} else {
		o.misses++
	}
}

func (o *countingObserver) ReviewDone(result string, _ time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.results == nil {
		o.results = map[string]int{}
	}
	o.results[result]++
}

// podSet is a PodChecker backed by a set of UIDs (of pods in any
// namespace), some of them terminating.
type podSet struct {
	mu       sync.Mutex
	uids     map[string]bool
	deletion map[string]time.Time
}

func (p *podSet) IndexedPod(_, uid string) (time.Time, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.deletion[uid], p.uids[uid]
}

func (p *podSet) Pod(_ context.Context, ns, _, uid string) (authz.PodInfo, bool, error) {
	deletion, ok := p.IndexedPod(ns, uid)
	if !ok {
		return authz.PodInfo{}, false, nil
	}
	return authz.PodInfo{UID: uid, Deletion: deletion}, true, nil
}

func (p *podSet) remove(uid string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.uids, uid)
}

// markDeleted gives a pod a deletionTimestamp.
func (p *podSet) markDeleted(uid string, at time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.deletion == nil {
		p.deletion = map[string]time.Time{}
	}
	p.deletion[uid] = at
}

// accountSet is a ServiceAccounts of namespace/name → uid.
type accountSet struct {
	mu       sync.Mutex
	uids     map[string]string
	deletion map[string]time.Time
}

func (a *accountSet) ServiceAccount(ns, name string) (string, time.Time, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	uid, ok := a.uids[ns+"/"+name]
	return uid, a.deletion[ns+"/"+name], ok
}

func (a *accountSet) set(nsName, uid string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.uids == nil {
		a.uids = map[string]string{}
	}
	if uid == "" {
		delete(a.uids, nsName)
		return
	}
	a.uids[nsName] = uid
}

func (a *accountSet) markDeleted(nsName string, at time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.deletion == nil {
		a.deletion = map[string]time.Time{}
	}
	a.deletion[nsName] = at
}

func newReviewer(t testing.TB, cfg Config) *Reviewer {
	t.Helper()
	r, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func b64(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }
