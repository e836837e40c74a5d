package cahost

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"time"

	"google.golang.org/grpc/codes"
)

// RequestArgs is one `workload-ca request`.
type RequestArgs struct {
	// Token is the bearer token; it is written to a 0600 file for the
	// command and removed afterwards.
	Token string
	// Identity is the SPIFFE ID asked for (put in the CSR).
	Identity string
	// Impersonate sends Identity as ImpersonatedIdentity metadata, as
	// ztunnel does; false asks for the caller's own identity.
	Impersonate bool
	// TTL is the requested lifetime; zero leaves the command's default (24h).
	TTL time.Duration
	// Timeout is the command's deadline for the call; default 10s. ctx
	// bounds the whole command too.
	Timeout time.Duration
	// ClusterID is sent in the clusterid header; empty leaves the
	// command's default (Kubernetes).
	ClusterID string
}

// Result is the JSON that `workload-ca request --output json` prints. The
// command has verified the chain against the returned roots before
// printing it.
type Result struct {
	SPIFFEID  string    `json:"spiffe_id"`
	Serial    string    `json:"serial"`
	NotBefore time.Time `json:"not_before"`
	NotAfter  time.Time `json:"not_after"`
	Chain     []string  `json:"chain"` // subjects of intermediates (leaf and roots excluded)
	Roots     []string  `json:"roots"` // subjects of the root bundle
}

// RefusedError is a request the CA answered with a gRPC error status.
type RefusedError struct {
	Code    codes.Code
	Message string
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("request refused: code=%s message=%q", e.Code, e.Message)
}

// Code returns the gRPC code of a Request error: OK for nil, the code of a
// *RefusedError, Unknown for any other failure.
func Code(err error) codes.Code {
	var r *RefusedError
	switch {
	case err == nil:
		return codes.OK
	case errors.As(err, &r):
		return r.Code
	default:
		return codes.Unknown
	}
}

// Request runs `workload-ca request --output json` against the CA. A
// refusal by the CA is a *RefusedError; any other failure (TLS, a chain
// that does not verify, a crash) is a plain error with the command's
// stderr.
func (c *CA) Request(ctx context.Context, r RequestArgs) (Result, error) {
	tokenFile, err := c.writeToken(r.Token)
	if err != nil {
		return Result{}, err
	}
	defer os.Remove(tokenFile)
	rootFile, removeRoots, err := c.RootCertFile(ctx)
	if err != nil {
		return Result{}, err
	}
	defer removeRoots()
	timeout := r.Timeout
	if timeout == 0 {
		timeout = 10 * time.Second
	}
	args := []string{"request", "--output", "json",
		"--addr", c.addr, "--server-name", ServerName,
		"--root-cert", rootFile, "--token-file", tokenFile,
		"--identity", r.Identity,
		"--impersonate=" + strconv.FormatBool(r.Impersonate),
		"--timeout", timeout.String(),
	}
	if r.TTL > 0 {
		args = append(args, "--ttl", r.TTL.String())
	}
	if r.ClusterID != "" {
		args = append(args, "--cluster-id", r.ClusterID)
	}
	// A short-lived command bounded by --timeout and ctx: it gets no
	// Pdeathsig (see e2e/internal/proc), so a killed test binary leaves
	// it running for at most --timeout.
	cmd := exec.CommandContext(ctx, c.opts.Binary, args...)
	cmd.Env = ChildEnv()
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		if refused := parseRefusal(stderr.Bytes()); refused != nil {
			return Result{}, refused
		}
		return Result{}, fmt.Errorf("workload-ca request: %w; stderr: %s", err, bytes.TrimSpace(stderr.Bytes()))
	}
	var res Result
	if err := json.Unmarshal(stdout.Bytes(), &res); err != nil {
		return Result{}, fmt.Errorf("workload-ca request: output %q: %w", stdout.String(), err)
	}
	return res, nil
}

func (c *CA) writeToken(token string) (string, error) {
	f, err := os.CreateTemp(c.tokenDir(), "token-")
	if err != nil {
		return "", fmt.Errorf("token file: %w", err)
	}
	_, err = f.WriteString(token)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(f.Name())
		return "", fmt.Errorf("token file: %w", err)
	}
	return f.Name(), nil
}

// refusalLine matches what `request` prints to stderr for a gRPC error.
var refusalLine = regexp.MustCompile(`(?m)^workload-ca: request refused: code=(\w+) message=(".*")$`)

// parseRefusal returns the refusal in stderr, or nil.
func parseRefusal(stderr []byte) *RefusedError {
	m := refusalLine.FindSubmatch(stderr)
	if m == nil {
		return nil
	}
	msg, err := strconv.Unquote(string(m[2]))
	if err != nil {
		msg = string(m[2])
	}
	return &RefusedError{Code: codeByName(string(m[1])), Message: msg}
}

// codeByName inverts codes.Code.String ("PermissionDenied"); unknown names
// give codes.Unknown.
func codeByName(name string) codes.Code {
	for c := codes.OK; c <= codes.Unauthenticated; c++ {
		if c.String() == name {
			return c
		}
	}
	return codes.Unknown
}
