package issuance_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/workload-ca/workload-ca/authz"
	"github.com/workload-ca/workload-ca/ca"
	"github.com/workload-ca/workload-ca/internal/testca"
	"github.com/workload-ca/workload-ca/issuance"
)

var td = spiffeid.RequireTrustDomainFromString("cluster.local")

// observed remembers what the pipeline counted, as door/result/reason.
type observed []string

func (o *observed) RequestDone(door, result, reason string, _ time.Duration) {
	*o = append(*o, door+"/"+result+"/"+reason)
}

// disk is an audit log that fails every write while full.
type disk struct {
	bytes.Buffer
	full bool
}

func (d *disk) Write(p []byte) (int, error) {
	if d.full {
		return 0, errors.New("no space left on device")
	}
	return d.Buffer.Write(p)
}

func (d *disk) records(t *testing.T) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(d.String()), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatal(err)
		}
		out = append(out, m)
	}
	return out
}

func csr(t testing.TB) *x509.CertificateRequest {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return &x509.CertificateRequest{PublicKey: key.Public()}
}

func grant(id spiffeid.ID, err error) issuance.Rule {
	return issuance.RuleFunc(func(context.Context, *issuance.Request) (spiffeid.ID, error) { return id, err })
}

// TestDoors drives one request per case through a door and checks what
// the door gets back, the one audit record and what was counted.
func TestDoors(t *testing.T) {
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	root := testca.NewRoot(t, testca.P256, testca.Validity(now.Add(-time.Hour), now.Add(24*time.Hour)))
	authority, err := ca.New(ca.Config{TrustDomain: td, Clock: testingclock.NewFakePassiveClock(now), DefaultTTL: time.Hour}, root.Material())
	if err != nil {
		t.Fatal(err)
	}
	web := spiffeid.RequireFromPath(td, "/ns/apps/sa/web")
	caller := authz.Caller{Namespace: "apps", ServiceAccount: "web", PodName: "web-0", NodeName: "node-a"}
	tests := []struct {
		name     string
		door     string
		rule     issuance.Rule
		min      time.Duration
		full     bool
		admit    bool
		wantErr  error // nil: issued
		wantMsg  string
		wantRec  map[string]any
		wantObs  string
		noRecord bool // summarized, not recorded one by one
		policy   issuance.Policy
		wantLife time.Duration // issued: its lifetime at most
	}{
		{name: "issued through the gRPC door", door: issuance.DoorGRPC, rule: grant(web, nil),
			wantMsg: "certificate issued", wantObs: "grpc/issued/",
			wantRec: map[string]any{"door": "grpc", "decision": "issued", "caller": "apps/web", "pod": "web-0", "node": "node-a", "identity": web.String(), "caller_kind": "workload"}},
		{name: "issued through the pod certificate door, within the door's bounds", door: issuance.DoorPodCertificate, rule: grant(web, nil), admit: true,
			wantMsg: "certificate issued", wantObs: "podcert/issued/",
			wantRec: map[string]any{"door": "podcert", "decision": "issued", "identity": web.String()}},
		{name: "denied by the node rule", door: issuance.DoorPodCertificate, rule: grant(spiffeid.ID{}, authz.Deny(authz.ReasonPodMismatch, "no live pod")),
			wantErr: &authz.DenyError{}, wantMsg: "certificate request refused", wantObs: "podcert/denied/pod-mismatch",
			wantRec: map[string]any{"door": "podcert", "decision": "denied", "reason": "pod-mismatch", "code": "answer", "error": "denied: pod-mismatch: no live pod"}},
		{name: "a rule that cannot tell now: summarized", door: issuance.DoorGRPC, rule: grant(spiffeid.ID{}, authz.ErrUnavailable),
			wantErr: authz.ErrUnavailable, wantObs: "grpc/unavailable/", noRecord: true},
		{name: "shorter than the door can hand out", door: issuance.DoorPodCertificate, rule: grant(web, nil), min: 2 * time.Hour,
			wantErr: issuance.ErrTooShort, wantObs: "podcert/unavailable/", noRecord: true},
		{name: "audit log unwritable: not handed out", door: issuance.DoorPodCertificate, rule: grant(web, nil), full: true,
			wantErr: issuance.ErrAuditUnwritable, wantObs: "podcert/unavailable/", noRecord: true},
		{name: "denied by a policy, named", door: issuance.DoorPodCertificate, rule: grant(web, nil),
			policy:  verdict(issuance.Verdict{}, &issuance.PolicyError{Policy: "no-web", Message: "not web"}),
			wantErr: &issuance.PolicyError{}, wantMsg: "certificate request refused", wantObs: "podcert/denied/policy-denied",
			wantRec: map[string]any{"decision": "denied", "reason": "policy-denied", "policy": "no-web", "error": `denied by issuance policy "no-web": not web`}},
		{name: "a policy that cannot decide: recorded, not summarized", door: issuance.DoorGRPC, rule: grant(web, nil),
			policy:  verdict(issuance.Verdict{}, &issuance.PolicyError{Policy: "broken", Message: "it does not compile", Err: issuance.ErrPolicyUnavailable}),
			wantErr: issuance.ErrPolicyUnavailable, wantMsg: "certificate request refused", wantObs: "grpc/unavailable/policy-unavailable",
			wantRec: map[string]any{"decision": "unavailable", "reason": "policy-unavailable", "policy": "broken"}},
		{name: "a policy lowers the lifetime", door: issuance.DoorGRPC, rule: grant(web, nil),
			policy:  verdict(issuance.Verdict{MaxTTL: 10 * time.Minute, Lowered: []string{"short"}, WouldDeny: []string{"dry"}}, nil),
			wantMsg: "certificate issued", wantObs: "grpc/issued/", wantLife: 10 * time.Minute,
			wantRec: map[string]any{"policy": "short", "policy_dry_run_denied": "dry"}},
		{name: "a policy's cap under the door's minimum is a denial, before signing", door: issuance.DoorPodCertificate, rule: grant(web, nil), min: time.Hour,
			policy:  verdict(issuance.Verdict{MaxTTL: 30 * time.Minute, Lowered: []string{"short"}}, nil),
			wantErr: &issuance.PolicyError{}, wantMsg: "certificate request refused", wantObs: "podcert/denied/policy-denied",
			wantRec: map[string]any{"policy": "short", "error": `denied by issuance policy "short": it caps the lifetime at 30m0s, under the 1h0m0s the podcert door must hand out`}},
		{name: "a panicking rule is a bug, answered and recorded as one", door: issuance.DoorGRPC,
			rule:    issuance.RuleFunc(func(context.Context, *issuance.Request) (spiffeid.ID, error) { panic("boom") }),
			wantErr: issuance.ErrPanic, wantMsg: "certificate request refused", wantObs: "grpc/internal/",
			wantRec: map[string]any{"decision": "internal"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			log := &disk{full: tt.full}
			var obs observed
			p, err := issuance.New(issuance.Config{Signer: authority, Audit: slog.New(slog.NewJSONHandler(log, nil)), Observer: &obs,
				Clock: testingclock.NewFakePassiveClock(now), Policy: tt.policy})
			if err != nil {
				t.Fatal(err)
			}
			d := p.Door(tt.door, func(issuance.Outcome, error) string { return "answer" })
			admitted := false
			r := issuance.Request{Caller: caller, CallerKind: issuance.CallerWorkload, CSR: csr(t), MinValidity: tt.min}
			if tt.admit {
				r.Admit = func(_ context.Context, sign func() error) error { admitted = true; return sign() }
			}
			issued, err := d.Issue(context.Background(), r, tt.rule)
			switch {
			case tt.wantErr == nil && (err != nil || issued == nil):
				t.Fatalf("Issue: %v, want a certificate", err)
			case tt.wantErr != nil && issued != nil:
				t.Fatalf("Issue returned a certificate, want %v", tt.wantErr)
			case tt.wantErr != nil && !errors.Is(err, tt.wantErr) && !errors.As(err, new(*authz.DenyError)) && !errors.As(err, new(*issuance.PolicyError)):
				t.Fatalf("Issue: %v, want %v", err, tt.wantErr)
			case tt.wantLife > 0 && issued.Cert.NotAfter.Sub(now) > tt.wantLife:
				t.Errorf("issued until %v, want at most %v from now", issued.Cert.NotAfter, tt.wantLife)
			}
			if tt.admit && !admitted {
				t.Error("signed outside the door's bounds (Admit)")
			}
			if len(obs) != 1 || obs[0] != tt.wantObs {
				t.Errorf("counted %v, want [%s]", obs, tt.wantObs)
			}
			log.full = false
			recs := log.records(t)
			if tt.noRecord {
				if len(recs) != 0 {
					t.Fatalf("records %v, want none before the summary", recs)
				}
				p.FlushAudit()
				recs = log.records(t)
				if len(recs) != 1 || recs[0]["msg"] != "certificate requests refused (summary)" || recs[0]["door"] != tt.door || recs[0]["count"] != 1.0 {
					t.Fatalf("summary %v, want one of one refusal of door %s", recs, tt.door)
				}
				return
			}
			if len(recs) != 1 || recs[0]["msg"] != tt.wantMsg {
				t.Fatalf("records %v, want one %q", recs, tt.wantMsg)
			}
			for k, v := range tt.wantRec {
				if recs[0][k] != v {
					t.Errorf("record's %s = %v, want %v", k, recs[0][k], v)
				}
			}
		})
	}
}

// verdict is a policy that decides every request the same way.
func verdict(v issuance.Verdict, err error) issuance.Policy {
	return policyFunc(func() (issuance.Verdict, error) { return v, err })
}

type policyFunc func() (issuance.Verdict, error)

func (f policyFunc) Decide(context.Context, string, *issuance.Request, spiffeid.ID) (issuance.Verdict, error) {
	return f()
}

// A request whose caller went away is counted as canceled, whatever step
// it cut short.
func TestClassifyCallerGone(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if o := issuance.Classify(ctx, authz.ErrUnavailable); o.Result != issuance.ResultCanceled {
		t.Errorf("Classify = %+v, want canceled", o)
	}
	if o := issuance.Classify(ctx, nil); o.Result != issuance.ResultIssued {
		t.Errorf("Classify(nil) = %+v, want issued", o)
	}
}
