// Package testobs records in tests what the publishers tell their
// Observer.
package testobs

import (
	"sync"

	"k8s.io/client-go/kubernetes/fake"
)

// Results is an Observer of the trust publishers that keeps
// every result it is told. Safe for concurrent use.
type Results struct {
	mu      sync.Mutex
	results []string
}

// Published records result.
func (r *Results) Published(result string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.results = append(r.results, result)
}

// Count returns how many times result was recorded.
func (r *Results) Count(result string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, s := range r.results {
		if s == result {
			n++
		}
	}
	return n
}

// WriteVerbs returns the verbs of the create, update and delete calls a
// fake clientset was asked.
func WriteVerbs(client *fake.Clientset) []string {
	var out []string
	for _, a := range client.Actions() {
		if v := a.GetVerb(); v == "create" || v == "update" || v == "delete" {
			out = append(out, v)
		}
	}
	return out
}
