package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	v1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"

	"github.com/sluice-gw/sluice/crds"
	"github.com/sluice-gw/sluice/plugins"
	"github.com/sluice-gw/sluice/runner/runnertest"
)

// startAPIServer starts a real kube-apiserver and etcd (built by `make envtest`) with the GIE and Sluice CRDs
// installed, and returns a client and a kubeconfig file for the EPP.
func startAPIServer(t *testing.T) (client.Client, string) {
	t.Helper()
	assets := os.Getenv("KUBEBUILDER_ASSETS")
	if assets == "" {
		if testing.Short() {
			t.Skip("KUBEBUILDER_ASSETS is unset; -short skips the API server tests")
		}
		t.Fatal("KUBEBUILDER_ASSETS is unset: run `make test`, which builds kube-apiserver and etcd once and sets it")
	}
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "sigs.k8s.io/gateway-api-inference-extension").Output()
	if err != nil {
		t.Fatalf("locating the GIE module for its CRDs: %v", err)
	}
	env := &envtest.Environment{
		BinaryAssetsDirectory: assets,
		CRDDirectoryPaths: []string{
			filepath.Join(strings.TrimSpace(string(out)), "config", "crd", "bases"),
			filepath.Join("..", "..", "crds", "manifests"),
		},
		ErrorIfCRDPathMissing: true,
	}
	cfg, err := env.Start()
	if err != nil {
		t.Fatalf("starting envtest: %v", err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Errorf("stopping envtest: %v", err)
		}
	})
	user, err := env.AddUser(envtest.User{Name: "sluice-epp", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig, err := user.KubeConfig()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(path, kubeconfig, 0o600); err != nil {
		t.Fatal(err)
	}
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, v1.Install, crds.AddToScheme} {
		if err := add(scheme); err != nil {
			t.Fatal(err)
		}
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	return c, path
}

// TestFlowControlPolicyLive runs the EPP binary in Kubernetes mode with Sluice admission and shows a
// FlowControlPolicy taking effect without a restart: a tenant routed under the defaults is capped to Sheddable and
// shed (429, saturated) once the policy is accepted, and routed again once it is deleted.
func TestFlowControlPolicyLive(t *testing.T) {
	c, kubeconfig := startAPIServer(t)
	ctx := context.Background()
	port := runnertest.FreePort(t)
	server := runnertest.StartModelServer(t, fmt.Sprintf("127.0.0.2:%d", port))
	// Saturation 2/5 = 0.4: headroom for every band under the defaults (Sheddable's ceiling is 0.8), none for a
	// Sheddable ceiling of 0.2.
	server.Waiting.Store(2)

	pool := &v1.InferencePool{
		ObjectMeta: metav1.ObjectMeta{Name: "vllm", Namespace: "default"},
		Spec: v1.InferencePoolSpec{
			Selector:          v1.LabelSelector{MatchLabels: map[v1.LabelKey]v1.LabelValue{"app": "vllm"}},
			TargetPorts:       []v1.Port{{Number: v1.PortNumber(port)}},
			EndpointPickerRef: v1.EndpointPickerRef{Name: "sluice-epp", Port: &v1.Port{Number: 9002}},
		},
	}
	if err := c.Create(ctx, pool); err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "vllm-a", Namespace: "default", Labels: map[string]string{"app": "vllm"}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "vllm", Image: "vllm/vllm-openai"}}},
	}
	if err := c.Create(ctx, pod); err != nil {
		t.Fatal(err)
	}
	pod.Status = corev1.PodStatus{
		Phase:      corev1.PodRunning,
		PodIP:      "127.0.0.2",
		PodIPs:     []corev1.PodIP{{IP: "127.0.0.2"}},
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.Now()}},
	}
	if err := c.Status().Update(ctx, pod); err != nil {
		t.Fatal(err)
	}

	epp := runnertest.StartEPP(t, []string{"KUBECONFIG=" + kubeconfig, "NAMESPACE=default"},
		"--pool-name=vllm", "--secure-serving=false", "--sluice-admission")
	batch := map[string]string{"x-gateway-inference-fairness-id": "batch"}
	other := map[string]string{"x-gateway-inference-fairness-id": "other"}
	var prompt int
	route := func(headers map[string]string) runnertest.Answer {
		prompt++
		body := map[string]any{"model": "base", "prompt": fmt.Sprintf("prompt %d", prompt), "max_tokens": 16}
		return runnertest.Route(t, epp.GRPCPort, false, headers, body, nil)
	}
	routed := func(headers map[string]string) func() string {
		return func() string {
			if a := route(headers); a.Destination != server.Addr {
				return fmt.Sprintf("answer %+v, want routed to %s", a, server.Addr)
			}
			return ""
		}
	}
	runnertest.Eventually(t, "without a policy, the batch tenant is routed", routed(batch))

	policy := &crds.FlowControlPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "batch-sheddable", Namespace: "default"},
		Spec: crds.FlowControlPolicySpec{
			PoolRef: crds.PoolReference{Name: "vllm"},
			Bands:   &crds.Bands{Sheddable: &crds.SheddableBand{SaturationCeiling: ptr.To(0.2)}},
			Tenants: []crds.TenantPolicy{{Name: "batch", MaxBand: ptr.To("Sheddable")}},
			// Scrapes on a busy test machine can lag behind the 200ms default.
			Endpoint: &crds.EndpointThresholds{MetricsStalenessThreshold: &metav1.Duration{Duration: 3 * time.Second}},
		},
	}
	if err := c.Create(ctx, policy); err != nil {
		t.Fatal(err)
	}
	runnertest.Eventually(t, "the policy is accepted", func() string {
		var got crds.FlowControlPolicy
		if err := c.Get(ctx, client.ObjectKeyFromObject(policy), &got); err != nil {
			return err.Error()
		}
		if !meta.IsStatusConditionTrue(got.Status.Conditions, crds.ConditionAccepted) {
			return fmt.Sprintf("conditions %+v", got.Status.Conditions)
		}
		return ""
	})

	var shed runnertest.Answer
	runnertest.Eventually(t, "the accepted policy sheds the capped tenant", func() string {
		if shed = route(batch); shed.Status == 0 {
			return fmt.Sprintf("still routed (%+v): the policy is not in force yet", shed)
		}
		return ""
	})
	if shed.Status != 429 || shed.Headers[plugins.ShedReasonHeader] != "saturated" || shed.Headers["retry-after"] == "" {
		t.Fatalf("batch answer %+v, want 429 with %s: saturated and a Retry-After", shed, plugins.ShedReasonHeader)
	}
	if msg := routed(other)(); msg != "" {
		t.Fatalf("a tenant the policy does not cap: %s", msg)
	}

	if err := c.Delete(ctx, policy); err != nil {
		t.Fatal(err)
	}
	runnertest.Eventually(t, "with the policy deleted, the defaults route the batch tenant again", routed(batch))
}
