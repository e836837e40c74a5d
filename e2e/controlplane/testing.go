package controlplane

import (
	"context"
	"os"
)

// TB is the part of testing.TB that StartForTest uses. It is an interface
// of our own so that importing this package (as the demo does) does not
// link the testing package into a program.
type TB interface {
	Helper()
	Skipf(format string, args ...any)
	Fatalf(format string, args ...any)
	Errorf(format string, args ...any)
	Logf(format string, args ...any)
	Cleanup(func())
	Failed() bool
}

// StartForTest starts a control plane for t and stops it in t.Cleanup. It
// skips t when neither opts.BinDir nor $WORKLOAD_CA_CONTROLPLANE_BIN names
// the binaries. If t fails, a temporary work dir is kept and its path
// (logs, audit log, kubeconfig) is logged.
func StartForTest(t TB, opts Options) *ControlPlane {
	t.Helper()
	if opts.BinDir == "" && os.Getenv(EnvBinDir) == "" {
		t.Skipf("%s is unset: set it to the directory holding etcd and kube-apiserver "+
			"(make controlplane builds them from the module e2e/tools into ~/.cache/workload-ca/controlplane-<versions>-<key>; make -n e2e prints it)", EnvBinDir)
	}
	if opts.WorkDir == "" {
		dir, err := os.MkdirTemp("", "workload-ca-controlplane-")
		if err != nil {
			t.Fatalf("control plane work dir: %v", err)
		}
		opts.WorkDir = dir
	}
	c, err := Start(context.Background(), opts)
	if err != nil {
		t.Fatalf("start control plane: %v", err)
	}
	t.Cleanup(func() {
		if err := c.Stop(); err != nil {
			t.Errorf("stop control plane: %v", err)
		}
		if t.Failed() {
			t.Logf("control plane work dir kept: %s", opts.WorkDir)
			return
		}
		_ = os.RemoveAll(opts.WorkDir)
	})
	return c
}
