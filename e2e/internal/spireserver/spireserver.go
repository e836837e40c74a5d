package spireserver

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/workload-ca/workload-ca/e2e/internal/proc"
)

// EnvBinary names the spire-server binary the Makefile builds (make spire).
const EnvBinary = "WORKLOAD_CA_SPIRE_SERVER"

// Options configures Start.
type Options struct {
	// Binary is the spire-server executable (required).
	Binary string
	// Dir receives the configuration, the datastore, the admin socket and
	// the log (created).
	Dir string
	// TrustDomain is the server's own trust domain (required).
	TrustDomain spiffeid.TrustDomain
	// RefreshHint is the refresh hint its bundle endpoint serves (SPIRE's
	// default when zero: 5m).
	RefreshHint time.Duration
	// FederatesWith are the trust domains whose bundles it fetches.
	FederatesWith []Peer
}

// Peer is a trust domain SPIRE federates with over https_spiffe.
type Peer struct {
	TrustDomain spiffeid.TrustDomain
	// URL is the peer's bundle endpoint.
	URL string
	// EndpointSPIFFEID is the ID of the SVID that endpoint presents.
	EndpointSPIFFEID spiffeid.ID
}

// Server is one spire-server process.
type Server struct {
	opts Options
	// BundleEndpoint is host:port of its SPIFFE bundle endpoint.
	BundleEndpoint string
	p              *proc.Process
	log            *os.File
}

// Start starts the server on free loopback ports and waits until its admin
// API answers.
func Start(ctx context.Context, opts Options) (*Server, error) {
	if opts.Binary == "" || opts.Dir == "" || opts.TrustDomain.IsZero() {
		return nil, errors.New("spireserver: Binary, Dir and TrustDomain are required")
	}
	if err := os.MkdirAll(opts.Dir, 0o700); err != nil {
		return nil, err
	}
	s := &Server{opts: opts}
	err := proc.RetryPorts(func() error {
		ports, err := proc.FreePorts(2)
		if err != nil {
			return err
		}
		s.BundleEndpoint = "127.0.0.1:" + strconv.Itoa(ports[1])
		conf := Config(opts, ports[0], ports[1])
		if err := os.WriteFile(s.configPath(), []byte(conf), 0o600); err != nil {
			return err
		}
		return s.run(ctx)
	})
	if err != nil {
		return nil, fmt.Errorf("spire-server: %w", err)
	}
	return s, nil
}

// Config is the server.conf of a server of opts whose server API listens
// on 127.0.0.1:apiPort and whose bundle endpoint on 127.0.0.1:bundlePort.
func Config(opts Options, apiPort, bundlePort int) string {
	var b strings.Builder
	fmt.Fprintf(&b, `server {
    bind_address = "127.0.0.1"
    bind_port = "%d"
    socket_path = %q
    trust_domain = %q
    data_dir = %q
    log_level = "DEBUG"
    federation {
        bundle_endpoint {
            address = "127.0.0.1"
            port = %d
`, apiPort, socketPath(opts.Dir), opts.TrustDomain.Name(), filepath.Join(opts.Dir, "data"), bundlePort)
	if opts.RefreshHint > 0 {
		fmt.Fprintf(&b, "            refresh_hint = %q\n", opts.RefreshHint.String())
	}
	b.WriteString("            profile \"https_spiffe\" {}\n        }\n")
	for _, p := range opts.FederatesWith {
		fmt.Fprintf(&b, `        federates_with %q {
            bundle_endpoint_url = %q
            bundle_endpoint_profile "https_spiffe" {
                endpoint_spiffe_id = %q
            }
        }
`, p.TrustDomain.Name(), p.URL, p.EndpointSPIFFEID.String())
	}
	fmt.Fprintf(&b, `    }
}

plugins {
    DataStore "sql" {
        plugin_data {
            database_type = "sqlite3"
            connection_string = %q
        }
    }
    KeyManager "memory" {
        plugin_data {}
    }
}
`, filepath.Join(opts.Dir, "data", "datastore.sqlite3"))
	return b.String()
}

func socketPath(dir string) string { return filepath.Join(dir, "api.sock") }

func (s *Server) configPath() string { return filepath.Join(s.opts.Dir, "server.conf") }

// LogPath is the server's log file.
func (s *Server) LogPath() string { return filepath.Join(s.opts.Dir, "spire-server.log") }

// run starts the process and waits until the admin API reports healthy.
func (s *Server) run(ctx context.Context) error {
	log, err := os.OpenFile(s.LogPath(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	p, err := proc.Start("spire-server", s.opts.Binary, []string{"run", "-config", s.configPath()},
		proc.Environ(), log, log, proc.InDir(s.opts.Dir))
	if err != nil {
		log.Close()
		return err
	}
	s.p, s.log = p, log
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		_, err := s.Command(ctx, "healthcheck")
		if err == nil {
			return nil
		}
		if p.Exited() {
			return errors.Join(fmt.Errorf("spire-server exited: %w", p.StartupError()), s.Stop())
		}
		select {
		case <-ctx.Done():
			return errors.Join(fmt.Errorf("spire-server does not answer: %w", err), s.Stop())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// Command runs `spire-server args... -socketPath <its socket>` and returns
// its standard output; a failure carries its standard error.
func (s *Server) Command(ctx context.Context, args ...string) ([]byte, error) {
	args = append(args, "-socketPath", socketPath(s.opts.Dir))
	cmd := exec.CommandContext(ctx, s.opts.Binary, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("spire-server %s: %w: %s", strings.Join(args[:len(args)-2], " "), err,
			strings.TrimSpace(stderr.String()+" "+stdout.String()))
	}
	return stdout.Bytes(), nil
}

// EndpointSPIFFEID is the ID of the SVID its bundle endpoint presents
// (SPIRE's server ID).
func (s *Server) EndpointSPIFFEID() spiffeid.ID {
	return spiffeid.RequireFromPath(s.opts.TrustDomain, "/spire/server")
}

// Bundle is the server's own bundle (`bundle show -format spiffe`).
func (s *Server) Bundle(ctx context.Context) (*spiffebundle.Bundle, error) {
	out, err := s.Command(ctx, "bundle", "show", "-format", "spiffe")
	if err != nil {
		return nil, err
	}
	return spiffebundle.Parse(s.opts.TrustDomain, out)
}

// FederatedBundle is the bundle it holds of td (`bundle list -id`).
func (s *Server) FederatedBundle(ctx context.Context, td spiffeid.TrustDomain) (*spiffebundle.Bundle, error) {
	out, err := s.Command(ctx, "bundle", "list", "-id", td.IDString(), "-format", "spiffe")
	if err != nil {
		return nil, err
	}
	return spiffebundle.Parse(td, out)
}

// SetFederatedBundle sets the bundle it holds of b's trust domain (`bundle
// set -format spiffe`): the out-of-band first bundle of an https_spiffe
// relationship.
func (s *Server) SetFederatedBundle(ctx context.Context, b *spiffebundle.Bundle) error {
	doc, err := b.Marshal()
	if err != nil {
		return err
	}
	path := filepath.Join(s.opts.Dir, "bundle-"+b.TrustDomain().Name()+".json")
	if err := os.WriteFile(path, doc, 0o600); err != nil {
		return err
	}
	_, err = s.Command(ctx, "bundle", "set", "-format", "spiffe", "-id", b.TrustDomain().IDString(), "-path", path)
	return err
}

// RefreshFederatedBundle makes it fetch td's bundle from td's endpoint now
// (`federation refresh`) rather than at its next scheduled refresh.
func (s *Server) RefreshFederatedBundle(ctx context.Context, td spiffeid.TrustDomain) error {
	_, err := s.Command(ctx, "federation", "refresh", "-id", td.IDString())
	return err
}

// MintX509SVID mints an X509-SVID for id (`x509 mint`) and returns its
// chain, leaf first.
func (s *Server) MintX509SVID(ctx context.Context, id spiffeid.ID, ttl time.Duration) ([]*x509.Certificate, error) {
	dir, err := os.MkdirTemp(s.opts.Dir, "mint-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	if _, err := s.Command(ctx, "x509", "mint", "-spiffeID", id.String(), "-ttl", ttl.String(), "-write", dir); err != nil {
		return nil, err
	}
	raw, err := os.ReadFile(filepath.Join(dir, "svid.pem"))
	if err != nil {
		return nil, err
	}
	var chain []*x509.Certificate
	for block, rest := pem.Decode(raw); block != nil; block, rest = pem.Decode(rest) {
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("x509 mint: %w", err)
		}
		chain = append(chain, c)
	}
	if len(chain) == 0 {
		return nil, errors.New("x509 mint: no certificate in svid.pem")
	}
	return chain, nil
}

// PrepareX509Authority prepares its next X.509 authority (`localauthority
// x509 prepare`), which enters its bundle at once, and returns its ID.
func (s *Server) PrepareX509Authority(ctx context.Context) (string, error) {
	out, err := s.Command(ctx, "localauthority", "x509", "prepare", "-output", "json")
	if err != nil {
		return "", err
	}
	var resp struct {
		Prepared struct {
			AuthorityID string `json:"authority_id"`
		} `json:"prepared_authority"`
	}
	if err := json.Unmarshal(out, &resp); err != nil {
		return "", fmt.Errorf("localauthority x509 prepare: %w", err)
	}
	if resp.Prepared.AuthorityID == "" {
		return "", fmt.Errorf("localauthority x509 prepare: no authority ID in %s", out)
	}
	return resp.Prepared.AuthorityID, nil
}

// ActivateX509Authority makes the prepared authority id the one it signs
// with (`localauthority x509 activate`).
func (s *Server) ActivateX509Authority(ctx context.Context, id string) error {
	_, err := s.Command(ctx, "localauthority", "x509", "activate", "-authorityID", id)
	return err
}

// Tail is the end of the running server's output.
func (s *Server) Tail() string {
	if s.p == nil {
		return ""
	}
	return s.p.Tail()
}

// Stop stops the server (SIGTERM, then SIGKILL) and waits for it.
func (s *Server) Stop() error {
	if s.p == nil {
		return nil
	}
	err := s.p.Terminate(10 * time.Second)
	s.log.Close()
	s.p = nil
	return err
}
