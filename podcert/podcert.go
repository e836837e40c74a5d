package podcert

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	certv1 "k8s.io/api/certificates/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"

	"github.com/workload-ca/workload-ca/authz"
	"github.com/workload-ca/workload-ca/ca"
	"github.com/workload-ca/workload-ca/internal/keyloop"
	"github.com/workload-ca/workload-ca/internal/rbac"
	"github.com/workload-ca/workload-ca/issuance"
)

// Signer issues certificates; *ca.Authority is one.
type Signer interface {
	Sign(ctx context.Context, r ca.Request) (*ca.Issued, error)
	// SigningCert is the certificate Sign signs with now.
	SigningCert() *x509.Certificate
}

// Observer counts the outcome of each request handled.
type Observer interface {
	// PodCertificate is called once per request decided, with one of the
	// Result* values.
	PodCertificate(result string)
}

// Outcomes passed to Observer.PodCertificate: a request issued or
// denied, or an attempt to sign one that failed and is retried with
// backoff (the request stays pending: the kubelet takes Failed as final).
const (
	ResultIssued = "issued"
	ResultDenied = "denied"
	ResultFailed = "failed"
)

// minValidity is the shortest certificate the API server accepts.
const minValidity = time.Hour

// Config configures a Controller. Client, SignerName, TrustDomain, Signer
// and Pipeline are required.
type Config struct {
	Client      kubernetes.Interface
	SignerName  string
	TrustDomain spiffeid.TrustDomain
	// ClusterID is the cluster's id, when the CA knows cluster ids: the
	// cluster of every request (an issuance policy may select by it).
	ClusterID string
	// Signer tells the signing certificate; the pipeline signs.
	Signer Signer
	// Pipeline decides, signs, audits and counts what this door hands it:
	// the one every door shares.
	Pipeline *issuance.Pipeline
	Logger   *slog.Logger
	Observer Observer
	Clock    clock.WithTicker
	// Resync re-reads every pending request this often (default 10m).
	Resync time.Duration
	// Workers is how many requests are decided at once (default 1). Each
	// decision waits for one status update, so with one worker the rate
	// is one request per API round trip.
	Workers int
	// Pods and Accounts, when set, are checked against what a request
	// says: its pod is live, of that UID, in its namespace, running as its
	// service account on its node, and the service account has its UID.
	// Whoever may create PodCertificateRequests can write any of those
	// fields; the indexes show what the cluster runs.
	Pods     Pods
	Accounts Accounts
	// APIVersion is the version of certificates.k8s.io to use, APIv1 or
	// APIv1beta1; empty: v1 if the API server serves it, else v1beta1
	// (discovery, when Run starts).
	APIVersion string
}

// Pods tells where a live pod runs; *podindex.Index is one.
type Pods interface {
	Pod(ctx context.Context, namespace, name, uid string) (info authz.PodInfo, found bool, err error)
}

// Accounts tells which UID a service account has; *saindex.Index is one.
type Accounts interface {
	ServiceAccount(namespace, name string) (uid string, deletion time.Time, ok bool)
}

// Controller signs the PodCertificateRequests of one signer name.
type Controller struct {
	cfg  Config
	door *issuance.Door
	// api is the version requests are read and written in: v1 until Run
	// has chosen.
	api *requestAPI
}

// New checks cfg and returns a controller; nothing runs yet.
func New(cfg Config) (*Controller, error) {
	switch {
	case cfg.Client == nil || cfg.Signer == nil || cfg.Pipeline == nil:
		return nil, errors.New("podcert: Client, Signer and Pipeline are required")
	case cfg.SignerName == "" || cfg.TrustDomain.IsZero():
		return nil, errors.New("podcert: SignerName and TrustDomain are required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Observer == nil {
		cfg.Observer = nopObserver{}
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Resync <= 0 {
		cfg.Resync = 10 * time.Minute
	}
	switch cfg.APIVersion {
	case "", APIv1, APIv1beta1:
	default:
		return nil, fmt.Errorf("podcert: APIVersion %q: want v1, v1beta1 or empty", cfg.APIVersion)
	}
	return &Controller{cfg: cfg, door: cfg.Pipeline.Door(issuance.DoorPodCertificate, answer), api: v1API(cfg.Client)}, nil
}

type nopObserver struct{}

func (nopObserver) PodCertificate(string) {}

// Run checks its permissions, then signs requests until ctx ends.
func (c *Controller) Run(ctx context.Context) error {
	if err := rbac.Check(ctx, c.cfg.Client, permissions(c.cfg.SignerName)...); err != nil {
		return fmt.Errorf("podcert: %w", err)
	}
	api, err := detectAPI(ctx, c.cfg.Client, c.cfg.APIVersion)
	if err != nil {
		return err
	}
	c.api = api
	c.cfg.Logger.InfoContext(ctx, "signing PodCertificateRequests", "signer", c.cfg.SignerName, "api", "certificates.k8s.io/"+api.version)
	queue := workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
		workqueue.TypedRateLimitingQueueConfig[string]{Clock: c.cfg.Clock})
	logger := logr.FromSlogHandler(c.cfg.Logger.Handler())
	// spec.signerName is a supported field selector, and immutable.
	store, informer := cache.NewInformerWithOptions(cache.InformerOptions{
		ListerWatcher: cache.NewListWatchFromClient(api.rest, "podcertificaterequests",
			metav1.NamespaceAll, fields.OneTermEqualSelector("spec.signerName", c.cfg.SignerName)),
		ObjectType: api.object,
		Handler: cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { enqueue(queue, obj) },
			UpdateFunc: func(_, obj any) { enqueue(queue, obj) },
		},
		Transform: dropManagedFields,
		Logger:    &logger,
	})
	loop := &keyloop.Loop{Queue: queue, Informers: []cache.Controller{informer}, Keys: store.ListKeys,
		Reconcile: func(ctx context.Context, key string) error { return c.reconcile(ctx, store, key) },
		Clock:     c.cfg.Clock, Resync: c.cfg.Resync, Workers: c.cfg.Workers}
	loop.Run(ctx)
	return nil
}

func enqueue(q workqueue.TypedInterface[string], obj any) {
	if key, err := cache.MetaNamespaceKeyFunc(obj); err == nil {
		q.Add(key)
	}
}

// dropManagedFields is the informer's transform: the store keeps no
// managed fields.
func dropManagedFields(obj any) (any, error) {
	if m, ok := obj.(metav1.Object); ok {
		m.SetManagedFields(nil)
	}
	return obj, nil
}

// reconcile decides the request at key, unless it is decided already.
func (c *Controller) reconcile(ctx context.Context, store cache.Store, key string) error {
	obj, ok, err := store.GetByKey(key)
	if err != nil || !ok {
		return err // gone: nothing to do
	}
	it, ok := c.api.toItem(obj)
	if !ok || decided(it.PodCertificateRequest) || it.Spec.SignerName != c.cfg.SignerName {
		return nil
	}
	pcr := it.PodCertificateRequest
	spec := pcr.Spec
	r := issuance.Request{Received: c.cfg.Clock.Now(), CallerKind: issuance.CallerKubelet, Object: key, Cluster: c.cfg.ClusterID,
		Caller: authz.Caller{Namespace: pcr.Namespace, ServiceAccount: spec.ServiceAccountName,
			PodName: spec.PodName, PodUID: string(spec.PodUID), NodeName: string(spec.NodeName)},
		Credential: issuance.CredentialX509SVID, MinValidity: minValidity}
	d := decide(it, c.cfg.TrustDomain)
	if d.reason != "" {
		c.door.Refuse(ctx, r, d.err())
		return c.finish(ctx, it, d, nil)
	}
	r.Requested, r.CSR, r.TTL, r.MaxValidity = d.req.ID, d.req.CSR, d.req.TTL, d.req.MaxValidity
	issued, err := c.door.Issue(ctx, r, issuance.RuleFunc(func(ctx context.Context, r *issuance.Request) (spiffeid.ID, error) {
		if err := c.checkRequester(ctx, pcr); err != nil {
			return spiffeid.ID{}, err
		}
		// Checked before signing too (the pipeline checks what it
		// signed), so that no retry signs in vain.
		if sc := c.cfg.Signer.SigningCert(); sc.NotAfter.Sub(c.cfg.Clock.Now()) < minValidity {
			return spiffeid.ID{}, fmt.Errorf("%w: the signing certificate ends at %s, within the hour Kubernetes requires of a pod certificate",
				issuance.ErrNotReady, sc.NotAfter.UTC().Format(time.RFC3339))
		}
		return r.Requested, nil
	}))
	if err == nil {
		return c.finish(ctx, it, d, issued)
	}
	if reason, final := condition(err); final {
		return c.finish(ctx, it, deny(reason, "%v", err), nil)
	}
	// The CA's own failure (not ready, an index that cannot tell yet, a
	// certificate shorter than the hour Kubernetes requires because the
	// signing certificate expires within it), or an audit record not
	// written: retried with backoff. The request stays pending; a Failed
	// condition would be final for the kubelet.
	c.cfg.Observer.PodCertificate(ResultFailed)
	return fmt.Errorf("sign PodCertificateRequest %s: %w", key, err)
}

// condition is the Denied condition's reason for a request refused with
// err, and whether that refusal is final; a refusal that is not final is
// retried with backoff.
func condition(err error) (reason string, final bool) {
	return conditionOf(issuance.Classify(context.Background(), err), err)
}

// conditionOf is condition for a refusal whose outcome is known.
func conditionOf(o issuance.Outcome, err error) (reason string, final bool) {
	var d *denial
	if errors.As(err, &d) {
		return d.reason, true
	}
	switch o.Result {
	case issuance.ResultInvalid:
		return ReasonInvalidRequest, true
	case issuance.ResultDenied:
		return ReasonDenied, true
	}
	return "", false
}

// answer is what the door answers a refusal with, for the audit record:
// the Denied condition's reason, or "Retried".
func answer(o issuance.Outcome, err error) string {
	if reason, final := conditionOf(o, err); final {
		return reason
	}
	return "Retried"
}

// checkRequester holds a request to what the cluster runs (see
// Config.Pods): a mismatch is a denial; an index that cannot tell yet (the
// API unreachable, a service account not seen yet) is unavailable, and
// the request retried.
func (c *Controller) checkRequester(ctx context.Context, pcr *certv1.PodCertificateRequest) error {
	spec := pcr.Spec
	if c.cfg.Pods != nil {
		pod, found, err := c.cfg.Pods.Pod(ctx, pcr.Namespace, spec.PodName, string(spec.PodUID))
		switch {
		case err != nil:
			return fmt.Errorf("%w: checking pod %s/%s: %w", authz.ErrUnavailable, pcr.Namespace, spec.PodName, err)
		case !found:
			return deny(ReasonPodMismatch, "no live pod %s/%s with uid %s", pcr.Namespace, spec.PodName, spec.PodUID).err()
		case pod.ServiceAccount != spec.ServiceAccountName:
			return deny(ReasonPodMismatch, "pod %s/%s runs as service account %s, not %s", pcr.Namespace, spec.PodName, pod.ServiceAccount, spec.ServiceAccountName).err()
		case pod.NodeName != string(spec.NodeName):
			return deny(ReasonPodMismatch, "pod %s/%s runs on node %s, not %s", pcr.Namespace, spec.PodName, pod.NodeName, spec.NodeName).err()
		case authz.DeletedLongAgo(pod.Deletion, c.cfg.Clock.Now()):
			return deny(ReasonPodMismatch, "pod %s/%s has been terminating since %s", pcr.Namespace, spec.PodName, pod.Deletion.UTC().Format(time.RFC3339)).err()
		}
	}
	if c.cfg.Accounts != nil {
		uid, _, ok := c.cfg.Accounts.ServiceAccount(pcr.Namespace, spec.ServiceAccountName)
		switch {
		case !ok:
			return fmt.Errorf("%w: service account %s/%s is not in the index (yet)", authz.ErrUnavailable, pcr.Namespace, spec.ServiceAccountName)
		case uid != string(spec.ServiceAccountUID):
			return deny(ReasonPodMismatch, "service account %s/%s has uid %s, not %s", pcr.Namespace, spec.ServiceAccountName, uid, spec.ServiceAccountUID).err()
		}
	}
	return nil
}

// decided reports whether the request has its terminal condition.
func decided(pcr *certv1.PodCertificateRequest) bool {
	for _, cond := range pcr.Status.Conditions {
		switch cond.Type {
		case certv1.PodCertificateRequestConditionTypeIssued, certv1.PodCertificateRequestConditionTypeDenied,
			certv1.PodCertificateRequestConditionTypeFailed:
			return true
		}
	}
	return false
}

// finish writes the decision to the request's status: the certificate
// (issued non-nil) or a denial, and counts what it wrote (the pipeline
// has audited it).
func (c *Controller) finish(ctx context.Context, it *item, d decision, issued *ca.Issued) error {
	pcr := it.PodCertificateRequest
	now := metav1.NewTime(c.cfg.Clock.Now())
	upd := &item{PodCertificateRequest: pcr.DeepCopy(), pkixPublicKey: it.pkixPublicKey, proofOfPossession: it.proofOfPossession}
	cond := metav1.Condition{Status: metav1.ConditionTrue, LastTransitionTime: now, ObservedGeneration: pcr.Generation}
	result := ResultIssued
	if issued == nil {
		cond.Type, cond.Reason, cond.Message = certv1.PodCertificateRequestConditionTypeDenied, d.reason, d.msg
		result = ResultDenied
	} else {
		cond.Type, cond.Reason, cond.Message = certv1.PodCertificateRequestConditionTypeIssued, "Issued", "issued "+d.req.ID.String()
		leaf := issued.Cert
		nb, na, refresh := metav1.NewTime(leaf.NotBefore), metav1.NewTime(leaf.NotAfter), metav1.NewTime(refreshAt(leaf.NotBefore, leaf.NotAfter))
		// Leaf and intermediates; the roots are in the signer's
		// ClusterTrustBundles.
		upd.Status.CertificateChain = strings.Join(issued.Chain[:len(issued.Chain)-1], "")
		upd.Status.NotBefore, upd.Status.NotAfter, upd.Status.BeginRefreshAt = &nb, &na, &refresh
	}
	upd.Status.Conditions = append(upd.Status.Conditions, cond)
	err := c.api.updateStatus(ctx, upd)
	switch {
	case apierrors.IsNotFound(err):
		return nil // the pod is gone, and its request with it
	case err != nil:
		return fmt.Errorf("update status of PodCertificateRequest %s/%s: %w", pcr.Namespace, pcr.Name, err)
	}
	c.cfg.Observer.PodCertificate(result)
	return nil
}

// permissions is what the signer needs: to watch the signer's requests,
// write their status, and sign for the signer (without the last, the API
// server refuses every status update).
func permissions(signer string) []rbac.Permission {
	group := certv1.SchemeGroupVersion.Group
	return []rbac.Permission{
		{Group: group, Resource: "podcertificaterequests", Verb: "list"},
		{Group: group, Resource: "podcertificaterequests", Verb: "watch"},
		{Group: group, Resource: "podcertificaterequests", Subresource: "status", Verb: "update"},
		{Group: group, Resource: "signers", Name: signer, Verb: "sign"},
	}
}
