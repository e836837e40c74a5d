package authz

import (
	"fmt"
	"strings"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"k8s.io/apimachinery/pkg/util/validation"
)

// The one form of a workload's identity: spiffe://<td>/ns/<ns>/sa/<sa>,
// built by WorkloadID and read back by workload, here only.

// WorkloadID is the SPIFFE ID of service account sa in namespace ns.
func WorkloadID(td spiffeid.TrustDomain, ns, sa string) (spiffeid.ID, error) {
	return spiffeid.FromSegments(td, "ns", ns, "sa", sa)
}

// SplitWorkload reads namespace and service account from an identity of
// the form spiffe://<td>/ns/<ns>/sa/<sa>; ok is false for another form. It
// does not check that Kubernetes could hold the names (workload does).
// It cuts the path in place rather than splitting it: this runs on every
// impersonation request.
func SplitWorkload(id spiffeid.ID) (ns, sa string, ok bool) {
	rest, ok := strings.CutPrefix(id.Path(), "/ns/")
	if ok {
		ns, rest, ok = strings.Cut(rest, "/")
	}
	if ok {
		sa, ok = strings.CutPrefix(rest, "sa/")
	}
	if !ok || ns == "" || sa == "" || strings.Contains(sa, "/") {
		return "", "", false
	}
	return ns, sa, true
}

// workload extracts namespace and service account from an identity of the
// form spiffe://<td>/ns/<ns>/sa/<sa>, names Kubernetes can hold.
func workload(id spiffeid.ID) (ns, sa string, err error) {
	ns, sa, ok := SplitWorkload(id)
	if !ok {
		return "", "", fmt.Errorf("identity %s is not of the form spiffe://<trust domain>/ns/<namespace>/sa/<service account>", id)
	}
	// Names Kubernetes cannot hold never cost a pod lookup.
	if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
		return "", "", fmt.Errorf("identity %s names a namespace Kubernetes cannot hold: %s", id, errs[0])
	}
	if errs := validation.IsDNS1123Subdomain(sa); len(errs) > 0 {
		return "", "", fmt.Errorf("identity %s names a service account Kubernetes cannot hold: %s", id, errs[0])
	}
	return ns, sa, nil
}
