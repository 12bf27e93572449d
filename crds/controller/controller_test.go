package controller

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/sluice-gw/sluice/crds"
	"github.com/sluice-gw/sluice/crds/internal/apitest"
	"github.com/sluice-gw/sluice/flowcontrol"
)

// waitTimeout bounds how long a test waits for the reconciler to converge; it is a liveness bound for a loaded
// machine, not a performance assertion.
const waitTimeout = 2 * time.Minute

func TestMain(m *testing.M) {
	dirs := []string{"../manifests"}
	if os.Getenv("KUBEBUILDER_ASSETS") != "" {
		// InferencePool's CRD comes from the pinned GIE module itself.
		out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "sigs.k8s.io/gateway-api-inference-extension").Output()
		if err != nil {
			fmt.Fprintf(os.Stderr, "locating the gateway-api-inference-extension module for its CRDs: %v\n", err)
			os.Exit(1)
		}
		dirs = append(dirs, filepath.Join(strings.TrimSpace(string(out)), "config", "crd", "bases"))
	}
	os.Exit(apitest.Main(m, dirs...))
}

type env struct {
	t       *testing.T
	client  client.Client
	ns      string
	applied chan *flowcontrol.Config
}

// start creates a namespace and runs a manager with the reconciler for the pool "pool" in it, its cache limited to
// the namespace as the EPP's is.
func start(t *testing.T) *env {
	t.Helper()
	cfg := apitest.Config(t)
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{crds.Install, corev1.AddToScheme} {
		if err := add(scheme); err != nil {
			t.Fatal(err)
		}
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "fcp-controller-"}}
	if err := c.Create(t.Context(), ns); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), ns) })

	mgr, err := manager.New(cfg, manager.Options{
		Scheme:     scheme,
		Metrics:    metricsserver.Options{BindAddress: "0"},
		Cache:      cache.Options{DefaultNamespaces: map[string]cache.Config{ns.Name: {}}},
		Controller: config.Controller{SkipNameValidation: ptr.To(true)}, // one manager per test in one process
	})
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, client: c, ns: ns.Name, applied: make(chan *flowcontrol.Config, 16)}
	r, err := New(mgr.GetClient(), Pool{Namespace: ns.Name, Name: "pool"}, func(cfg *flowcontrol.Config) { e.applied <- cfg })
	if err != nil {
		t.Fatal(err)
	}
	if err := r.SetupWithManager(mgr, Options{Logger: logr.Discard()}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("manager: %v", err)
		}
	})
	return e
}

func (e *env) createPolicy(name, pool string, maxQueued int64) *crds.FlowControlPolicy {
	e.t.Helper()
	p := &crds.FlowControlPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: name},
		Spec: crds.FlowControlPolicySpec{
			PoolRef:           crds.PoolReference{Name: pool},
			MaxQueuedRequests: ptr.To(maxQueued),
		},
	}
	if err := e.client.Create(e.t.Context(), p); err != nil {
		e.t.Fatal(err)
	}
	return p
}

func (e *env) pool() *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "inference.networking.k8s.io/v1",
		"kind":       "InferencePool",
		"metadata":   map[string]any{"namespace": e.ns, "name": "pool"},
		"spec": map[string]any{
			"selector":          map[string]any{"matchLabels": map[string]any{"app": "vllm"}},
			"targetPorts":       []any{map[string]any{"number": int64(8000)}},
			"endpointPickerRef": map[string]any{"name": "epp", "port": map[string]any{"number": int64(9002)}},
		},
	}}
	return u
}

// waitAccepted waits until the policy's status describes its current generation with the given Accepted status
// and reason.
func (e *env) waitAccepted(name string, status metav1.ConditionStatus, reason string) {
	e.t.Helper()
	var last crds.FlowControlPolicy
	err := wait.PollUntilContextTimeout(e.t.Context(), 20*time.Millisecond, waitTimeout, true, func(ctx context.Context) (bool, error) {
		if err := e.client.Get(ctx, client.ObjectKey{Namespace: e.ns, Name: name}, &last); err != nil {
			return false, err
		}
		c := meta.FindStatusCondition(last.Status.Conditions, crds.ConditionAccepted)
		return c != nil && c.Status == status && c.Reason == reason && c.ObservedGeneration == last.Generation &&
			last.Status.ObservedGeneration == last.Generation, nil
	})
	if err != nil {
		e.t.Fatalf("policy %s never became Accepted=%s/%s: %v; last status %+v", name, status, reason, err, last.Status)
	}
}

// nextApplied returns the next configuration handed to the callback.
func (e *env) nextApplied() *flowcontrol.Config {
	e.t.Helper()
	select {
	case cfg := <-e.applied:
		return cfg
	case <-time.After(waitTimeout):
		e.t.Fatal("the reconciler never applied a configuration")
		return nil
	}
}

func (e *env) expectApplied(want *flowcontrol.Config) {
	e.t.Helper()
	if got := e.nextApplied(); !reflect.DeepEqual(got, want) {
		e.t.Fatalf("applied\n %+v\nwant\n %+v", got, want)
	}
}

func TestReconcilerLifecycle(t *testing.T) {
	e := start(t)

	// No pool yet: the policy is not accepted and defaults stay in force.
	e.createPolicy("first", "pool", 100)
	e.waitAccepted("first", metav1.ConditionFalse, crds.ReasonPoolNotFound)
	e.expectApplied(flowcontrol.DefaultConfig())

	// The pool appears: the policy is accepted and applied.
	pool := e.pool()
	if err := e.client.Create(t.Context(), pool); err != nil {
		t.Fatal(err)
	}
	e.waitAccepted("first", metav1.ConditionTrue, crds.ReasonAccepted)
	e.expectApplied(configWithQueued(100))

	// A newer policy for the same pool conflicts; one for another pool is left alone.
	e.createPolicy("second", "pool", 200)
	other := e.createPolicy("other", "other-pool", 300)
	e.waitAccepted("second", metav1.ConditionFalse, crds.ReasonConflicted)
	e.waitAccepted("first", metav1.ConditionTrue, crds.ReasonAccepted)

	// A spec change is applied and observed.
	var first crds.FlowControlPolicy
	if err := e.client.Get(t.Context(), client.ObjectKey{Namespace: e.ns, Name: "first"}, &first); err != nil {
		t.Fatal(err)
	}
	first.Spec.MaxQueuedRequests = ptr.To[int64](150)
	if err := e.client.Update(t.Context(), &first); err != nil {
		t.Fatal(err)
	}
	if first.Generation != 2 {
		t.Fatalf("generation %d after one spec update, want 2", first.Generation)
	}
	e.waitAccepted("first", metav1.ConditionTrue, crds.ReasonAccepted)
	e.expectApplied(configWithQueued(150))

	// Deleting the policy in force hands over to the next one.
	if err := e.client.Delete(t.Context(), &first); err != nil {
		t.Fatal(err)
	}
	e.waitAccepted("second", metav1.ConditionTrue, crds.ReasonAccepted)
	e.expectApplied(configWithQueued(200))

	// Deleting the pool withdraws the policy: defaults are in force again.
	if err := e.client.Delete(t.Context(), pool); err != nil {
		t.Fatal(err)
	}
	e.waitAccepted("second", metav1.ConditionFalse, crds.ReasonPoolNotFound)
	e.expectApplied(flowcontrol.DefaultConfig())

	if err := e.client.Get(t.Context(), client.ObjectKeyFromObject(other), other); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(other.Status, crds.FlowControlPolicyStatus{}) {
		t.Errorf("the reconciler wrote the status of another pool's policy: %+v", other.Status)
	}
	select {
	case cfg := <-e.applied:
		t.Errorf("unexpected extra configuration applied: %+v", cfg)
	default:
	}
}
