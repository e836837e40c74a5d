package ca

import (
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"k8s.io/utils/clock"
)

// Defaults applied by New to zero Config fields.
//
// DefaultMaxTTL bounds how long a stolen certificate stays usable: SVIDs
// have no revocation, so a certificate is good until it expires whatever
// happens to its pod, token or service account. ztunnel and istio-agent
// ask for 24 hours and renew at half of it; a longer cap buys them
// nothing, and a request for more (SECRET_TTL, a PodCertificateRequest's
// maxExpirationSeconds up to 91 days) is clamped to it.
const (
	DefaultTTL      = 24 * time.Hour
	DefaultMaxTTL   = 24 * time.Hour
	DefaultBackdate = 2 * time.Minute
)

// Config tunes an Authority. Zero fields take the defaults above; only
// TrustDomain is required.
type Config struct {
	// TrustDomain is the only trust domain the authority issues identities in.
	TrustDomain spiffeid.TrustDomain
	// DefaultTTL is the lifetime given when a request asks for none.
	DefaultTTL time.Duration
	// MaxTTL caps every requested lifetime (requests over it are clamped).
	MaxTTL time.Duration
	// Backdate moves NotBefore into the past to absorb clock skew.
	Backdate time.Duration
	// Clock is the source of "now"; tests inject a fake one.
	Clock clock.PassiveClock
	// Rand is the entropy for serial numbers and signatures.
	Rand io.Reader
}

// withDefaults returns a copy of c with zero fields defaulted, or an error
// if the configuration cannot work.
func (c Config) withDefaults() (Config, error) {
	if c.TrustDomain.IsZero() {
		return c, errors.New("ca: config: trust domain is required")
	}
	if c.MaxTTL <= 0 {
		c.MaxTTL = DefaultMaxTTL
	}
	if c.DefaultTTL <= 0 {
		c.DefaultTTL = min(DefaultTTL, c.MaxTTL)
	}
	if c.Backdate <= 0 {
		c.Backdate = DefaultBackdate
	}
	if c.Clock == nil {
		c.Clock = clock.RealClock{}
	}
	if c.Rand == nil {
		c.Rand = rand.Reader
	}
	if c.DefaultTTL > c.MaxTTL {
		return c, fmt.Errorf("ca: config: default TTL %v exceeds max TTL %v", c.DefaultTTL, c.MaxTTL)
	}
	return c, nil
}

// clampTTL turns a requested lifetime into the one granted: the default
// when none is asked for, at most MaxTTL. It never rejects: ztunnel
// retries forever on errors, so a refusal would loop.
func (c *Config) clampTTL(ttl time.Duration) time.Duration {
	switch {
	case ttl <= 0:
		return c.DefaultTTL
	case ttl > c.MaxTTL:
		return c.MaxTTL
	default:
		return ttl
	}
}
