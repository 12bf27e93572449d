package apitest

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/sluice-gw/sluice/internal/envteststart"
)

// startTimeout is generous because the machines that run these tests are small and shared.
const startTimeout = 3 * time.Minute

var (
	config *rest.Config
	// unavailable says why config is nil.
	unavailable string
)

// Main is the body of a package's TestMain: it starts the API server with the CRD manifests in crdDirs installed,
// runs the tests and stops the server. It returns the exit code for os.Exit.
func Main(m *testing.M, crdDirs ...string) int {
	flag.Parse()
	assets := os.Getenv("KUBEBUILDER_ASSETS")
	if assets == "" {
		unavailable = "KUBEBUILDER_ASSETS is not set. These tests need a real kube-apiserver and etcd: run " +
			"`make envtest` (or hack/envtest-binaries.sh) and set KUBEBUILDER_ASSETS to the directory it prints, " +
			"or pass -short to skip them"
		return m.Run()
	}
	for _, bin := range []string{"kube-apiserver", "etcd"} {
		if _, err := os.Stat(filepath.Join(assets, bin)); err != nil {
			fmt.Fprintf(os.Stderr, "KUBEBUILDER_ASSETS=%s has no %s (%v); run hack/envtest-binaries.sh\n", assets, bin, err)
			return 1
		}
	}
	env, cfg, err := envteststart.Start(func() *envtest.Environment {
		return &envtest.Environment{
			CRDDirectoryPaths:        crdDirs,
			ErrorIfCRDPathMissing:    true,
			ControlPlaneStartTimeout: startTimeout,
			ControlPlaneStopTimeout:  time.Minute,
		}
	})
	if err != nil {
		fmt.Fprintf(os.Stderr, "starting envtest from KUBEBUILDER_ASSETS=%s: %v\n", assets, err)
		return 1
	}
	config = cfg
	code := m.Run()
	if err := env.Stop(); err != nil {
		fmt.Fprintf(os.Stderr, "stopping envtest: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

// Config returns the running API server's client configuration. Without a server it fails the test, or skips it
// under -short.
func Config(t testing.TB) *rest.Config {
	t.Helper()
	if config == nil {
		if testing.Short() {
			t.Skip(unavailable)
		}
		t.Fatal(unavailable)
	}
	return rest.CopyConfig(config)
}
