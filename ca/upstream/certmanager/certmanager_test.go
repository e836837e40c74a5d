package certmanager

import (
	"encoding/base64"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/workload-ca/workload-ca/internal/testca"
)

func b64(cas ...*testca.CA) string {
	return base64.StdEncoding.EncodeToString(testca.BundlePEM(cas...))
}

func request(status map[string]any) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{"status": status}}
}

func cond(typ, status, reason, message string) any {
	return map[string]any{"type": typ, "status": status, "reason": reason, "message": message}
}

// parseStatus follows a CertificateRequest to its end: issued and
// approved (the certificate, its issuer's chain and the root in status.ca,
// once each), denied, failed, invalid, or issued without approval;
// anything else is still pending.
func TestParseStatus(t *testing.T) {
	root := testca.NewRoot(t, testca.P256)
	mid := testca.NewIntermediate(t, root, testca.P256)
	ours := testca.NewIntermediate(t, mid, testca.P256)
	approved := []any{cond("Approved", "True", "cert-manager.io", "approved by the approver")}
	tests := []struct {
		name      string
		status    map[string]any
		done      bool
		wantChain int
		wantErr   string
	}{
		{"new", map[string]any{}, false, 0, ""},
		{"approved, not signed yet", map[string]any{"conditions": []any{cond("Approved", "True", "cert-manager.io", ""),
			cond("Ready", "False", "Pending", "waiting")}}, false, 0, ""},
		{"issued by a root", map[string]any{"conditions": approved, "certificate": b64(ours), "ca": b64(mid)}, true, 1, ""},
		{"issued with the issuer's chain and root", map[string]any{"conditions": approved, "certificate": b64(ours, mid), "ca": b64(root)}, true, 2, ""},
		{"the root in both", map[string]any{"conditions": approved, "certificate": b64(ours, mid, root), "ca": b64(root)}, true, 2, ""},
		{"denied", map[string]any{"conditions": []any{cond("Denied", "True", "policy.cert-manager.io", "isCA not allowed")}}, true, 0, "isCA not allowed"},
		{"failed", map[string]any{"conditions": []any{cond("Ready", "False", "Failed", "issuer not ready")}}, true, 0, "issuer not ready"},
		{"invalid", map[string]any{"conditions": []any{cond("InvalidRequest", "True", "", "bad usages")}}, true, 0, "bad usages"},
		{"garbage certificate", map[string]any{"conditions": approved, "certificate": base64.StdEncoding.EncodeToString([]byte("nope"))}, true, 0, "status.certificate"},
		// A certificate is used only on an approved request.
		{"a certificate without approval is refused", map[string]any{"certificate": b64(ours), "ca": b64(mid)}, true, 0, "not approved"},
		{"a certificate with Approved=False is refused", map[string]any{"conditions": []any{cond("Approved", "False", "", "")},
			"certificate": b64(ours), "ca": b64(mid)}, true, 0, "not approved"},
		{"a certificate on a denied request is refused", map[string]any{"conditions": []any{
			cond("Approved", "True", "cert-manager.io", ""), cond("Denied", "True", "policy", "no")},
			"certificate": b64(ours), "ca": b64(mid)}, true, 0, "denied"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			issued, done, err := parseStatus(request(tt.status))
			if done != tt.done {
				t.Fatalf("done = %v, want %v", done, tt.done)
			}
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if done && (!issued.Cert.Equal(ours.Cert) || len(issued.Chain) != tt.wantChain) {
				t.Fatalf("issued %v with %d chain certificates, want ours and %d", issued.Cert, len(issued.Chain), tt.wantChain)
			}
		})
	}
}
