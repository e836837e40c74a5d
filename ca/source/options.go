package source

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"k8s.io/apimachinery/pkg/types"

	"github.com/workload-ca/workload-ca/ca"
	"github.com/workload-ca/workload-ca/ca/keystore"
	"github.com/workload-ca/workload-ca/ca/rotation"
	"github.com/workload-ca/workload-ca/ca/upstream/upstreamconfig"
	"github.com/workload-ca/workload-ca/internal/cliflag"
)

// Options are the flags of the authority and its material: the identities
// and lifetimes it issues, where its material comes from, and how a
// Secret's is rotated.
type Options struct {
	TrustDomain spiffeid.TrustDomain
	trustDomain string
	DefaultTTL  time.Duration
	MaxTTL      time.Duration

	Dir string
	// DirCreate lets a missing Dir be created, with a new self-signed
	// root in it.
	DirCreate bool
	Secret    types.NamespacedName
	secret    string
	RootDir   string
	// KeyURI names the signing key of Dir's certificate, or of RootDir's
	// root, in a KMS or HSM instead of a key file.
	KeyURI string
	// UpstreamFile is the file of --ca-upstream-config, Upstream what it
	// holds: the upstream CA that issues the intermediates.
	UpstreamFile string
	Upstream     *upstreamconfig.Config
	KeyType      string
	Poll         time.Duration

	CATTL       time.Duration
	Preview     time.Duration
	Propagation time.Duration
	SkewMargin  time.Duration
}

// AddFlags defines the flags in the sections Identities and lifetimes, CA
// material and Rotation.
func (o *Options) AddFlags(fs *cliflag.FlagSet) {
	fs.Section("Identities and lifetimes")
	fs.StringVar(&o.trustDomain, "trust-domain", "cluster.local", "SPIFFE trust domain of issued identities")
	fs.DurationVar(&o.DefaultTTL, "default-ttl", 24*time.Hour, "lifetime of a certificate when the request names none")
	fs.DurationVar(&o.MaxTTL, "max-ttl", ca.DefaultMaxTTL, "longest certificate lifetime; longer requests are clamped. Certificates cannot be revoked: this is how long a stolen one stays usable")
	fs.Section("CA material")
	fs.StringVar(&o.Dir, "ca-dir", "", "directory of CA material (Istio cacerts or tls.crt/tls.key/ca.crt layout), hot-reloaded; a self-signed root is generated there when empty")
	fs.BoolVar(&o.DirCreate, "ca-dir-create", false, "with --ca-dir: create the directory, and a self-signed root in it, when it does not exist; without this a missing directory is an error, so a mistyped path never starts a new CA (an existing empty directory still gets a generated root)")
	fs.StringVar(&o.secret, "ca-secret", "", "namespace/name of a Secret holding the CA's self-signed roots (or, with --ca-root-dir, intermediates) and rotation state; created by the first replica, rotated by the leader (instead of --ca-dir)")
	fs.StringVar(&o.RootDir, "ca-root-dir", "", "with --ca-secret: directory of a plug-in root CA (root-cert.pem, signing root first, and root-key.pem; or tls.crt, tls.key, ca.crt), reloaded when it changes; the CA signs with intermediates it mints from the root and rotates, kept in the Secret without the root key; the trust bundle is the directory's roots")
	fs.StringVar(&o.KeyURI, "ca-key-uri", "", "KMS or HSM URI (go.step.sm/crypto: pkcs11:, awskms:, cloudkms:, azurekms:, softkms:) of the key of --ca-dir's signing certificate or of --ca-root-dir's root, which the directory then holds without a key file; give a PKCS#11 PIN in a file (pin-source=/path)")
	fs.StringVar(&o.UpstreamFile, "ca-upstream-config", "", "with --ca-secret: YAML file naming an upstream CA (Vault or OpenBao PKI, or a cert-manager issuer) that issues the CA's intermediates to keys the CA generates; leaves are still signed here, the upstream is asked once per rotation, and the trust bundle is the upstream's root (see docs/upstream.md)")
	fs.StringVar(&o.KeyType, "ca-key-type", "ecdsa-p256", "key type of a generated root or intermediate: ecdsa-p256, ecdsa-p384, rsa-2048, rsa-3072, rsa-4096")
	fs.DurationVar(&o.Poll, "ca-dir-poll-interval", 5*time.Second, "how often --ca-dir or --ca-root-dir is checked for changed material (hot reload)")
	fs.Section("Rotation (with --ca-secret)")
	fs.DurationVar(&o.CATTL, "ca-ttl", rotation.DefaultCATTL, "with --ca-secret: lifetime of each generated root (or intermediate, cut at the root's expiry); rotation prepares the next at half-life")
	fs.DurationVar(&o.Preview, "rotation-preview", 0, "with --ca-secret and --publish-trust-bundle: how long a new root is published only in a preview ClusterTrustBundle (k8s.spiffe.io/canarying: preview) before the live one holds it; the propagation delay counts from then (0: no preview stage)")
	fs.DurationVar(&o.Propagation, "rotation-propagation-delay", rotation.DefaultPropagationDelay, "with --ca-secret: least time a new root is in the trust bundle before it signs, and with --ca-root-dir a new signing root before its intermediates do (rotating intermediates needs none: the bundle does not change)")
	fs.DurationVar(&o.SkewMargin, "rotation-skew-margin", rotation.DefaultSkewMargin, "with --ca-secret: how long a retired root stays in the trust bundle beyond --max-ttl (clock skew, replicas that switch signer late)")
	fs.Example("ca-dir", "/etc/cacerts")
	fs.Example("ca-secret", "istio-system/workload-ca")
	fs.Example("ca-root-dir", "/etc/root-ca")
	fs.Example("ca-key-uri", "pkcs11:token=ca;object=root?pin-source=/etc/pin")
	fs.Example("ca-upstream-config", "/etc/workload-ca/upstream.yaml")
}

// Validate checks the flags, every problem reported; it reads the
// upstream's file, not the material.
func (o *Options) Validate() error {
	var errs []error
	var err error
	if o.KeyURI != "" {
		if err := keystore.CheckKeyURI(o.KeyURI); err != nil {
			errs = append(errs, fmt.Errorf("--ca-key-uri: %w", err))
		}
	}
	if err := keystore.CheckKeyType(o.KeyType); err != nil {
		errs = append(errs, fmt.Errorf("--ca-key-type: %w", err))
	}
	if o.TrustDomain, err = spiffeid.TrustDomainFromString(o.trustDomain); err != nil {
		errs = append(errs, fmt.Errorf("--trust-domain: %w", err))
	}
	errs = append(errs, o.validateSource()...)
	if o.DefaultTTL <= 0 || o.MaxTTL < o.DefaultTTL {
		errs = append(errs, fmt.Errorf("--default-ttl %v must be positive and at most --max-ttl %v", o.DefaultTTL, o.MaxTTL))
	}
	if o.Poll <= 0 {
		errs = append(errs, errors.New("--ca-dir-poll-interval must be positive"))
	}
	return errors.Join(errs...)
}

// validateSource checks the source: exactly one of --ca-dir and
// --ca-secret, --ca-root-dir only with --ca-secret, and a rotation policy
// that fits the leaf lifetimes.
func (o *Options) validateSource() []error {
	switch {
	case o.RootDir != "" && o.secret == "":
		return []error{errors.New("--ca-root-dir requires --ca-secret (the intermediates it issues are kept there)")}
	case o.UpstreamFile != "" && o.secret == "":
		return []error{errors.New("--ca-upstream-config requires --ca-secret (the intermediates the upstream issues are kept there)")}
	case o.UpstreamFile != "" && (o.RootDir != "" || o.KeyURI != ""):
		return []error{errors.New("--ca-upstream-config excludes --ca-root-dir and --ca-key-uri: the upstream issues the intermediates, whose keys are kept in --ca-secret")}
	case o.KeyURI != "" && o.Dir == "" && o.RootDir == "":
		return []error{errors.New("--ca-key-uri requires --ca-dir or --ca-root-dir (the directory of the key's certificate)")}
	case (o.Dir == "") == (o.secret == ""):
		return []error{errors.New("exactly one of --ca-dir and --ca-secret is required")}
	case o.Dir != "":
		return o.validateDir()
	}
	return o.validateSecret()
}

// validateSecret checks --ca-secret, the upstream's file and the rotation
// policy.
func (o *Options) validateSecret() []error {
	ns, name, ok := strings.Cut(o.secret, "/")
	if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
		return []error{fmt.Errorf("--ca-secret %q: want namespace/name", o.secret)}
	}
	o.Secret = types.NamespacedName{Namespace: ns, Name: name}
	if o.UpstreamFile != "" {
		u, err := upstreamconfig.Load(o.UpstreamFile, ns)
		if err != nil {
			return []error{fmt.Errorf("--ca-upstream-config: %w", err)}
		}
		o.Upstream = u
	}
	if _, err := o.RotationPolicy(); err != nil {
		if short := (*rotation.TooShortError)(nil); errors.As(err, &short) {
			return []error{fmt.Errorf("--ca-ttl %v is too short: the next CA is prepared at %.0f%% of its life, and what is left must cover --max-ttl %v plus --rotation-preview and --rotation-propagation-delay %v; want --ca-ttl of at least %v",
				short.CATTL, 100*short.PrepareAt, o.MaxTTL, o.Preview+o.Propagation, short.Least.Round(time.Hour))}
		}
		return []error{fmt.Errorf("rotation policy (--ca-ttl, --rotation-preview, --rotation-propagation-delay, --rotation-skew-margin, --max-ttl): %w", err)}
	}
	return nil
}

// validateDir refuses a --ca-dir that does not exist unless
// --ca-dir-create asks for it: a mistyped path would otherwise start a new
// CA with a new root that nothing trusts.
func (o *Options) validateDir() []error {
	fi, err := os.Stat(o.Dir)
	switch {
	case err == nil && !fi.IsDir():
		return []error{fmt.Errorf("--ca-dir %s is not a directory", o.Dir)}
	case err == nil, errors.Is(err, os.ErrNotExist) && o.DirCreate:
		return nil
	case errors.Is(err, os.ErrNotExist):
		return []error{fmt.Errorf("--ca-dir %s does not exist (a mistyped path?); --ca-dir-create makes it and a new self-signed root there", o.Dir)}
	}
	return []error{fmt.Errorf("--ca-dir: %w", err)}
}

// RotationPolicy is the rotation policy the flags describe; the longest
// leaf the CA issues bounds how long an old root must stay trusted.
func (o *Options) RotationPolicy() (rotation.Policy, error) {
	if o.SkewMargin <= 0 {
		// Policy reads a zero margin as "the default"; refuse rather than
		// silently keep a retired root for an hour.
		return rotation.Policy{}, fmt.Errorf("--rotation-skew-margin %v must be positive", o.SkewMargin)
	}
	return rotation.Policy{CATTL: o.CATTL, PropagationDelay: o.Propagation, Preview: o.Preview, LeafMaxTTL: o.MaxTTL, SkewMargin: o.SkewMargin}.WithDefaults()
}

// SignsRemotely reports whether a KMS or HSM key (not a file through
// softkms) signs every leaf: --ca-key-uri with --ca-dir.
func (o *Options) SignsRemotely() bool {
	return o.Dir != "" && keystore.SignsRemotely(o.KeyURI)
}

// authority is the configuration of the authority the flags describe.
func (o *Options) authority() ca.Config {
	return ca.Config{TrustDomain: o.TrustDomain, DefaultTTL: o.DefaultTTL, MaxTTL: o.MaxTTL}
}
