package caclient

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/pem"
	"errors"
	"fmt"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/workload-ca/workload-ca/proto/capb"
)

// Config is how to reach the CA.
type Config struct {
	// Address is host:port of the CA.
	Address string
	// Roots verify the CA's serving certificate.
	Roots *x509.CertPool
	// ServerName overrides the host name checked in the serving certificate
	// (ztunnel's ALT_CA_HOSTNAME); default the host of Address.
	ServerName string
	// DialOptions are added to the connection's options.
	DialOptions []grpc.DialOption
}

// Client is a connection to the CA.
type Client struct {
	conn *grpc.ClientConn
	svc  capb.IstioCertificateServiceClient
}

// Dial connects to the CA over TLS 1.3 (the connection is made lazily).
func Dial(cfg Config) (*Client, error) {
	if cfg.Roots == nil {
		return nil, errors.New("caclient: roots to verify the CA are required")
	}
	tlsCfg := &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: cfg.Roots, ServerName: cfg.ServerName}
	opts := append([]grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(tlsCfg))}, cfg.DialOptions...)
	conn, err := grpc.NewClient(cfg.Address, opts...)
	if err != nil {
		return nil, fmt.Errorf("caclient: %w", err)
	}
	return &Client{conn: conn, svc: capb.NewIstioCertificateServiceClient(conn)}, nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// Request is one certificate request.
type Request struct {
	// Token is the bearer token (a pod-bound service-account JWT).
	Token string
	// Identity is the SPIFFE ID asked for; it is put in the CSR.
	Identity spiffeid.ID
	// Impersonate sends Identity as ImpersonatedIdentity metadata, as
	// ztunnel does for the workloads on its node.
	Impersonate bool
	// TTL is the requested lifetime (validity_duration); zero for 24h.
	TTL time.Duration
	// Key is the key to certify; a new P-256 key when nil.
	Key crypto.Signer
	// ClusterID is sent as the clusterid header; default DefaultClusterID.
	ClusterID string
}

// DefaultClusterID is the cluster id ztunnel sends unless configured
// otherwise (Istio's default).
const DefaultClusterID = "Kubernetes"

// Result is a checked response.
type Result struct {
	Key   crypto.Signer
	Leaf  *x509.Certificate
	Chain []*x509.Certificate // intermediates, leaf excluded, roots excluded
	Roots []*x509.Certificate
	PEM   []string // the response as received
}

// CreateCertificate asks for a certificate and checks the response as
// ztunnel does.
func (c *Client) CreateCertificate(ctx context.Context, r Request) (*Result, error) {
	key := r.Key
	if key == nil {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return nil, err
		}
		key = k
	}
	csr, err := NewCSR(key, r.Identity)
	if err != nil {
		return nil, err
	}
	req := &capb.IstioCertificateRequest{Csr: string(csr), ValidityDuration: int64(ttlOr24h(r.TTL) / time.Second)}
	if r.Impersonate {
		req.Metadata = &structpb.Struct{Fields: map[string]*structpb.Value{
			"ImpersonatedIdentity": structpb.NewStringValue(r.Identity.String()),
		}}
	}
	clusterID := r.ClusterID
	if clusterID == "" {
		clusterID = DefaultClusterID
	}
	ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+r.Token, "clusterid", clusterID)
	resp, err := c.svc.CreateCertificate(ctx, req)
	if err != nil {
		return nil, err
	}
	res, err := CheckResponse(resp.GetCertChain(), r.Identity)
	if err != nil {
		return nil, err
	}
	res.Key = key
	return res, nil
}

func ttlOr24h(d time.Duration) time.Duration {
	if d <= 0 {
		return 24 * time.Hour
	}
	return d
}

// oidSubjectAltName is the SubjectAltName extension.
var oidSubjectAltName = asn1.ObjectIdentifier{2, 5, 29, 17}

// NewCSR makes a CSR like ztunnel's: empty subject and exactly one
// extension, a critical SubjectAltName holding one URI.
func NewCSR(key crypto.Signer, id spiffeid.ID) ([]byte, error) {
	san, err := marshalURISAN(id.String())
	if err != nil {
		return nil, err
	}
	tmpl := &x509.CertificateRequest{
		ExtraExtensions: []pkix.Extension{{Id: oidSubjectAltName, Critical: true, Value: san}},
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, tmpl, key)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}), nil
}

// marshalURISAN encodes GeneralNames with one uniformResourceIdentifier. A
// SPIFFE ID's string is already its URI: no URL round trip is needed.
func marshalURISAN(uri string) ([]byte, error) {
	return asn1.Marshal([]asn1.RawValue{{Tag: 6, Class: asn1.ClassContextSpecific, Bytes: []byte(uri)}})
}
