package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sluice-gw/sluice/runner/runnertest"
)

// The chart tests render GIE's own inferencepool chart, at the version go.mod pins, with the helm binary the
// Makefile builds at a pinned version ($SLUICE_HELM_BINARY), and apply what it renders to a real API server.

// helmBinary returns the pinned helm; without it the test fails (or, under -short, is skipped).
func helmBinary(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("SLUICE_HELM_BINARY"); p != "" {
		return p
	}
	if testing.Short() {
		t.Skip("SLUICE_HELM_BINARY is unset; -short skips the chart tests")
	}
	t.Fatal("SLUICE_HELM_BINARY is unset: run `make test`, which builds the pinned helm once (`make helm`) and sets it")
	return ""
}

// helm runs the pinned helm with its caches and configuration in dir, so the user's are neither read nor written.
func helm(t *testing.T, dir string, args ...string) []byte {
	t.Helper()
	cmd := exec.Command(helmBinary(t), args...)
	cmd.Env = append(os.Environ(),
		"HELM_CACHE_HOME="+filepath.Join(dir, "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(dir, "config"),
		"HELM_DATA_HOME="+filepath.Join(dir, "data"))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("helm %v: %v\n%s", args, err, stderr.String())
	}
	return out
}

// upstreamChart returns a copy of GIE's inferencepool chart with its dependency, the epplib library chart it names
// as file://../epplib, resolved by `helm dependency build`, as in GIE's repository before it publishes the chart.
func upstreamChart(t *testing.T) string {
	t.Helper()
	src := filepath.Join(filepath.Dir(runnertest.GIECRDDir(t)), "..", "charts")
	dst := filepath.Join(t.TempDir(), "charts")
	for _, chart := range []string{"inferencepool", "epplib"} {
		if err := os.CopyFS(filepath.Join(dst, chart), os.DirFS(filepath.Join(src, chart))); err != nil {
			t.Fatalf("copying GIE's %s chart: %v", chart, err)
		}
	}
	chart := filepath.Join(dst, "inferencepool")
	helm(t, t.TempDir(), "dependency", "build", chart)
	return chart
}

// renderChart runs `helm template release chart --namespace namespace args...` and returns the objects.
func renderChart(t *testing.T, chart, release, namespace string, args ...string) []*unstructured.Unstructured {
	t.Helper()
	out := helm(t, t.TempDir(), append([]string{"template", release, chart, "--namespace", namespace}, args...)...)
	return parseObjects(t, out)
}

// parseObjects decodes a stream of YAML documents into objects, skipping empty ones.
func parseObjects(t *testing.T, stream []byte) []*unstructured.Unstructured {
	t.Helper()
	var objs []*unstructured.Unstructured
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(stream), 4096)
	for {
		u := &unstructured.Unstructured{}
		err := dec.Decode(&u.Object)
		if errors.Is(err, io.EOF) {
			return objs
		}
		if err != nil {
			t.Fatalf("decoding rendered objects: %v", err)
		}
		if len(u.Object) > 0 {
			objs = append(objs, u)
		}
	}
}

// findObject returns the rendered object of kind named name, or fails the test.
func findObject(t *testing.T, objs []*unstructured.Unstructured, kind, name string, into any) {
	t.Helper()
	for _, u := range objs {
		if u.GetKind() == kind && u.GetName() == name {
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, into); err != nil {
				t.Fatalf("%s %s: %v", kind, name, err)
			}
			return
		}
	}
	t.Fatalf("the chart rendered no %s %s", kind, name)
}

// applyObjects creates namespace and applies objs to the API server with server-side apply, as `kubectl apply
// --server-side` does (namespaced objects without a namespace go to namespace, as `helm install -n` puts them). It
// returns the kinds the API server does not serve (a provider's policies, a ServiceMonitor), which it skips.
func applyObjects(t *testing.T, api *runnertest.APIServer, namespace string, objs []*unstructured.Unstructured) (skipped []string) {
	t.Helper()
	ctx := context.Background()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}
	if err := api.Client.Create(ctx, ns); client.IgnoreAlreadyExists(err) != nil {
		t.Fatal(err)
	}
	for _, u := range objs {
		gvk := u.GroupVersionKind()
		mapping, err := api.Client.RESTMapper().RESTMapping(gvk.GroupKind(), gvk.Version)
		if meta.IsNoMatchError(err) {
			skipped = append(skipped, gvk.Kind+"."+gvk.Group)
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		u = u.DeepCopy()
		if mapping.Scope.Name() == meta.RESTScopeNameNamespace && u.GetNamespace() == "" {
			u.SetNamespace(namespace)
		}
		if err := api.Client.Apply(ctx, client.ApplyConfigurationFromUnstructured(u), client.FieldOwner("sluice-chart-test"), client.ForceOwnership); err != nil {
			t.Fatalf("applying %s %s/%s: %v", gvk.Kind, u.GetNamespace(), u.GetName(), err)
		}
	}
	sort.Strings(skipped)
	return skipped
}
