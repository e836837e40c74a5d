package rootset

import (
	"crypto/x509"
	"errors"
	"fmt"
	"strings"
)

// ErrDNSUnconstrained is wrapped when a root may vouch for one of our DNS
// names.
var ErrDNSUnconstrained = errors.New("root may vouch for our DNS names")

// KeepsOffDNS returns an error wrapping ErrDNSUnconstrained unless the
// name constraints of root c keep it off every DNS name at or under each
// of domains (e.g. "svc", "cluster.local"): for each domain, either an
// excluded DNS subtree is the domain, a parent of it, or empty (every
// name), or the root permits DNS subtrees and none of them is the domain,
// a parent of it, or under it. A root without DNS name constraints may
// vouch for any DNS name, ours included.
//
// The rule is strict on purpose: a leading dot (".example.com", only
// names below) is read like the domain itself, and a permitted subtree
// that an exclusion narrows still counts as overlapping.
func KeepsOffDNS(c *x509.Certificate, domains []string) error {
	for _, d := range domains {
		d = normDomain(d)
		if d == "" {
			continue
		}
		if excludes(c.ExcludedDNSDomains, d) {
			continue
		}
		if len(c.PermittedDNSDomains) == 0 {
			return fmt.Errorf("%w: root %q has no permitted DNS subtrees, so it may vouch for names under %q", ErrDNSUnconstrained, c.Subject, d)
		}
		for _, p := range c.PermittedDNSDomains {
			if overlaps(normDomain(p), d) {
				return fmt.Errorf("%w: root %q permits DNS subtree %q, which overlaps %q", ErrDNSUnconstrained, c.Subject, p, d)
			}
		}
	}
	return nil
}

// excludes reports whether an excluded subtree covers domain d and every
// name under it.
func excludes(excluded []string, d string) bool {
	for _, e := range excluded {
		if e = normDomain(e); e == "" || within(d, e) {
			return true
		}
	}
	return false
}

// overlaps reports whether subtrees a and b share a name: one is the
// other or under it. The empty subtree holds every name.
func overlaps(a, b string) bool { return a == "" || b == "" || within(a, b) || within(b, a) }

// within reports whether name is parent or under it.
func within(name, parent string) bool {
	return name == parent || strings.HasSuffix(name, "."+parent)
}

// normDomain lower-cases d and drops a leading dot and a trailing one.
func normDomain(d string) string {
	return strings.TrimSuffix(strings.TrimPrefix(strings.ToLower(d), "."), ".")
}
