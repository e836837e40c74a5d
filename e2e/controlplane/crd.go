package controlplane

import (
	"context"
	"fmt"
	"os"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/yaml"
)

var crdGVR = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// InstallCRD applies the CustomResourceDefinition in file (as helm install
// does from a chart's crds/) and waits until the API server serves its
// resource.
func (c *ControlPlane) InstallCRD(ctx context.Context, file string) error {
	raw, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	obj := map[string]any{}
	if err := yaml.Unmarshal(raw, &obj); err != nil {
		return fmt.Errorf("%s: %w", file, err)
	}
	u := &unstructured.Unstructured{Object: obj}
	dyn, err := dynamic.NewForConfig(c.RESTConfig())
	if err != nil {
		return err
	}
	if _, err := dyn.Resource(crdGVR).Apply(ctx, u.GetName(), u, metav1.ApplyOptions{FieldManager: "workload-ca-e2e", Force: true}); err != nil {
		return fmt.Errorf("apply %s: %w", u.GetName(), err)
	}
	group, _, _ := unstructured.NestedString(obj, "spec", "group")
	plural, _, _ := unstructured.NestedString(obj, "spec", "names", "plural")
	versions, _, _ := unstructured.NestedSlice(obj, "spec", "versions")
	version := ""
	if len(versions) > 0 {
		version, _, _ = unstructured.NestedString(versions[0].(map[string]any), "name")
	}
	disc, err := discovery.NewDiscoveryClientForConfig(c.RESTConfig())
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		if list, err := disc.ServerResourcesForGroupVersion(group + "/" + version); err == nil {
			for _, r := range list.APIResources {
				if r.Name == plural {
					return nil
				}
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s not served: %w", u.GetName(), ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}
