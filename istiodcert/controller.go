package istiodcert

import (
	"context"
	"fmt"
	"maps"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"github.com/workload-ca/workload-ca/trust"
	"github.com/workload-ca/workload-ca/trust/rootset"
)

// run is the state of one Run: the informer on the one Secret, and the
// queue of its one key.
type run struct {
	p        *Publisher
	key      string // namespace/name
	queue    workqueue.TypedRateLimitingInterface[string]
	secrets  cache.Store
	informer cache.Controller
}

func newRun(p *Publisher) *run {
	r := &run{p: p, key: p.cfg.Namespace + "/" + p.cfg.SecretName, queue: trust.NewQueue(p.opts.Clock)}
	logger := logr.FromSlogHandler(p.opts.Logger.Handler())
	secrets := p.cfg.Client.CoreV1().Secrets(p.cfg.Namespace)
	enqueue := func(any) { r.queue.Add(r.key) }
	r.secrets, r.informer = cache.NewInformerWithOptions(cache.InformerOptions{
		ListerWatcher: trust.ListWatch(p.cfg.Client, fields.OneTermEqualSelector("metadata.name", p.cfg.SecretName).String(),
			func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return secrets.List(ctx, o) },
			secrets.Watch),
		ObjectType: &corev1.Secret{},
		// Any event means someone (we too) wrote or deleted the Secret:
		// look at it again.
		Handler:   cache.ResourceEventHandlerFuncs{AddFunc: enqueue, UpdateFunc: func(_, o any) { enqueue(o) }, DeleteFunc: enqueue},
		Transform: trust.DropManagedFields,
		Logger:    &logger,
	})
	return r
}

func (r *run) Queue() workqueue.TypedRateLimitingInterface[string] { return r.queue }
func (r *run) Informers() []cache.Controller                       { return []cache.Controller{r.informer} }
func (r *run) Keys() []string                                      { return []string{r.key} }

// Reconcile leaves a Secret that holds a usable certificate alone and
// looks at it again when two thirds of its life have passed; otherwise it
// issues a new certificate to a new key and writes it (trust.Target).
func (r *run) Reconcile(ctx context.Context, _ string) (string, error) {
	cur, err := r.cached()
	if err != nil {
		return trust.ResultError, err
	}
	if cur != nil && cur.Labels[LabelManagedBy] != ManagedBy {
		r.p.opts.Logger.WarnContext(ctx, "not writing istiod's serving certificate: the Secret exists and is not ours "+
			"(delete it to have the CA keep it)", "namespace", cur.Namespace, "secret", cur.Name,
			"managed_by", cur.Labels[LabelManagedBy])
		return trust.ResultSkipped, nil
	}
	rootsPEM, err := rootset.PEM(r.p.opts.Roots())
	if err != nil {
		return trust.ResultError, err
	}
	now := r.p.opts.Clock.Now()
	v := assess(cur, r.p.cfg.DNSNames, r.p.cfg.Issuer.SigningCert(), rootsPEM, now)
	if v.reissue == "" {
		r.p.cfg.Holding(v.notAfter)
		r.queue.AddAfter(r.key, v.renewAt.Sub(now))
		return trust.ResultUnchanged, nil
	}
	is, err := r.issue(ctx, rootsPEM)
	if err != nil {
		return trust.ResultError, err
	}
	result := trust.ResultUpdated
	if cur == nil {
		result, err = trust.ResultCreated, r.create(ctx, is)
	} else {
		err = r.update(ctx, cur, is)
	}
	if err != nil {
		return trust.ResultError, err
	}
	r.p.opts.Logger.InfoContext(ctx, "issued istiod's serving certificate", "namespace", r.p.cfg.Namespace,
		"secret", r.p.cfg.SecretName, "reason", v.reissue, "dns_names", r.p.cfg.DNSNames, "not_after", is.notAfter)
	r.p.cfg.Holding(is.notAfter)
	r.queue.AddAfter(r.key, is.renewAt.Sub(now))
	return result, nil
}

func (r *run) cached() (*corev1.Secret, error) {
	obj, ok, err := r.secrets.GetByKey(r.key)
	if err != nil || !ok {
		return nil, err
	}
	s, ok := obj.(*corev1.Secret)
	if !ok {
		return nil, fmt.Errorf("cache holds a %T for Secret %s", obj, r.key)
	}
	return s, nil
}

func (r *run) issue(ctx context.Context, rootsPEM string) (issued, error) {
	key, err := newKey()
	if err != nil {
		return issued{}, fmt.Errorf("istiod certificate key: %w", err)
	}
	leaf, above, err := r.p.cfg.Issuer.IssueServing(ctx, key.Public(), r.p.cfg.DNSNames, r.p.cfg.TTL)
	if err != nil {
		return issued{}, fmt.Errorf("issue istiod's certificate: %w", err)
	}
	return secretData(leaf, above, key, rootsPEM)
}

func (r *run) labels(have map[string]string) map[string]string {
	l := maps.Clone(have)
	if l == nil {
		l = make(map[string]string, 2)
	}
	l[LabelManagedBy] = ManagedBy
	l[LabelTrustDomain] = r.p.opts.TrustDomain.Name()
	return l
}

// create writes a new Secret. One that exists already is in the API
// server but not yet in the cache: it is looked at again once it is.
func (r *run) create(ctx context.Context, is issued) error {
	s := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: r.p.cfg.SecretName, Namespace: r.p.cfg.Namespace, Labels: r.labels(nil)},
		Type:       corev1.SecretTypeTLS,
		Data:       is.data,
	}
	_, err := r.p.cfg.Client.CoreV1().Secrets(s.Namespace).Create(ctx, s, metav1.CreateOptions{FieldManager: FieldManager})
	if apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("%w: Secret %s created meanwhile", trust.ErrRequeue, r.key)
	}
	if err != nil {
		return fmt.Errorf("create Secret %s: %w", r.key, err)
	}
	return nil
}

// update writes over cur, keeping its other data keys, labels and
// annotations; a write over a version the cache has not caught up with
// is retried.
func (r *run) update(ctx context.Context, cur *corev1.Secret, is issued) error {
	s := cur.DeepCopy()
	s.Labels = r.labels(s.Labels)
	if s.Data == nil {
		s.Data = make(map[string][]byte, len(is.data))
	}
	maps.Copy(s.Data, is.data)
	_, err := r.p.cfg.Client.CoreV1().Secrets(s.Namespace).Update(ctx, s, metav1.UpdateOptions{FieldManager: FieldManager})
	if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
		return fmt.Errorf("%w: Secret %s changed meanwhile", trust.ErrRequeue, r.key)
	}
	if err != nil {
		return fmt.Errorf("update Secret %s: %w", r.key, err)
	}
	return nil
}
