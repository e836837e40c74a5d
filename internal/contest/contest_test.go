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
	other := map[string]string{"team": "mesh"}
	tests := []struct {
		name, key, current string
		annotations        map[string]string
		want               bool
	}{
		{"holds what we wrote", "a", "ours", nil, false},
		{"holds something else", "a", "theirs", nil, true},
		{"holds what we wrote before our last write", "b", "old", nil, true},
		{"never written: cannot tell", "z", "theirs", other, false},
		{"forgotten: cannot tell", "c", "theirs", nil, false},
		{"no history, stamp matches: a predecessor wrote it", "z", "ours", Stamp(other, "ours"), false},
		{"no history, stamp differs: edited since", "z", "theirs", Stamp(other, "ours"), true},
		{"the stamp outranks history: another replica wrote since", "a", "newer", Stamp(nil, "newer"), false},
		{"a garbled stamp is no match", "z", "ours", map[string]string{Annotation: "not-a-hash"}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tr.Edited(tt.key, tt.current, tt.annotations); got != tt.want {
				t.Errorf("Edited(%q, %q, %v) = %v, want %v", tt.key, tt.current, tt.annotations, got, tt.want)
			}
		})
	}
}

func TestStamp(t *testing.T) {
	in := map[string]string{"team": "mesh"}
	out := Stamp(in, "roots")
	if _, ok := in[Annotation]; ok {
		t.Fatal("Stamp changed its argument")
	}
	if out["team"] != "mesh" || !Stamped(out, "roots") || Stamped(out, "other roots") || Stamped(nil, "roots") {
		t.Fatalf("Stamp(%v) = %v", in, out)
	}
	if got := Stamp(nil, "")[Annotation]; got != "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855" {
		t.Fatalf("stamp of nothing %q, want SHA-256 of the empty string", got)
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
