package trust

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/workqueue"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/workload-ca/workload-ca/internal/contest"
)

// memObjects is an in-memory Objects: one ConfigMap per key, the cache
// and the live object the same unless a test says otherwise.
type memObjects struct {
	live      map[string]*corev1.ConfigMap
	createErr error
	updateErr error
	creates   int
	updates   int
}

func (m *memObjects) Content(cm *corev1.ConfigMap) string { return cm.Data["roots"] }
func (m *memObjects) Cached(key, _ string) (*corev1.ConfigMap, bool, error) {
	cm, ok := m.live[key]
	return cm, ok, nil
}
func (m *memObjects) Get(_ context.Context, key, _ string) (*corev1.ConfigMap, error) {
	cm, ok := m.live[key]
	if !ok {
		return nil, fmt.Errorf("%w: gone", ErrRequeue)
	}
	return cm.DeepCopy(), nil
}
func (m *memObjects) CreateOrGet(_ context.Context, key, name, content string) (*corev1.ConfigMap, bool, error) {
	if m.createErr != nil {
		return nil, false, m.createErr
	}
	m.creates++
	m.live[key] = &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: key,
		Labels: map[string]string{"mine": "yes"}, Annotations: contest.Stamp(nil, content)},
		Data: map[string]string{"roots": content}}
	return nil, false, nil
}
func (m *memObjects) Update(_ context.Context, cur *corev1.ConfigMap, content string) error {
	if m.updateErr != nil {
		return m.updateErr
	}
	m.updates++
	cm := cur.DeepCopy()
	cm.Data = map[string]string{"roots": content}
	cm.Annotations = contest.Stamp(cm.Annotations, content)
	if cm.Labels == nil {
		cm.Labels = map[string]string{}
	}
	cm.Labels["mine"] = "yes"
	m.live[cur.Namespace] = cm
	return nil
}

// edit is another writer changing the roots under our stamp.
func (m *memObjects) edit(key, content string) {
	m.live[key].Data = map[string]string{"roots": content}
}

type delays struct {
	workqueue.TypedDelayingInterface[string]
	added []time.Duration
}

func (d *delays) AddAfter(_ string, wait time.Duration) { d.added = append(d.added, wait) }

func newTestWriter(objs *memObjects, clk *clocktesting.FakeClock) (*Writer[*corev1.ConfigMap], *delays) {
	q := &delays{}
	opts, err := Options{TrustDomain: spiffeid.RequireTrustDomainFromString("example.org"), Roots: func() []*x509.Certificate { return nil },
		Clock: clk, RepairInterval: time.Minute}.WithDefaults()
	if err != nil {
		panic(err)
	}
	return NewWriter(WriterConfig[*corev1.ConfigMap]{Kind: Kind{Name: "ConfigMap", Key: "namespace"}, Objects: objs,
		Labels: map[string]string{"mine": "yes"}, FieldManager: "workload-ca", ContentField: []string{"data", "roots"},
		Queue: q, Options: opts}), q
}

// TestWriterEnsure walks one object through what can happen to it; each
// step's result is what Observer.Published would be told.
func TestWriterEnsure(t *testing.T) {
	ctx := context.Background()
	clk := clocktesting.NewFakeClock(time.Unix(1_000_000, 0))
	objs := &memObjects{live: map[string]*corev1.ConfigMap{}}
	w, q := newTestWriter(objs, clk)
	steps := []struct {
		name   string
		before func()
		roots  string
		want   string
	}{
		{"missing: created", nil, "A", ResultCreated},
		{"already right: unchanged", nil, "A", ResultUnchanged},
		{"new roots: updated", nil, "B", ResultUpdated},
		{"our label dropped: updated", func() { delete(objs.live["ns"].Labels, "mine") }, "B", ResultUpdated},
		{"another writer's roots: repaired", func() { objs.edit("ns", "X") }, "B", ResultRepaired},
		{"again within the interval: deferred", func() { objs.edit("ns", "X") }, "B", ResultDeferred},
		{"after the interval: repaired", func() { clk.Step(time.Minute) }, "B", ResultRepaired},
	}
	for _, s := range steps {
		if s.before != nil {
			s.before()
		}
		got, err := w.Ensure(ctx, "ns", "cm", s.roots)
		if err != nil || got != s.want {
			t.Fatalf("%s: Ensure = %q, %v; want %q", s.name, got, err, s.want)
		}
	}
	if objs.creates != 1 || objs.updates != 4 {
		t.Errorf("creates %d, updates %d; want 1 and 4", objs.creates, objs.updates)
	}
	if len(q.added) != 1 || q.added[0] != time.Minute {
		t.Errorf("deferred repairs queued after %v; want one after the 1m interval", q.added)
	}
}

func TestWriterEnsureFailures(t *testing.T) {
	boom := errors.New("boom")
	tests := []struct {
		name      string
		createErr error
		updateErr error
		existing  bool
		want      string
		wantErr   error
	}{
		{name: "create refused", createErr: boom, want: ResultError, wantErr: boom},
		{name: "namespace gone meanwhile", createErr: fmt.Errorf("%w: namespace deleted", ErrSkip), want: ResultSkipped},
		{name: "create raced", createErr: fmt.Errorf("%w: deleted", ErrRequeue), want: ResultRequeued, wantErr: ErrRequeue},
		{name: "update conflict", existing: true, updateErr: fmt.Errorf("%w: conflict", ErrRequeue), want: ResultRequeued, wantErr: ErrRequeue},
		{name: "update refused", existing: true, updateErr: boom, want: ResultError, wantErr: boom},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			objs := &memObjects{live: map[string]*corev1.ConfigMap{}}
			if tc.existing {
				objs.live["ns"] = &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "cm", Namespace: "ns"}, Data: map[string]string{"roots": "old"}}
			}
			objs.createErr, objs.updateErr = tc.createErr, tc.updateErr
			w, _ := newTestWriter(objs, clocktesting.NewFakeClock(time.Unix(0, 0)))
			got, err := w.Ensure(context.Background(), "ns", "cm", "new")
			if got != tc.want || !errors.Is(err, tc.wantErr) || (tc.wantErr == nil) != (err == nil) {
				t.Fatalf("Ensure = %q, %v; want %q, %v", got, err, tc.want, tc.wantErr)
			}
		})
	}
}
