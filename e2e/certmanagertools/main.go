// Command cm-controller runs the subset of the real cert-manager controller
// needed to issue CertificateRequests from a CA Issuer/ClusterIssuer:
// the internal approver, the Issuer/ClusterIssuer readiness controllers and
// the CA CertificateRequest signer. It uses only packages of the
// github.com/cert-manager/cert-manager module (cmd/controller/app is a
// separate, unserved module).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"k8s.io/klog/v2"

	controllerpkg "github.com/cert-manager/cert-manager/pkg/controller"
	"github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/approver"
	crca "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/ca"
	"github.com/cert-manager/cert-manager/pkg/controller/clusterissuers"
	"github.com/cert-manager/cert-manager/pkg/controller/issuers"
	logf "github.com/cert-manager/cert-manager/pkg/logs"

	// Registers the "ca" issuer type with pkg/issuer's factory, used by the
	// issuers/clusterissuers controllers to set the Ready condition.
	_ "github.com/cert-manager/cert-manager/pkg/issuer/ca"
)

func main() {
	kubeconfig := flag.String("kubeconfig", "", "path to kubeconfig (empty: in-cluster)")
	clusterNS := flag.String("cluster-resource-namespace", "cert-manager", "namespace holding ClusterIssuer secrets")
	namespace := flag.String("namespace", "", "limit to one namespace (empty: all; ClusterIssuers need all)")
	klog.InitFlags(nil)
	flag.Parse()
	logf.InitLogs()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx = logf.NewContext(ctx, logf.Log, "cm-controller")

	opts := controllerpkg.ContextOptions{
		Kubeconfig:         *kubeconfig,
		Namespace:          *namespace,
		KubernetesAPIQPS:   50,
		KubernetesAPIBurst: 100,
		IssuerOptions: controllerpkg.IssuerOptions{
			ClusterResourceNamespace: *clusterNS,
		},
		CertificateOptions: controllerpkg.CertificateOptions{
			CertificateRequestMinimumBackoffDuration: time.Hour,
			CertificateRequestMaximumBackoffDuration: 32 * time.Hour,
		},
	}
	factory, err := controllerpkg.NewContextFactory(ctx, opts)
	if err != nil {
		fail(err)
	}

	names := []string{
		approver.ControllerName, // "certificaterequests-approver"
		issuers.ControllerName,  // "issuers"
		crca.CRControllerName,   // "certificaterequests-issuer-ca"
	}
	if *namespace == "" {
		names = append(names, clusterissuers.ControllerName) // "clusterissuers"
	}

	known := controllerpkg.Known() // filled by the packages' init() Register calls
	var ctrls []controllerpkg.Interface
	for _, n := range names {
		ctor, ok := known[n]
		if !ok {
			fail(fmt.Errorf("controller %q not registered", n))
		}
		c, err := ctor(factory) // Builder.Complete: Build(n) + Register(informers)
		if err != nil {
			fail(fmt.Errorf("%s: %w", n, err))
		}
		ctrls = append(ctrls, c)
	}

	// All informers were requested in Register above; start them now. Every
	// Context built from the factory shares the same informer factories.
	shared, err := factory.Build()
	if err != nil {
		fail(err)
	}
	shared.SharedInformerFactory.Start(ctx.Done())
	shared.KubeSharedInformerFactory.Start(ctx.Done())

	var wg sync.WaitGroup
	for i, c := range ctrls {
		wg.Go(func() {
			if err := c.Run(5, ctx); err != nil {
				klog.ErrorS(err, "controller exited", "controller", names[i])
				stop()
			}
		})
	}
	klog.InfoS("cert-manager controllers running", "controllers", names)
	wg.Wait()
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "cm-controller:", err)
	os.Exit(1)
}
