package runnertest

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/sluice-gw/sluice/internal/envteststart"

	v1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
)

// APIServer is a real kube-apiserver and etcd (envtest, binaries built by
// `make envtest`) with the GIE CRDs installed.
type APIServer struct {
	// Client talks to the API server with the scheme StartAPIServer was given.
	Client client.Client
	// Kubeconfig is a kubeconfig file for the EPP (KUBECONFIG=...).
	Kubeconfig string

	config *rest.Config
	envMu  sync.Mutex // envtest's AddUser is not documented as goroutine-safe
	env    *envtest.Environment
}

// StartAPIServer starts the API server for the test, installing the GIE CRDs
// and the CRDs in extraCRDDirs. installs add types to the client's scheme
// beyond client-go's and GIE's v1 API. Without KUBEBUILDER_ASSETS the test
// fails (or, under -short, is skipped).
func StartAPIServer(t *testing.T, extraCRDDirs []string, installs ...func(*runtime.Scheme) error) *APIServer {
	t.Helper()
	return StartAPIServerWithCRDs(t, append([]string{GIECRDDir(t)}, extraCRDDirs...), installs...)
}

// GIECRDDir returns the directory of the GIE module's CRD manifests.
func GIECRDDir(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "sigs.k8s.io/gateway-api-inference-extension").Output()
	if err != nil {
		t.Fatalf("locating the GIE module for its CRDs: %v", err)
	}
	return filepath.Join(strings.TrimSpace(string(out)), "config", "crd", "bases")
}

// StartAPIServerWithCRDs is StartAPIServer installing exactly the CRDs in
// crdPaths (directories or files), e.g. to leave one out and install it
// later with InstallCRDs.
func StartAPIServerWithCRDs(t *testing.T, crdPaths []string, installs ...func(*runtime.Scheme) error) *APIServer {
	t.Helper()
	assets := os.Getenv("KUBEBUILDER_ASSETS")
	if assets == "" {
		if testing.Short() {
			t.Skip("KUBEBUILDER_ASSETS is unset; -short skips the API server tests")
		}
		t.Fatal("KUBEBUILDER_ASSETS is unset: run `make test`, which builds kube-apiserver and etcd once and sets it")
	}
	env, cfg, err := envteststart.Start(func() *envtest.Environment {
		env := &envtest.Environment{
			BinaryAssetsDirectory: assets,
			CRDDirectoryPaths:     crdPaths,
			ErrorIfCRDPathMissing: true,
			// envtest's default of 20 s per start is short for kube-apiserver (and a Restart) on a busy two-core
			// machine; a start that takes longer is slow, not broken.
			ControlPlaneStartTimeout: 2 * time.Minute,
		}
		// A certificate folder of the test's own survives Stop, so Restart serves the same certificates and clients
		// keep trusting the API server (a folder envtest creates itself is deleted on stop).
		apiServer := env.ControlPlane.GetAPIServer()
		apiServer.CertDir = t.TempDir()
		// Without a bound, kube-apiserver's graceful stop waits for open watches (the EPP's) and envtest kills it
		// after 20 s; with one it stops in about a second, as after an outage.
		apiServer.Configure().Set("shutdown-watch-termination-grace-period", "1s")
		return env
	})
	if err != nil {
		t.Fatalf("starting envtest: %v", err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Errorf("stopping envtest: %v", err)
		}
	})
	s := &APIServer{config: cfg, env: env}
	path := s.KubeconfigFor(t, "sluice-epp", "system:masters")
	scheme := runtime.NewScheme()
	for _, add := range append([]func(*runtime.Scheme) error{clientgoscheme.AddToScheme, v1.Install}, installs...) {
		if err := add(scheme); err != nil {
			t.Fatal(err)
		}
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	s.Client, s.Kubeconfig = c, path
	return s
}

// KubeconfigFor writes a kubeconfig file for a user named name in groups.
// Unlike Kubeconfig's (in system:masters), such a user has only what RBAC
// grants it; a ServiceAccount's name is system:serviceaccount:<ns>:<name>.
func (s *APIServer) KubeconfigFor(t testing.TB, name string, groups ...string) string {
	t.Helper()
	s.envMu.Lock()
	user, err := s.env.AddUser(envtest.User{Name: name, Groups: groups}, nil)
	s.envMu.Unlock()
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
	return path
}

// Stop stops the kube-apiserver process, as an API server outage does; etcd
// keeps running, so Restart brings back the same objects. Clients see
// connections refused until then.
func (s *APIServer) Stop(t *testing.T) {
	t.Helper()
	if err := s.env.ControlPlane.GetAPIServer().Stop(); err != nil {
		t.Fatalf("stopping the API server: %v", err)
	}
}

// Restart starts the kube-apiserver stopped by Stop again, on the same
// address with the same certificates and data, and returns once it is
// healthy.
func (s *APIServer) Restart(t *testing.T) {
	t.Helper()
	if err := s.env.ControlPlane.GetAPIServer().Start(); err != nil {
		t.Fatalf("restarting the API server: %v", err)
	}
}

// InstallCRDs installs the CRDs in paths (directories or files) into the
// running API server and waits until they are served.
func (s *APIServer) InstallCRDs(t *testing.T, paths ...string) {
	t.Helper()
	if _, err := envtest.InstallCRDs(s.config, envtest.CRDInstallOptions{Paths: paths, ErrorIfPathMissing: true}); err != nil {
		t.Fatalf("installing CRDs %v: %v", paths, err)
	}
}

// CreatePool creates the InferencePool default/vllm, selecting pods labelled
// app=vllm on port.
func (s *APIServer) CreatePool(t testing.TB, port int) {
	t.Helper()
	pool := &v1.InferencePool{
		ObjectMeta: metav1.ObjectMeta{Name: "vllm", Namespace: "default"},
		Spec: v1.InferencePoolSpec{
			Selector:          v1.LabelSelector{MatchLabels: map[v1.LabelKey]v1.LabelValue{"app": "vllm"}},
			TargetPorts:       []v1.Port{{Number: v1.PortNumber(port)}},
			EndpointPickerRef: v1.EndpointPickerRef{Name: "sluice-epp", Port: &v1.Port{Number: 9002}},
		},
	}
	if err := s.Client.Create(context.Background(), pool); err != nil {
		t.Fatal(err)
	}
}

// CreateReadyPod creates a pod of the pool with status IP ip and Ready.
func (s *APIServer) CreateReadyPod(t testing.TB, name, ip string) *corev1.Pod {
	t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Labels: map[string]string{"app": "vllm"}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "vllm", Image: "vllm/vllm-openai"}}},
	}
	if err := s.Client.Create(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
	s.SetPodReady(t, pod, ip, true)
	return pod
}

// SetPodReady sets the pod's status: running on ip, Ready or not.
func (s *APIServer) SetPodReady(t testing.TB, pod *corev1.Pod, ip string, ready bool) {
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
	if err := s.Client.Status().Update(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
}
