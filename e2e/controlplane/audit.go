package controlplane

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"
)

// DefaultAuditPolicy logs TokenReviews at Metadata level and nothing else.
// RequestReceived is omitted, so each request yields one ResponseComplete
// event.
const DefaultAuditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: Metadata
  resources:
  - group: authentication.k8s.io
    resources: ["tokenreviews"]
- level: None
`

// AuditEvent is the part of an audit.k8s.io/v1 Event that tests look at.
type AuditEvent struct {
	AuditID          string          `json:"auditID"`
	Stage            string          `json:"stage"`
	Verb             string          `json:"verb"`
	RequestURI       string          `json:"requestURI"`
	User             AuditUser       `json:"user"`
	ImpersonatedUser *AuditUser      `json:"impersonatedUser,omitempty"`
	ObjectRef        *AuditObjectRef `json:"objectRef,omitempty"`
	ResponseStatus   *struct {
		Code int `json:"code"`
	} `json:"responseStatus,omitempty"`
}

// AuditUser is the user of an audit event.
type AuditUser struct {
	Username string   `json:"username"`
	Groups   []string `json:"groups"`
}

// AuditObjectRef is the object of an audit event.
type AuditObjectRef struct {
	Resource    string `json:"resource"`
	Subresource string `json:"subresource"`
	Namespace   string `json:"namespace"`
	Name        string `json:"name"`
	APIGroup    string `json:"apiGroup"`
}

func (c *ControlPlane) writeAuditPolicy() error {
	c.auditLog = filepath.Join(c.workDir, "audit.log")
	policy := c.opts.AuditPolicy
	if policy == "" {
		policy = DefaultAuditPolicy
	}
	return os.WriteFile(filepath.Join(c.workDir, "audit-policy.yaml"), []byte(policy), 0o600)
}

// AuditLogPath returns the path of the JSON-lines audit log.
func (c *ControlPlane) AuditLogPath() string { return c.auditLog }

// AuditEvents parses the audit log. A missing log means no events.
func (c *ControlPlane) AuditEvents() ([]AuditEvent, error) {
	f, err := os.Open(c.auditLog)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var events []AuditEvent
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		var ev AuditEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			// The apiserver may be mid-write of the last line.
			continue
		}
		events = append(events, ev)
	}
	return events, sc.Err()
}

// CountAudit counts completed requests with verb (any if empty) on resource
// (e.g. "tokenreviews"). The apiserver writes the event just after sending
// the response, so a count taken right after a call may lag: use
// WaitAuditCount when the count must include that call.
func (c *ControlPlane) CountAudit(verb, resource string) (int, error) {
	events, err := c.AuditEvents()
	if err != nil {
		return 0, err
	}
	n := 0
	for _, ev := range events {
		if ev.Stage != "ResponseComplete" || ev.ObjectRef == nil || ev.ObjectRef.Resource != resource {
			continue
		}
		if verb == "" || ev.Verb == verb {
			n++
		}
	}
	return n, nil
}

// WaitAuditCount waits up to 5s until CountAudit(verb, resource) >= want and
// returns the last count.
func (c *ControlPlane) WaitAuditCount(ctx context.Context, verb, resource string, want int) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	for {
		n, err := c.CountAudit(verb, resource)
		if err != nil || n >= want {
			return n, err
		}
		select {
		case <-ctx.Done():
			return n, fmt.Errorf("audit: %d %s %s events, want >= %d", n, verb, resource, want)
		case <-time.After(50 * time.Millisecond):
		}
	}
}
