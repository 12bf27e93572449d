package conformance

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"

	"github.com/sluice-gw/sluice/runner/runnertest"
)

// engineLabel is the pod label GIE's metrics extractor reads to pick an
// engine's metric names (proposal 003's table).
const engineLabel = "inference.networking.k8s.io/engine-type"

// FixtureSpec describes the pool and EPP a group's cases share.
type FixtureSpec struct {
	// Pods is the number of Ready pods; Ranks the target ports per pod
	// (data-parallel ranks, default 1).
	Pods, Ranks int
	// Engines, when set, label pod i with Engines[i%len(Engines)].
	Engines []Engine
	// Config is an EndpointPickerConfig for --config-file; "" runs the
	// implementation's default.
	Config string
	// Args are extra EPP flags.
	Args []string
	// Manifest runs the EPP as upstream's Gateway-profile manifests do (see
	// gatewayProfileEPP) instead of with the suite's standard flags.
	Manifest bool
	// Report, when set, replaces every endpoint's metrics page from the
	// start with this load in its pod's engine names (default vLLM).
	Report *Load
}

// Env is what every case of one implementation shares: the implementation
// and the API server.
type Env struct {
	Impl Implementation
	API  *runnertest.APIServer
}

// Fixture is a pool of Ready pods backed by simulated model servers, in a
// namespace of its own, and one EPP process of the implementation serving it.
type Fixture struct {
	*Env
	Namespace, Pool string
	Pods            []*corev1.Pod
	// Endpoints[i][r] is pod i's rank r.
	Endpoints [][]*Endpoint
	EPP       *runnertest.Process
	Envoy     *Envoy
	// selectByHeader: the EPP runs upstream's conformance configuration,
	// which routes only to the endpoint the test-epp-endpoint-selection
	// header names.
	selectByHeader bool
}

var nonDNS = regexp.MustCompile(`[^a-z0-9-]+`)

// namespaceFor is a namespace name unique to group and implementation.
func namespaceFor(group, impl string) string {
	n := strings.Trim(nonDNS.ReplaceAllString(strings.ToLower(group+"-"+impl), "-"), "-")
	if len(n) > 63 {
		n = strings.TrimRight(n[:63], "-")
	}
	return n
}

// newFixture creates the namespace and, unless spec is nil, the pool of
// spec and its EPP (Populate, then Start).
func newFixture(t testing.TB, env *Env, group string, spec *FixtureSpec) *Fixture {
	t.Helper()
	f := &Fixture{Env: env, Namespace: namespaceFor(group, env.Impl.Name), Pool: "pool"}
	f.create(t, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: f.Namespace}})
	if spec != nil {
		f.Populate(t, spec)
		f.Start(t, spec)
	}
	return f
}

// Populate starts spec's simulated model servers and creates their Ready
// pods and the InferencePool selecting them.
func (f *Fixture) Populate(t testing.TB, spec *FixtureSpec) {
	t.Helper()
	ranks := max(spec.Ranks, 1)
	ips := make([]string, spec.Pods)
	for i := range ips {
		ips[i] = fmt.Sprintf("127.0.0.%d", 10+i)
	}
	f.Endpoints = make([][]*Endpoint, spec.Pods)
	var ports []v1.Port
	for range ranks {
		eps := startEndpoints(t, ips)
		for i, ep := range eps {
			f.Endpoints[i] = append(f.Endpoints[i], ep)
		}
		ports = append(ports, v1.Port{Number: v1.PortNumber(eps[0].Port)})
	}
	for i, ip := range ips {
		labels := map[string]string{"app": "model-server"}
		engine := VLLM
		if len(spec.Engines) > 0 {
			engine = spec.Engines[i%len(spec.Engines)]
			labels[engineLabel] = string(engine)
		}
		if spec.Report != nil {
			for _, ep := range f.Endpoints[i] {
				ep.Report(engine, *spec.Report)
			}
		}
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("model-server-%d", i), Namespace: f.Namespace, Labels: labels},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "vllm", Image: "vllm/vllm-openai"}}},
		}
		f.create(t, pod)
		f.API.SetPodReady(t, pod, ip, true)
		f.Pods = append(f.Pods, pod)
	}
	f.CreatePool(t, ports)
}

// Start runs the EPP for the pool and waits until it routes to every
// endpoint.
func (f *Fixture) Start(t testing.TB, spec *FixtureSpec) {
	t.Helper()
	if spec.Manifest {
		f.EPP = gatewayProfileEPP(t, f, spec)
		f.selectByHeader = true
	} else {
		f.EPP = f.StartEPP(t, "readiness", spec)
	}
	var err error
	if f.Envoy, err = DialEnvoy(fmt.Sprintf("127.0.0.1:%d", f.EPP.GRPCPort), spec.Manifest); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.Envoy.Close() })
	f.WaitRoutesTo(t, f.AllAddrs()...)
}

// StartEPP runs the implementation against the fixture's pool with the
// suite's standard flags, the implementation's, and spec's, waiting until
// the health service waitFor is serving ("" waits only for an answer).
func (f *Fixture) StartEPP(t testing.TB, waitFor string, spec *FixtureSpec) *runnertest.Process {
	t.Helper()
	args := []string{
		"--pool-name=" + f.Pool, "--pool-namespace=" + f.Namespace,
		"--secure-serving=false", "--metrics-endpoint-auth=false",
	}
	args = append(args, f.Impl.Args...)
	if spec != nil {
		if spec.Config != "" {
			path := filepath.Join(t.TempDir(), "epp-config.yaml")
			if err := os.WriteFile(path, []byte(spec.Config), 0o600); err != nil {
				t.Fatal(err)
			}
			args = append(args, "--config-file="+path)
		}
		args = append(args, spec.Args...)
	}
	return runnertest.StartBinary(t, f.Impl.Binary, []string{"KUBECONFIG=" + f.API.Kubeconfig}, waitFor, args...)
}

// CreatePool creates the fixture's InferencePool selecting its pods on ports.
func (f *Fixture) CreatePool(t testing.TB, ports []v1.Port) {
	t.Helper()
	f.create(t, &v1.InferencePool{
		ObjectMeta: metav1.ObjectMeta{Name: f.Pool, Namespace: f.Namespace},
		Spec: v1.InferencePoolSpec{
			Selector:          v1.LabelSelector{MatchLabels: map[v1.LabelKey]v1.LabelValue{"app": "model-server"}},
			TargetPorts:       ports,
			EndpointPickerRef: v1.EndpointPickerRef{Name: "epp", Port: &v1.Port{Number: 9002}},
		},
	})
}

func (f *Fixture) create(t testing.TB, obj client.Object) {
	t.Helper()
	if err := f.API.Client.Create(context.Background(), obj); err != nil {
		t.Fatalf("creating %T %s: %v", obj, obj.GetName(), err)
	}
}

// Update writes obj (read, changed by change, written; retried on
// conflicts).
func Update[O client.Object](t testing.TB, c client.Client, obj O, change func(O)) {
	t.Helper()
	for attempt := 0; ; attempt++ {
		if err := c.Get(context.Background(), client.ObjectKeyFromObject(obj), obj); err != nil {
			t.Fatalf("reading %s: %v", obj.GetName(), err)
		}
		change(obj)
		err := c.Update(context.Background(), obj)
		if err == nil {
			return
		}
		if !apierrors.IsConflict(err) || attempt == 5 {
			t.Fatalf("updating %s: %v", obj.GetName(), err)
		}
	}
}

// SetReady sets pod's status: running on its fixture IP, Ready or not.
func (f *Fixture) SetReady(t testing.TB, pod *corev1.Pod, ready bool) {
	t.Helper()
	f.API.SetPodReady(t, pod, pod.Status.PodIP, ready)
}

// Addrs are pod i's endpoints (ip:port, one per rank).
func (f *Fixture) Addrs(i int) []string {
	var out []string
	for _, ep := range f.Endpoints[i] {
		out = append(out, ep.Addr())
	}
	return out
}

// AllAddrs are every endpoint of the pool.
func (f *Fixture) AllAddrs() []string {
	var out []string
	for i := range f.Endpoints {
		out = append(out, f.Addrs(i)...)
	}
	return out
}

// ReportAll sets every endpoint's metrics page to l in engine e's names.
func (f *Fixture) ReportAll(e Engine, l Load) {
	for _, eps := range f.Endpoints {
		for _, ep := range eps {
			ep.Report(e, l)
		}
	}
}

// WaitRoutesTo sends requests until every one of want has been chosen at
// least once, by header or metadata (the EPP learns pods from watch events
// and metrics from scrapes); requests that get immediate responses meanwhile
// are retried.
func (f *Fixture) WaitRoutesTo(t testing.TB, want ...string) {
	t.Helper()
	seen := map[string]bool{}
	runnertest.Eventually(t, fmt.Sprintf("the EPP routes to each of %v", want), func() string {
		for _, w := range want {
			if seen[w] {
				continue
			}
			req := Request{Body: Chat(uniquePrompt()), Subset: []string{w}}
			if f.selectByHeader {
				req.Headers = map[string]string{testSelectionHeader: w}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			d, err := f.Envoy.Exchange(ctx, req)
			cancel()
			if err != nil {
				return err.Error()
			}
			if d.Immediate != nil {
				return fmt.Sprintf("%s: immediate response %d %s", w, d.Immediate.Status, d.Immediate.Body)
			}
			// Either way of naming the endpoint will do here: the cases check
			// each one.
			if splitEndpoints(d.Destination())[0] != w && splitEndpoints(d.MetadataDestination())[0] != w {
				return fmt.Sprintf("subset [%s] routed to %q (metadata %q)", w, d.Destination(), d.MetadataDestination())
			}
			seen[w] = true
		}
		return ""
	})
}
