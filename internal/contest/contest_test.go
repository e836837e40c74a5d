package contest

import (
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	testingclock "k8s.io/utils/clock/testing"
)

func TestTrackerEdited(t *testing.T) {
	tr := NewTracker(testingclock.NewFakePassiveClock(time.Now()), 0)
	tr.Wrote("a", "ours")
	tr.Wrote("b", "old")
	tr.Wrote("b", "new")
	tr.Wrote("c", "ours")
	tr.Forget("c")
	tests := []struct {
		name, key, current string
		want               bool
	}{
		{"holds what we wrote", "a", "ours", false},
		{"holds something else", "a", "theirs", true},
		{"holds what we wrote before our last write", "b", "old", true},
		{"never written: cannot tell", "z", "theirs", false},
		{"forgotten: cannot tell", "c", "theirs", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tr.Edited(tt.key, tt.current); got != tt.want {
				t.Errorf("Edited(%q, %q) = %v, want %v", tt.key, tt.current, got, tt.want)
			}
		})
	}
}

func TestTrackerPacesRepairs(t *testing.T) {
	clk := testingclock.NewFakePassiveClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	tr := NewTracker(clk, time.Minute)
	if w := tr.Repair("a"); w != 0 {
		t.Fatalf("first repair: wait %v, want none", w)
	}
	clk.SetTime(clk.Now().Add(20 * time.Second))
	if w := tr.Repair("a"); w != 40*time.Second {
		t.Fatalf("20s later: wait %v, want 40s", w)
	}
	if w := tr.Repair("b"); w != 0 {
		t.Fatalf("another key: wait %v, want none", w)
	}
	clk.SetTime(clk.Now().Add(40 * time.Second))
	if w := tr.Repair("a"); w != 0 {
		t.Fatalf("a minute after the first repair: wait %v, want none", w)
	}
	if w := tr.Repair("a"); w != time.Minute {
		t.Fatalf("right after the second repair: wait %v, want a minute", w)
	}
}

func TestWriters(t *testing.T) {
	entry := func(manager, fields string) metav1.ManagedFieldsEntry {
		return metav1.ManagedFieldsEntry{Manager: manager, Operation: metav1.ManagedFieldsOperationUpdate,
			FieldsType: "FieldsV1", FieldsV1: metav1.NewFieldsV1(fields)}
	}
	const rootCert = `{"f:data":{".":{},"f:root-cert.pem":{}}}`
	tests := []struct {
		name    string
		entries []metav1.ManagedFieldsEntry
		want    []string
	}{
		{"only us", []metav1.ManagedFieldsEntry{entry("workload-ca", rootCert)}, nil},
		{"another writer of the key", []metav1.ManagedFieldsEntry{entry("workload-ca", `{"f:metadata":{"f:labels":{}}}`),
			entry("pilot-discovery", rootCert)}, []string{"pilot-discovery"}},
		{"writers of other fields are not named", []metav1.ManagedFieldsEntry{entry("kubectl-label", `{"f:metadata":{"f:labels":{"f:x":{}}}}`),
			entry("kubectl-edit", `{"f:data":{"f:other":{}}}`)}, nil},
		{"sorted, once each", []metav1.ManagedFieldsEntry{entry("kubectl-edit", rootCert), entry("a-tool", rootCert),
			entry("kubectl-edit", rootCert)}, []string{"a-tool", "kubectl-edit"}},
		{"malformed fields hold nothing", []metav1.ManagedFieldsEntry{entry("broken", `{"f:data":`), entry("null", `null`)}, nil},
		{"no fields at all", []metav1.ManagedFieldsEntry{{Manager: "empty"}}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{ManagedFields: tt.entries}}
			if got := Writers(cm, "workload-ca", "data", "root-cert.pem"); !slices.Equal(got, tt.want) {
				t.Errorf("Writers = %q, want %q", got, tt.want)
			}
		})
	}
}

func FuzzOwns(f *testing.F) {
	f.Add([]byte(`{"f:data":{"f:root-cert.pem":{}}}`), "data", "root-cert.pem")
	f.Add([]byte(`{"f:spec":{"f:trustBundle":{}}}`), "spec", "trustBundle")
	f.Add([]byte(`[]`), "data", "x")
	f.Fuzz(func(t *testing.T, raw []byte, a, b string) {
		_ = owns(raw, []string{a, b})
	})
}
