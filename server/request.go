package server

import (
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/workload-ca/workload-ca/authz"
	"github.com/workload-ca/workload-ca/issuance"
	"github.com/workload-ca/workload-ca/proto/capb"
)

// ImpersonatedIdentityKey is the request metadata key under which a node
// agent names the identity it asks a certificate for.
const ImpersonatedIdentityKey = "ImpersonatedIdentity"

// errInvalidRequest is wrapped by every malformed request.
var errInvalidRequest = issuance.ErrInvalidRequest

// impersonatedIdentity returns the ImpersonatedIdentity metadata value, or
// the zero ID when it is absent or empty.
func impersonatedIdentity(req *capb.IstioCertificateRequest) (spiffeid.ID, error) {
	v, ok := req.GetMetadata().GetFields()[ImpersonatedIdentityKey]
	if !ok {
		return spiffeid.ID{}, nil
	}
	str, isString := v.GetKind().(*structpb.Value_StringValue)
	if !isString {
		return spiffeid.ID{}, fmt.Errorf("%w: metadata %s must be a string", errInvalidRequest, ImpersonatedIdentityKey)
	}
	if str.StringValue == "" {
		return spiffeid.ID{}, nil
	}
	id, err := spiffeid.FromString(str.StringValue)
	if err != nil {
		return spiffeid.ID{}, fmt.Errorf("%w: metadata %s: %w", errInvalidRequest, ImpersonatedIdentityKey, err)
	}
	return id, nil
}

// seconds converts validity_duration; non-positive means the default and a
// value too large for a Duration saturates (the CA clamps it to its maximum).
func seconds(s int64) time.Duration {
	switch {
	case s <= 0:
		return 0
	case s > math.MaxInt64/int64(time.Second):
		return math.MaxInt64
	}
	return time.Duration(s) * time.Second
}

// ClusterIDKey is the request header in which ztunnel and istio-agent name
// the cluster they run in (Istio's default: "Kubernetes").
const ClusterIDKey = "clusterid"

// bearerToken returns the token of the `Bearer <token>` value of the
// authorization header. More than one value is refused: which credential
// the caller meant would be a guess.
func bearerToken(values []string) (string, error) {
	const prefix = "bearer "
	if len(values) > 1 {
		return "", fmt.Errorf("%w: %d authorization headers, want one", authz.ErrUnauthenticated, len(values))
	}
	for _, v := range values {
		if len(v) > len(prefix) && strings.EqualFold(v[:len(prefix)], prefix) {
			token := strings.TrimSpace(v[len(prefix):])
			if token == "" || len(token) > authz.MaxTokenSize {
				break
			}
			return token, nil
		}
	}
	return "", fmt.Errorf("%w: no bearer token in the authorization header", authz.ErrUnauthenticated)
}
