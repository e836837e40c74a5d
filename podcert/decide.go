package podcert

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	certv1 "k8s.io/api/certificates/v1"

	"github.com/workload-ca/workload-ca/authz"
	"github.com/workload-ca/workload-ca/ca"
	"github.com/workload-ca/workload-ca/issuance"
)

// Reasons of a Denied condition. UnsupportedKeyType and
// InvalidUnverifiedUserAnnotations are the ones Kubernetes defines; the
// kubelet may retry the first with a key type the message names.
const (
	ReasonUnsupportedKeyType     = certv1.PodCertificateRequestConditionUnsupportedKeyType
	ReasonInvalidUserAnnotations = certv1.PodCertificateRequestConditionInvalidUserConfig
	ReasonInvalidRequest         = "InvalidRequest"
	// ReasonPodMismatch: the pod, node or service account the request
	// names is not what the cluster runs.
	ReasonPodMismatch = "PodMismatch"
	// ReasonDenied: refused by a rule of the CA's other than the above.
	ReasonDenied = "Denied"
)

// supportedKeyTypes is what a denial for an unsupported key suggests, in
// the names of the kubelet's podCertificate volume (keyType).
const supportedKeyTypes = "ECDSAP256, ECDSAP384, RSA3072, RSA4096 or ED25519"

// defaultMaxExpiration is what the API server defaults
// spec.maxExpirationSeconds to.
const defaultMaxExpiration = 24 * time.Hour

// decision is what to do with one pending request: sign req, or deny it.
type decision struct {
	req    ca.Request
	reason string // non-empty: deny with this reason and message
	msg    string
}

func deny(reason, format string, args ...any) decision {
	return decision{reason: reason, msg: fmt.Sprintf(format, args...)}
}

// denial is a decision to deny as an error, for the pipeline: it wraps
// what the pipeline classifies the denial as (a malformed request, or a
// pod the cluster does not run).
type denial struct {
	reason, msg string
	err         error
}

func (d *denial) Error() string { return d.msg }
func (d *denial) Unwrap() error { return d.err }

// err is the denial of d.
func (d decision) err() error {
	wrapped := issuance.ErrInvalidRequest
	if d.reason == ReasonPodMismatch {
		wrapped = authz.Deny(authz.ReasonPodMismatch, "%s", d.msg)
	}
	return &denial{reason: d.reason, msg: d.msg, err: wrapped}
}

// decide checks a pending request and says what to issue: the X.509-SVID
// of the pod's service account, spiffe://<td>/ns/<namespace>/sa/<name>,
// for the key of the stub CSR, valid for maxExpirationSeconds (at least the
// hour Kubernetes requires) or the CA's longest lifetime if shorter.
// The API server verified the CSR's signature; decide checks the CSR
// again anyway (ca.ParseCSR), and the controller checks the pod, node and
// service account against its indexes (checkRequester). It denies requests
// with user annotations (it understands none, and Kubernetes asks signers
// to refuse what they do not understand) and keys the CA does not issue
// to.
func decide(it *item, td spiffeid.TrustDomain) decision {
	pcr := it.PodCertificateRequest
	if n := len(pcr.Spec.UnverifiedUserAnnotations); n > 0 {
		return deny(ReasonInvalidUserAnnotations, "this signer understands no unverifiedUserAnnotations; %d given", n)
	}
	var csr *x509.CertificateRequest
	if len(pcr.Spec.StubPKCS10Request) == 0 && len(it.pkixPublicKey) > 0 {
		var d decision
		if csr, d = legacyKey(it); d.reason != "" {
			return d
		}
	} else {
		stub, err := x509.ParseCertificateRequest(pcr.Spec.StubPKCS10Request)
		if err != nil {
			return deny(ReasonInvalidRequest, "stubPKCS10Request does not parse: %v", err)
		}
		if err := ca.CheckPublicKey(stub.PublicKey); err != nil {
			return deny(ReasonUnsupportedKeyType, "%v; use %s", err, supportedKeyTypes)
		}
		if csr, err = ca.ParseCSR(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: pcr.Spec.StubPKCS10Request})); err != nil {
			return deny(ReasonInvalidRequest, "%v", err)
		}
	}
	id, err := authz.WorkloadID(td, pcr.Namespace, pcr.Spec.ServiceAccountName)
	if err != nil {
		return deny(ReasonInvalidRequest, "no SPIFFE ID for service account %s/%s: %v", pcr.Namespace, pcr.Spec.ServiceAccountName, err)
	}
	maxValidity := defaultMaxExpiration
	if s := pcr.Spec.MaxExpirationSeconds; s != nil {
		maxValidity = time.Duration(*s) * time.Second
	}
	// The lifetime asked for is the request's, not the CA's default TTL
	// (which may be under the hour Kubernetes requires).
	return decision{req: ca.Request{CSR: csr, ID: id, TTL: maxValidity, MaxValidity: maxValidity}}
}

// legacyKey is the key of a v1beta1 request in its deprecated form (a
// 1.35 kubelet's): a PKIX public key, and a proof of possession, the
// key's signature of the pod's UID, which the API server verified at
// creation and decide verifies again, as it does a stub CSR's signature.
// The certificate request it returns holds only the key.
func legacyKey(it *item) (*x509.CertificateRequest, decision) {
	pub, err := x509.ParsePKIXPublicKey(it.pkixPublicKey)
	if err != nil {
		return nil, deny(ReasonInvalidRequest, "pkixPublicKey does not parse: %v", err)
	}
	if err := ca.CheckPublicKey(pub); err != nil {
		return nil, deny(ReasonUnsupportedKeyType, "%v; use %s", err, supportedKeyTypes)
	}
	sum := sha256.Sum256([]byte(it.Spec.PodUID))
	var ok bool
	switch k := pub.(type) {
	case *ecdsa.PublicKey:
		ok = ecdsa.VerifyASN1(k, sum[:], it.proofOfPossession)
	case *rsa.PublicKey:
		ok = rsa.VerifyPSS(k, crypto.SHA256, sum[:], it.proofOfPossession, nil) == nil
	case ed25519.PublicKey:
		ok = ed25519.Verify(k, []byte(it.Spec.PodUID), it.proofOfPossession)
	}
	if !ok {
		return nil, deny(ReasonInvalidRequest, "proofOfPossession is not the key's signature of the pod's UID")
	}
	return &x509.CertificateRequest{PublicKey: pub}, decision{}
}

// refreshAt is when the kubelet should start renewing a certificate valid
// from notBefore to notAfter: halfway, as SPIRE and Istio renew, kept in
// the window the API server accepts (10 minutes inside either end).
func refreshAt(notBefore, notAfter time.Time) time.Time {
	at := notBefore.Add(notAfter.Sub(notBefore) / 2)
	if lo := notBefore.Add(10 * time.Minute); at.Before(lo) {
		at = lo
	}
	return at
}
