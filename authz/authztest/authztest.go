// Package authztest holds small in-memory fakes of the authentication and
// pod-lookup contracts, for tests of the policy and the server.
package authztest

import (
	"context"
	"fmt"
	"sync"

	"github.com/workload-ca/workload-ca/authz"
)

// Authenticator maps tokens to callers. Unknown tokens are unauthenticated;
// Err, when set, is returned for every token.
type Authenticator struct {
	Callers map[string]authz.Caller
	Err     error
}

// Authenticate implements the server's Authenticator.
func (a *Authenticator) Authenticate(_ context.Context, token string) (authz.Caller, error) {
	if a.Err != nil {
		return authz.Caller{}, a.Err
	}
	c, ok := a.Callers[token]
	if !ok {
		return authz.Caller{}, fmt.Errorf("%w: unknown test token", authz.ErrUnauthenticated)
	}
	return c, nil
}

// Pods is an in-memory authz.Pods.
type Pods struct {
	mu   sync.Mutex
	pods map[string]pod // by uid
	Err  error
}

type pod struct {
	namespace, name string
	info            authz.PodInfo
}

// Add records a live pod.
func (p *Pods) Add(namespace, name string, info authz.PodInfo) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.pods == nil {
		p.pods = map[string]pod{}
	}
	p.pods[info.UID] = pod{namespace: namespace, name: name, info: info}
}

// Pod implements authz.Pods.
func (p *Pods) Pod(_ context.Context, namespace, name, uid string) (authz.PodInfo, bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.Err != nil {
		return authz.PodInfo{}, false, p.Err
	}
	got, ok := p.pods[uid]
	if !ok || got.namespace != namespace || got.name != name {
		return authz.PodInfo{}, false, nil
	}
	return got.info, true, nil
}

// ServiceAccountOnNode implements authz.Pods.
func (p *Pods) ServiceAccountOnNode(_ context.Context, node, namespace, serviceAccount string) (bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.Err != nil {
		return false, p.Err
	}
	for _, got := range p.pods {
		if got.namespace == namespace && got.info.ServiceAccount == serviceAccount && got.info.NodeName == node {
			return true, nil
		}
	}
	return false, nil
}
