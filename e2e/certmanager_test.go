package e2e_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/yaml"

	"github.com/workload-ca/workload-ca/e2e/internal/proc"
	"github.com/workload-ca/workload-ca/internal/testca"
)

// envCertManager names the cert-manager controller the Makefile builds
// from the module e2e/certmanagertools pins (make cert-manager), with
// cert-manager's CRDs in crds/ beside it.
const envCertManager = "WORKLOAD_CA_CERT_MANAGER"

var crdResource = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// installCertManagerCRDs creates cert-manager's CRDs for Issuers,
// ClusterIssuers and CertificateRequests (once for the suite's API
// server) and waits until they are established.
func installCertManagerCRDs(t *testing.T, dyn dynamic.Interface, dir string) {
	t.Helper()
	for _, name := range []string{"issuers", "clusterissuers", "certificaterequests"} {
		raw, err := os.ReadFile(filepath.Join(dir, "cert-manager.io_"+name+".yaml"))
		if err != nil {
			t.Fatal(err)
		}
		var obj map[string]any
		if err := yaml.Unmarshal(bytes.TrimPrefix(raw, []byte("---\n")), &obj); err != nil {
			t.Fatalf("CRD %s: %v", name, err)
		}
		crd := &unstructured.Unstructured{Object: obj}
		if _, err := dyn.Resource(crdResource).Create(t.Context(), crd, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("create CRD %s: %v", name, err)
		}
		err = pollUntil(t, 30*time.Second, func() (bool, error) {
			got, err := dyn.Resource(crdResource).Get(t.Context(), crd.GetName(), metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			conds, _, _ := unstructured.NestedSlice(got.Object, "status", "conditions")
			for _, c := range conds {
				m, _ := c.(map[string]any)
				if m["type"] == "Established" && m["status"] == "True" {
					return true, nil
				}
			}
			return false, nil
		})
		if err != nil {
			t.Fatalf("CRD %s not established: %v", name, err)
		}
	}
}

// certManager is the cert-manager controller process (its approver,
// Issuer and CA signer controllers) for one namespace.
type certManager struct {
	bin, kubeconfig, ns, dir string
	p                        *proc.Process
}

func (c *certManager) start() error {
	log, err := os.OpenFile(filepath.Join(c.dir, "cert-manager.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	p, err := proc.Start("cert-manager", c.bin, []string{"--kubeconfig", c.kubeconfig, "--namespace", c.ns,
		"--cluster-resource-namespace", c.ns, "-v", "2"}, proc.Environ(), log, log, proc.InDir(c.dir))
	if err != nil {
		log.Close()
		return err
	}
	c.p = p
	return nil
}

func (c *certManager) stop() error {
	if c.p == nil {
		return nil
	}
	err := c.p.Terminate(10 * time.Second)
	c.p = nil
	return err
}

// TestCertManagerUpstream is TestVaultUpstream with cert-manager's own
// controllers as the upstream: an Issuer of cert-manager's CA type, whose
// key is the company's root in a Secret, signs each intermediate's
// CertificateRequest, approved by cert-manager's approver. The controller
// is stopped through the first attempts of the rotation: the requests the
// CA creates then stay unsigned until they time out, and are deleted.
func TestCertManagerUpstream(t *testing.T) {
	bin := toolBinary(t, "cm-controller", envCertManager)
	f := newLCFixture(t, "certmgr")
	dyn, err := dynamic.NewForConfig(f.s.cp.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	installCertManagerCRDs(t, dyn, filepath.Join(filepath.Dir(bin), "crds"))

	corp := testca.NewRoot(t, testca.P256, testca.Validity(time.Now().Add(-time.Hour), time.Now().Add(10*365*24*time.Hour)))
	_, err = f.s.cp.Client().CoreV1().Secrets(f.ns).Create(t.Context(), &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "corp-ca"}, Type: corev1.SecretTypeTLS,
		Data: map[string][]byte{corev1.TLSCertKey: corp.CertPEM(), corev1.TLSPrivateKeyKey: corp.KeyPEM(t)},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	issuers := dyn.Resource(schema.GroupVersionResource{Group: "cert-manager.io", Version: "v1", Resource: "issuers"}).Namespace(f.ns)
	_, err = issuers.Create(t.Context(), &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "cert-manager.io/v1", "kind": "Issuer", "metadata": map[string]any{"name": "corp-ca"},
		"spec": map[string]any{"ca": map[string]any{"secretName": "corp-ca"}},
	}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(f.dir, "cert-manager")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	cm := &certManager{bin: bin, kubeconfig: f.s.cp.KubeconfigPath(), ns: f.ns, dir: dir}
	if err := cm.start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			if log, err := os.ReadFile(filepath.Join(dir, "cert-manager.log")); err == nil {
				t.Logf("cert-manager log, last lines:\n%s", lastLines(string(log), 30))
			}
		}
		_ = cm.stop()
	})
	err = pollUntil(t, lcWait, func() (bool, error) {
		got, err := issuers.Get(t.Context(), "corp-ca", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		conds, _, _ := unstructured.NestedSlice(got.Object, "status", "conditions")
		return len(conds) > 0 && fmt.Sprint(conds[0].(map[string]any)["status"]) == "True", nil
	})
	if err != nil {
		t.Fatalf("the Issuer is not ready: %v", err)
	}

	config := filepath.Join(f.dir, "upstream.yaml")
	if err := os.WriteFile(config, []byte("certManager:\n  issuerRef: {name: corp-ca, kind: Issuer}\ntimeout: 3s\nreadyMargin: 10s\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	runUpstream(t, f, upstreamRun{name: "cert-manager", config: config, root: corp.Cert,
		stop: cm.stop, start: cm.start, failureLog: "cert-manager"})

	t.Run("every CertificateRequest the CA created is deleted", func(t *testing.T) {
		crs := dyn.Resource(schema.GroupVersionResource{Group: "cert-manager.io", Version: "v1", Resource: "certificaterequests"}).Namespace(f.ns)
		err := pollUntil(t, lcWait, func() (bool, error) {
			list, err := crs.List(context.Background(), metav1.ListOptions{})
			if err != nil {
				return false, err
			}
			var left []string
			for _, cr := range list.Items {
				if strings.HasPrefix(cr.GetName(), "workload-ca-intermediate-") {
					left = append(left, cr.GetName())
				}
			}
			return len(left) == 0, nil
		})
		if err != nil {
			t.Error(err)
		}
	})
}
