package e2e_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/workload-ca/workload-ca/e2e/cahost"
	"github.com/workload-ca/workload-ca/e2e/internal/proc"
	"github.com/workload-ca/workload-ca/istiodcert"
)

// envIstiod names the pilot-discovery binary (make e2e builds it from the
// istio.io/istio module e2e/istiotools pins).
const envIstiod = "WORKLOAD_CA_ISTIOD"

// istiodWait bounds istiod's start (informers against a cluster without
// Istio's CRDs) and a reload of its certificate.
const istiodWait = 90 * time.Second

// TestIstiod runs the real istiod (pilot-discovery) against the suite's
// API server, as Istio's chart runs it: with workload-ca keeping the
// Secret istiod-tls, mounted where the chart mounts it, a client holding
// only workload-ca's root completes TLS to istiod's xDS port for the name
// ztunnel dials; the certificate the CA reissues after the Secret is
// deleted is the one istiod serves next. istiod in its default set-up
// (its own self-signed CA) cannot be reached with that root.
func TestIstiod(t *testing.T) {
	bin := toolBinary(t, "pilot-discovery", envIstiod)
	f := newLCFixture(t, "istiod")
	ca := f.start(t, "--istiod-cert", "--istiod-namespace", f.ns)
	theLeader(t, []*cahost.CA{ca})
	ours, err := ca.Roots()
	if err != nil {
		t.Fatal(err)
	}
	name := "istiod." + f.ns + ".svc" // what ztunnel dials by default
	withOurRoot := &tls.Config{RootCAs: ours, ServerName: name, MinVersion: tls.VersionTLS12}

	secret, issued := f.istiodSecret(t, "")
	dir := filepath.Join(f.dir, "istiod")
	mountSecret(t, dir, secret)
	d := startIstiod(t, bin, f.s.cp.KubeconfigPath(), f.ns, dir, "ENABLE_CA_SERVER=false")
	t.Run("xDS TLS verifies with our root", func(t *testing.T) {
		served, err := d.handshake(t.Context(), withOurRoot)
		if err != nil {
			t.Fatalf("TLS to istiod's xDS port with our root: %v", err)
		}
		if serial(served) != serial(issued) {
			t.Fatalf("istiod serves certificate %s, the Secret holds %s", serial(served), serial(issued))
		}
	})
	t.Run("a reissued certificate is served after istiod reloads it", func(t *testing.T) {
		if err := f.s.cp.Client().CoreV1().Secrets(f.ns).Delete(t.Context(), istiodcert.DefaultSecretName, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		secret, next := f.istiodSecret(t, serial(issued))
		mountSecret(t, dir, secret)
		var served *x509.Certificate
		var herr error
		err := pollUntil(t, istiodWait, func() (bool, error) {
			served, herr = d.handshake(t.Context(), withOurRoot)
			return herr == nil && serial(served) == serial(next), nil
		})
		if err != nil {
			t.Fatalf("istiod still serves %v (err %v; exited %v: %v), want the reissued %s", served, herr, d.p.Exited(), d.p.ExitError(), serial(next))
		}
	})

	t.Run("workload-ca inspect names the root of the published bundle", func(t *testing.T) {
		roots, err := ca.RootsPEM(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		want, err := pemCerts(roots)
		if err != nil || len(want) != 1 {
			t.Fatalf("roots: %v (%d)", err, len(want))
		}
		// The leader publishes the bundle moments after it leads.
		var out []byte
		err = pollUntil(t, lcWait, func() (bool, error) {
			out, err = exec.CommandContext(t.Context(), os.Getenv(cahost.EnvBinary), "inspect", "--signer", f.signer,
				"--kubeconfig", f.s.cp.KubeconfigPath(), "--output", "json").Output()
			return err == nil, nil
		})
		if err != nil {
			t.Fatalf("inspect: %v", err)
		}
		var got []struct{ Role, Serial, Source string }
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatalf("inspect output %s: %v", out, err)
		}
		if len(got) != 1 || got[0].Role != "root" || got[0].Serial != want[0].SerialNumber.String() ||
			!strings.Contains(got[0].Source, "signer "+f.signer) {
			t.Fatalf("inspect --signer %s: %s, want the CA's root %s", f.signer, out, want[0].SerialNumber)
		}
	})

	t.Run("istiod's default self-signed setup fails with our root", func(t *testing.T) {
		ns := f.ns + "-own"
		createNamespace(t, f.s, ns, nil)
		own := startIstiod(t, bin, f.s.cp.KubeconfigPath(), ns, filepath.Join(f.dir, "istiod-own"))
		_, err := own.handshake(t.Context(), &tls.Config{RootCAs: ours, ServerName: "istiod." + ns + ".svc", MinVersion: tls.VersionTLS12})
		if uerr := (x509.UnknownAuthorityError{}); !errors.As(err, &uerr) {
			t.Fatalf("TLS with our root to istiod's own certificate: %v, want an unknown authority", err)
		}
		// The port is up and verifies with istiod's own root.
		s, err := f.s.cp.Client().CoreV1().Secrets(ns).Get(t.Context(), "istio-ca-secret", metav1.GetOptions{})
		if err != nil {
			t.Fatalf("istiod's self-signed CA Secret: %v", err)
		}
		theirs := x509.NewCertPool()
		if !theirs.AppendCertsFromPEM(s.Data["ca-cert.pem"]) {
			t.Fatal("no root in istio-ca-secret")
		}
		if _, err := own.handshake(t.Context(), &tls.Config{RootCAs: theirs, ServerName: "istiod." + ns + ".svc", MinVersion: tls.VersionTLS12}); err != nil {
			t.Fatalf("TLS with istiod's own root: %v", err)
		}
		// Its discovery selector kept its root ConfigMaps to its namespace,
		// out of the other tests' way: once it has written its own, it has
		// written none elsewhere.
		var gerr error
		if err := pollUntil(t, istiodWait, func() (bool, error) {
			_, gerr = f.s.cp.Client().CoreV1().ConfigMaps(ns).Get(t.Context(), "istio-ca-root-cert", metav1.GetOptions{})
			return gerr == nil, nil
		}); err != nil {
			t.Fatalf("istiod published no istio-ca-root-cert in its namespace: %v (%v)", gerr, err)
		}
		cms, err := f.s.cp.Client().CoreV1().ConfigMaps("").List(t.Context(), metav1.ListOptions{FieldSelector: "metadata.name=istio-ca-root-cert"})
		if err != nil {
			t.Fatal(err)
		}
		for _, cm := range cms.Items {
			for _, m := range cm.ManagedFields {
				if m.Manager == "pilot-discovery" && cm.Namespace != ns {
					t.Errorf("istiod wrote istio-ca-root-cert in namespace %s", cm.Namespace)
				}
			}
		}
	})
}

// istiod is one pilot-discovery process.
type istiod struct {
	p       *proc.Process
	dir     string
	xdsAddr string // --secureGRPCAddr
}

// startIstiod runs pilot-discovery for namespace ns in dir, every port on
// loopback, its discovery restricted to ns (so that its root ConfigMap
// and webhook controllers stay out of the other tests' namespaces), with
// env added.
func startIstiod(t *testing.T, bin, kubeconfig, ns, dir string, env ...string) *istiod {
	t.Helper()
	mesh := filepath.Join(dir, "etc", "istio", "config")
	if err := os.MkdirAll(mesh, 0o755); err != nil {
		t.Fatal(err)
	}
	meshConfig := "discoverySelectors:\n- matchLabels:\n    kubernetes.io/metadata.name: " + ns + "\ntrustDomain: cluster.local\n"
	if err := os.WriteFile(filepath.Join(mesh, "mesh"), []byte(meshConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	var d *istiod
	err := proc.RetryPorts(func() error {
		ports, err := proc.FreePorts(6)
		if err != nil {
			return err
		}
		addr := func(i int) string { return "127.0.0.1:" + strconv.Itoa(ports[i]) }
		// Open as long as the test: istiod writes to it until killed.
		log, err := os.OpenFile(filepath.Join(dir, "istiod.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return err
		}
		t.Cleanup(func() { log.Close() })
		args := []string{"discovery", "--kubeconfig", kubeconfig, "--meshConfig", filepath.Join(mesh, "mesh"),
			"--httpAddr", addr(0), "--grpcAddr", addr(1), "--secureGRPCAddr", addr(2), "--httpsAddr", addr(3),
			"--monitoringAddr", addr(4), "--ctrlz_address", "127.0.0.1", "--ctrlz_port", strconv.Itoa(ports[5]),
			"--log_output_level", "default:info"}
		environ := proc.Environ(append([]string{"POD_NAMESPACE=" + ns, "POD_NAME=istiod-e2e", "REVISION=default"}, env...)...)
		p, err := proc.Start("istiod", bin, args, environ, log, log, proc.InDir(dir))
		if err != nil {
			return err
		}
		d = &istiod{p: p, dir: dir, xdsAddr: addr(2)}
		return d.waitListening(t.Context())
	})
	if err != nil {
		t.Fatalf("istiod: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("istiod log %s; last lines:\n%s", filepath.Join(dir, "istiod.log"), lastLines(d.p.Tail(), 30))
		}
		if err := d.p.Kill(10 * time.Second); err != nil {
			t.Error(err)
		}
	})
	return d
}

// waitListening waits until the xDS port completes a TLS handshake (with
// any certificate), or istiod exits.
func (d *istiod) waitListening(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, istiodWait)
	defer cancel()
	for {
		// Only whether it is up: verification is the test's.
		if _, err := d.handshake(ctx, &tls.Config{InsecureSkipVerify: true}); err == nil {
			return nil
		}
		select {
		case <-d.p.Done():
			return d.p.StartupError()
		case <-ctx.Done():
			return fmt.Errorf("xDS port %s not serving TLS after %v:\n%s", d.xdsAddr, istiodWait, lastLines(d.p.Tail(), 30))
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// handshake dials the xDS port as a gRPC client does (ALPN h2) and
// returns the certificate istiod served.
func (d *istiod) handshake(ctx context.Context, cfg *tls.Config) (*x509.Certificate, error) {
	cfg = cfg.Clone()
	cfg.NextProtos = []string{"h2"}
	dialer := &tls.Dialer{Config: cfg}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	c, err := dialer.DialContext(ctx, "tcp", d.xdsAddr)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	return c.(*tls.Conn).ConnectionState().PeerCertificates[0], nil
}

// mountSecret writes the Secret's data where the kubelet mounts istiod-tls
// for istiod (relative to its working directory, as istiod reads it), as
// the kubelet does: each key a file, replaced at once.
func mountSecret(t *testing.T, dir string, s *corev1.Secret) {
	t.Helper()
	mount := filepath.Join(dir, "var", "run", "secrets", "istiod", "tls")
	if err := os.MkdirAll(mount, 0o755); err != nil {
		t.Fatal(err)
	}
	for k, v := range s.Data {
		tmp := filepath.Join(mount, "."+k+".tmp")
		if err := os.WriteFile(tmp, v, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(mount, k)); err != nil {
			t.Fatal(err)
		}
	}
}

// istiodSecret returns the Secret once it holds a certificate other than
// notSerial's ("" for any).
func (f *lcFixture) istiodSecret(t *testing.T, notSerial string) (*corev1.Secret, *x509.Certificate) {
	t.Helper()
	var s *corev1.Secret
	var leaf *x509.Certificate
	var gerr error
	err := pollUntil(t, lcWait, func() (bool, error) {
		s, gerr = f.s.cp.Client().CoreV1().Secrets(f.ns).Get(t.Context(), istiodcert.DefaultSecretName, metav1.GetOptions{})
		if gerr != nil {
			return false, nil
		}
		pair, perr := tls.X509KeyPair(s.Data[istiodcert.CertKey], s.Data[istiodcert.KeyKey])
		if perr != nil || pair.Leaf.SerialNumber.String() == notSerial {
			return false, nil
		}
		leaf = pair.Leaf
		return true, nil
	})
	if err != nil {
		t.Fatalf("istiod's Secret %s/%s holds no new certificate: %v (last read: %v)", f.ns, istiodcert.DefaultSecretName, err, gerr)
	}
	return s, leaf
}

func serial(c *x509.Certificate) string { return c.SerialNumber.String() }
