package envteststart

import (
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// TestStartRetriesOnFreshPorts gives the first attempt's etcd a port another listener holds, as a process that binds
// it between envtest's pick and etcd's start does: envtest's own retries reuse that port and all fail, and the next
// attempt, on ports of its own, starts.
func TestStartRetriesOnFreshPorts(t *testing.T) {
	assets := os.Getenv("KUBEBUILDER_ASSETS")
	if assets == "" {
		if testing.Short() {
			t.Skip("KUBEBUILDER_ASSETS is unset; -short skips the API server tests")
		}
		t.Fatal("KUBEBUILDER_ASSETS is unset: run `make test`, which builds kube-apiserver and etcd once and sets it")
	}
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()

	built := 0
	env, cfg, err := Start(func() *envtest.Environment {
		built++
		env := &envtest.Environment{BinaryAssetsDirectory: assets}
		if built == 1 {
			env.ControlPlane.Etcd = &envtest.Etcd{URL: &url.URL{Scheme: "http", Host: taken.Addr().String()}}
		}
		return env
	})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	defer func() {
		if err := env.Stop(); err != nil {
			t.Errorf("stopping envtest: %v", err)
		}
	}()
	if built != 2 {
		t.Errorf("built %d environments, want 2: the first on the taken port, the second on fresh ones", built)
	}
	if cfg == nil || cfg.Host == "" {
		t.Errorf("config %+v, want the running API server's", cfg)
	}
}

// TestStartGivesUp shows that a start failing every time is tried Attempts times and its error names each attempt.
func TestStartGivesUp(t *testing.T) {
	noEtcd := filepath.Join(t.TempDir(), "etcd")
	built := 0
	_, _, err := Start(func() *envtest.Environment {
		built++
		env := &envtest.Environment{}
		env.ControlPlane.Etcd = &envtest.Etcd{Path: noEtcd}
		return env
	})
	if err == nil {
		t.Fatal("Start succeeded without an etcd binary")
	}
	if built != Attempts {
		t.Errorf("built %d environments, want %d", built, Attempts)
	}
	for _, want := range []string{"attempt 1:", "attempt 3:"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
}
