package server

import (
	"crypto/tls"
	"errors"
	"fmt"
	"time"

	"github.com/workload-ca/workload-ca/internal/cliflag"
)

// Options are the gRPC door's flags: where it listens and with which
// serving certificate, how much load it takes, and how it shuts down.
type Options struct {
	ListenAddr    string
	DNSNames      cliflag.List
	ServingTTL    time.Duration
	TLSMinVersion uint16
	tlsMin        string

	// MaxConcurrentSigns 0 is the number of CPUs (see SetSignsDefault).
	MaxConcurrentSigns int
	SignQueueTimeout   time.Duration
	MaxQueued          int
	MaxQueuedPerNode   int
	MaxStreams         int
	BusyConns          int
	BusyMaxStreams     int
	MaxConnIdle        time.Duration
	MaxConnAge         time.Duration
	MaxConns           int
	AuthDeadline       time.Duration
	MaxUnauthPerAddr   int
	MaxHeaderBytes     int

	GracePeriod   time.Duration
	ShutdownDelay time.Duration
}

// AddFlags defines the door's flags in the sections Serving, Overload and
// connection limits, and Shutdown.
func (o *Options) AddFlags(fs *cliflag.FlagSet) {
	o.DNSNames = cliflag.List{"localhost"}
	fs.Section("Serving")
	fs.StringVar(&o.ListenAddr, "listen-addr", ":15012", "gRPC listen address")
	fs.Var(&o.DNSNames, "serving-dns-names", "comma-separated DNS names of the serving certificate (the names clients dial)")
	fs.DurationVar(&o.ServingTTL, "serving-ttl", 24*time.Hour, "lifetime of the serving certificate; renewed after two thirds")
	fs.StringVar(&o.tlsMin, "tls-min-version", "1.3", "minimum TLS version: 1.3 or 1.2")
	o.addLimitFlags(fs)
	fs.Section("Shutdown")
	fs.DurationVar(&o.GracePeriod, "grace-period", 15*time.Second, "how long in-flight requests may take at shutdown")
	fs.DurationVar(&o.ShutdownDelay, "shutdown-delay", 5*time.Second, "how long the CA keeps serving, new connections included, after SIGTERM and before it drains: the time the cluster takes to stop routing to a terminating pod")
	fs.Example("max-concurrent-signs", "2")
}

func (o *Options) addLimitFlags(fs *cliflag.FlagSet) {
	fs.Section("Overload and connection limits")
	fs.IntVar(&o.MaxConcurrentSigns, "max-concurrent-signs", 0, "concurrent CSR checks and signatures (default: the number of CPUs the process may use; 64 when a KMS or HSM key of --ca-key-uri signs the leaves)")
	fs.DurationVar(&o.SignQueueTimeout, "sign-queue-timeout", DefaultQueueTimeout, "the longest a request waits for a signing slot; one whose turn would come later (or after its deadline) is refused at once with Unavailable and a time to come back")
	fs.IntVar(&o.MaxQueued, "max-queued-requests", DefaultMaxQueued, "requests that may wait for a signing slot; beyond, they are refused at once with Unavailable and a time to come back")
	fs.IntVar(&o.MaxQueuedPerNode, "max-queued-per-node", DefaultMaxQueuedPerNode, "requests from one node (its node agent and pods) that may wait for a signing slot, so that no node takes the queue")
	fs.IntVar(&o.MaxStreams, "max-streams-per-connection", DefaultMaxStreamsPerConnection, "requests one client connection may have in flight (HTTP/2 concurrent streams); a client wanting more queues them itself")
	fs.IntVar(&o.BusyConns, "busy-connections", DefaultBusyConnections, "open client connections from which a new connection may have only --busy-max-streams requests in flight, for as long as it lives; 0: every connection gets --max-streams-per-connection")
	fs.IntVar(&o.BusyMaxStreams, "busy-max-streams", DefaultBusyMaxStreams, "requests a connection accepted while --busy-connections are open may have in flight")
	fs.IntVar(&o.MaxConns, "max-connections", DefaultMaxConnections, "client connections open at once; a connection beyond waits to be accepted until one closes")
	fs.DurationVar(&o.AuthDeadline, "unauthenticated-connection-deadline", DefaultAuthDeadline, "close a client connection on which no caller has authenticated within this long of its being accepted (requests in flight then get as long again), freeing its slot; ztunnel and istio-agent send a CSR as soon as they connect; 0: never")
	fs.IntVar(&o.MaxUnauthPerAddr, "max-unauthenticated-connections-per-address", 0, "client connections from one source address on which no caller has authenticated yet; one beyond is closed at once; 0: no bound (a NAT or an east-west gateway puts many clients behind one address)")
	fs.DurationVar(&o.MaxConnIdle, "max-connection-idle", DefaultMaxConnectionIdle, "close a client connection no request has used for this long; 0: never")
	fs.DurationVar(&o.MaxConnAge, "max-connection-age", 30*time.Minute, "close each client connection after about this long (in-flight requests get --grace-period), so ztunnels spread over replicas added or restarted since they connected; 0: never")
	fs.IntVar(&o.MaxHeaderBytes, "max-header-bytes", DefaultMaxHeaderListSize, "request metadata of one request, as HTTP/2 counts it; a larger request is refused before any check")
}

// KMSConcurrentSigns is --max-concurrent-signs by default when a KMS or
// HSM key signs every leaf (--ca-key-uri with --ca-dir): a signature then
// waits on the KMS, not on our CPU, and slots sized to the CPUs would
// bound the rate to CPUs / round trip (a 2-CPU CA on a KMS 50 ms away: 40
// certificates a second). 64 slots allow 1,280.
const KMSConcurrentSigns = 64

// SetSignsDefault sets --max-concurrent-signs, when it was not given, to
// KMSConcurrentSigns if a KMS or HSM key signs every leaf (remote), else
// leaves it 0, which NewService reads as the number of CPUs.
func (o *Options) SetSignsDefault(remote bool) {
	if o.MaxConcurrentSigns == 0 && remote {
		o.MaxConcurrentSigns = KMSConcurrentSigns
	}
}

// Validate checks the door's flags, every problem reported.
func (o *Options) Validate() error {
	var errs []error
	switch o.tlsMin {
	case "1.3":
		o.TLSMinVersion = tls.VersionTLS13
	case "1.2":
		o.TLSMinVersion = tls.VersionTLS12
	default:
		errs = append(errs, fmt.Errorf("--tls-min-version %q: want 1.3 or 1.2", o.tlsMin))
	}
	if len(o.DNSNames) == 0 || o.ServingTTL <= 0 {
		errs = append(errs, errors.New("--serving-dns-names and a positive --serving-ttl are required"))
	}
	if o.GracePeriod <= 0 || o.ShutdownDelay < 0 || o.MaxConnAge < 0 || o.MaxConnIdle < 0 || o.AuthDeadline < 0 || o.MaxUnauthPerAddr < 0 {
		errs = append(errs, errors.New("--grace-period must be positive; --shutdown-delay, --max-connection-age, --max-connection-idle, --unauthenticated-connection-deadline and --max-unauthenticated-connections-per-address not negative"))
	}
	if o.MaxConns <= 0 || o.MaxHeaderBytes < 1024 || o.MaxHeaderBytes > 1<<20 {
		errs = append(errs, errors.New("--max-connections must be positive, --max-header-bytes within 1 KiB and 1 MiB"))
	}
	if o.SignQueueTimeout <= 0 || o.MaxQueued <= 0 || o.MaxQueuedPerNode <= 0 || o.MaxStreams <= 0 || o.BusyMaxStreams <= 0 {
		errs = append(errs, errors.New("--sign-queue-timeout, --max-queued-requests, --max-queued-per-node, --max-streams-per-connection and --busy-max-streams must be positive"))
	}
	if o.BusyConns < 0 {
		errs = append(errs, errors.New("--busy-connections must be 0 (no busy tier) or more"))
	}
	return errors.Join(errs...)
}
