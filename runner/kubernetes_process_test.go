package runner_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	v1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"

	"github.com/sluice-gw/sluice/runner/runnertest"
)

// startAPIServer starts a real kube-apiserver and etcd (built by `make
// envtest`) with the GIE CRDs installed, and returns a client and a
// kubeconfig file for the EPP.
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
		CRDDirectoryPaths:     []string{filepath.Join(strings.TrimSpace(string(out)), "config", "crd", "bases")},
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
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := v1.Install(scheme); err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	return c, path
}

func createReadyPod(t *testing.T, c client.Client, name, ip string) *corev1.Pod {
	t.Helper()
	ctx := context.Background()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Labels: map[string]string{"app": "vllm"}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "vllm", Image: "vllm/vllm-openai"}}},
	}
	if err := c.Create(ctx, pod); err != nil {
		t.Fatal(err)
	}
	setPodReady(t, c, pod, ip, true)
	return pod
}

func setPodReady(t *testing.T, c client.Client, pod *corev1.Pod, ip string, ready bool) {
	t.Helper()
	status := corev1.ConditionFalse
	if ready {
		status = corev1.ConditionTrue
	}
	pod.Status = corev1.PodStatus{
		Phase:      corev1.PodRunning,
		PodIP:      ip,
		PodIPs:     []corev1.PodIP{{IP: ip}},
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: status, LastTransitionTime: metav1.Now()}},
	}
	if err := c.Status().Update(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
}

// TestKubernetesMode runs the EPP binary against a real API server, as it
// runs in a cluster: InferencePool and Pods come from the API, and routing
// follows pod readiness and deletion.
func TestKubernetesMode(t *testing.T) {
	c, kubeconfig := startAPIServer(t)
	ctx := context.Background()
	port := runnertest.FreePort(t)
	a := runnertest.StartModelServer(t, fmt.Sprintf("127.0.0.2:%d", port)).Addr
	b := runnertest.StartModelServer(t, fmt.Sprintf("127.0.0.3:%d", port)).Addr

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
	podA := createReadyPod(t, c, "vllm-a", "127.0.0.2")
	podB := createReadyPod(t, c, "vllm-b", "127.0.0.3")

	epp := runnertest.StartEPP(t, []string{"KUBECONFIG=" + kubeconfig, "NAMESPACE=default"},
		"--pool-name=vllm", "--secure-serving=false")
	tls := false

	runnertest.Eventually(t, "both Ready pods receive traffic", func() string {
		seen := destinations(t, epp.GRPCPort, tls, 20, nil)
		if msg := onlyIn(seen, a, b); msg != "" {
			return msg
		}
		if len(seen) != 2 {
			return fmt.Sprintf("only %v received traffic", seen)
		}
		return ""
	})
	if msg := onlyIn(destinations(t, epp.GRPCPort, tls, 10, []string{a}), a); msg != "" {
		t.Fatalf("subset hint ignored: %s", msg)
	}

	setPodReady(t, c, podB, "127.0.0.3", false)
	runnertest.Eventually(t, "a NotReady pod stops receiving traffic", func() string { return onlyIn(destinations(t, epp.GRPCPort, tls, 10, nil), a) })

	setPodReady(t, c, podB, "127.0.0.3", true)
	if err := c.Delete(ctx, podA); err != nil {
		t.Fatal(err)
	}
	runnertest.Eventually(t, "a deleted pod stops receiving traffic", func() string { return onlyIn(destinations(t, epp.GRPCPort, tls, 10, nil), b) })
}

// TestLeaderElection runs two EPP replicas with leader election against a real
// API server: both are live, and the leader (only) reports ready, as
// upstream's replicas do behind one Service.
func TestLeaderElection(t *testing.T) {
	c, kubeconfig := startAPIServer(t)
	port := runnertest.FreePort(t)
	runnertest.StartModelServer(t, fmt.Sprintf("127.0.0.2:%d", port))
	pool := &v1.InferencePool{
		ObjectMeta: metav1.ObjectMeta{Name: "vllm", Namespace: "default"},
		Spec: v1.InferencePoolSpec{
			Selector:          v1.LabelSelector{MatchLabels: map[v1.LabelKey]v1.LabelValue{"app": "vllm"}},
			TargetPorts:       []v1.Port{{Number: v1.PortNumber(port)}},
			EndpointPickerRef: v1.EndpointPickerRef{Name: "sluice-epp", Port: &v1.Port{Number: 9002}},
		},
	}
	if err := c.Create(context.Background(), pool); err != nil {
		t.Fatal(err)
	}
	createReadyPod(t, c, "vllm-a", "127.0.0.2")
	env := []string{"KUBECONFIG=" + kubeconfig, "NAMESPACE=default"}
	args := []string{"--pool-name=vllm", "--secure-serving=false", "--ha-enable-leader-election"}
	leader := runnertest.StartEPP(t, env, args...) // returns once ready, i.e. elected
	follower := runnertest.StartEPPUnready(t, env, args...)
	for _, check := range []struct {
		p       *runnertest.Process
		service string
		want    bool
	}{
		{leader, "readiness", true},
		{leader, "liveness", true},
		{follower, "liveness", true},
		{follower, "readiness", false},
	} {
		if got := runnertest.Serving(t, check.p, check.service); got != check.want {
			t.Errorf("%s on port %d: serving = %v, want %v", check.service, check.p.HealthPort, got, check.want)
		}
	}
	var lease coordinationv1.Lease
	key := client.ObjectKey{Namespace: "default", Name: "epp-default-vllm.gateway-api-inference-extension.sigs.k8s.io"}
	if err := c.Get(context.Background(), key, &lease); err != nil || lease.Spec.HolderIdentity == nil {
		t.Fatalf("no lease held under upstream's lease name: %v", err)
	}
}
