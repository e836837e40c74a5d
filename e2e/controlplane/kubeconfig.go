package controlplane

import (
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
)

// kubeconfigTemplate is an admin kubeconfig with embedded credentials.
// (Written by hand: client-go's clientcmd would add github.com/spf13/pflag
// to the product's go.mod.)
const kubeconfigTemplate = `apiVersion: v1
kind: Config
clusters:
- name: workload-ca-e2e
  cluster:
    server: %s
    certificate-authority-data: %s
users:
- name: admin
  user:
    client-certificate-data: %s
    client-key-data: %s
contexts:
- name: workload-ca-e2e
  context:
    cluster: workload-ca-e2e
    user: admin
current-context: workload-ca-e2e
`

// writeKubeconfig writes the admin kubeconfig to <WorkDir>/kubeconfig.
func (c *ControlPlane) writeKubeconfig() error {
	b64 := base64.StdEncoding.EncodeToString
	data := fmt.Sprintf(kubeconfigTemplate, c.host,
		b64(c.pki.caPEM), b64(c.pki.adminCertPEM), b64(c.pki.adminKeyPEM))
	c.kubeconfig = filepath.Join(c.workDir, "kubeconfig")
	return os.WriteFile(c.kubeconfig, []byte(data), 0o600)
}
