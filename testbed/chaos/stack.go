package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
	"sigs.k8s.io/gateway-api-inference-extension/apix/v1alpha2"

	"github.com/sluice-gw/sluice/runner"
	"github.com/sluice-gw/sluice/runner/runnertest"
	"github.com/sluice-gw/sluice/testbed/benchsuite"
	"github.com/sluice-gw/sluice/testbed/loadgen"
	"github.com/sluice-gw/sluice/testbed/procs"
	"github.com/sluice-gw/sluice/testbed/simulator"
)

// Mode is how the EPP learns its pool.
type Mode string

const (
	// Static: --static-endpoints-file, re-read while the EPP runs.
	Static Mode = "static"
	// Kubernetes: an InferencePool and its Pods on a real API server
	// (envtest).
	Kubernetes Mode = "kubernetes"
)

// Names the stack gives the load's model, pool and namespace.
const (
	model     = "m"
	poolName  = "vllm"
	namespace = "default"
)

// objectivesYAML are the three bands' InferenceObjectives: a file in static
// mode, objects in Kubernetes mode.
const objectivesYAML = `apiVersion: inference.networking.x-k8s.io/v1alpha2
kind: InferenceObjective
metadata: {name: critical}
spec: {priority: 10, poolRef: {name: vllm}}
---
apiVersion: inference.networking.x-k8s.io/v1alpha2
kind: InferenceObjective
metadata: {name: standard}
spec: {priority: 0, poolRef: {name: vllm}}
---
apiVersion: inference.networking.x-k8s.io/v1alpha2
kind: InferenceObjective
metadata: {name: sheddable}
spec: {priority: -1, poolRef: {name: vllm}}
`

// Binaries returns the folder of vllm-sim, dataplane and the EPP
// (benchsuite.LocateBinaries) and points $SLUICE_EPP_BINARY, which
// runnertest starts, at its EPP when unset. The test is skipped when they
// are missing.
func Binaries(t *testing.T) string {
	t.Helper()
	dir, err := benchsuite.LocateBinaries()
	if err != nil {
		t.Skipf("the chaos suite runs the real binaries (%v); set SLUICE_BENCH_BIN to their folder", err)
	}
	if os.Getenv("SLUICE_EPP_BINARY") == "" {
		t.Setenv("SLUICE_EPP_BINARY", filepath.Join(dir, benchsuite.EPPBinary))
	}
	return dir
}

// Cluster is a real API server (envtest) shared by the Kubernetes-mode runs
// of a suite, holding the bands' InferenceObjectives. Each run creates its
// pool and pods and deletes them when it ends.
type Cluster struct {
	API *runnertest.APIServer
}

// StartCluster starts the API server for the test.
func StartCluster(t *testing.T) *Cluster {
	t.Helper()
	api := runnertest.StartAPIServer(t, nil, v1alpha2.Install)
	objs, err := runner.ParseObjectives([]byte(objectivesYAML))
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		o.Namespace = namespace
		if err := api.Client.Create(context.Background(), o); err != nil {
			t.Fatal(err)
		}
	}
	return &Cluster{API: api}
}

// StackOptions configure a Stack.
type StackOptions struct {
	Mode Mode
	// Cluster is required in Kubernetes mode.
	Cluster *Cluster
	// Bin holds the binaries (Binaries).
	Bin string
	// Dir receives the processes' logs and files.
	Dir string
	// Servers is the fleet's size; ServerArgs are vllm-sim flags for every
	// server (profile, slots, faults at start).
	Servers    int
	ServerArgs []string
	// EPPArgs are extra EPP flags.
	EPPArgs []string
	// EPPReplicas runs this many EPP replicas sharing the endpoints (--peers, their health ports on loopback, in
	// either mode: in Kubernetes mode each watches the pool itself), the data plane balancing streams over them
	// round-robin; 0 and 1 run one.
	EPPReplicas int
	// FailOpen runs the data plane with --failure-mode-allow (Envoy's
	// failure_mode_allow); otherwise it fails closed, as GIE's default.
	FailOpen bool
	// DecisionTrace runs every EPP with the decision trace on (--decision-trace, no rate bound), for RunCase to save
	// (SaveDecisions). The soak leaves it off: the trace's ring would count in the memory it measures.
	DecisionTrace bool
	// EPPFailureRetryAfter runs the data plane with --epp-failure-retry-after (Envoy with
	// examples/envoy/epp-failure-503.yaml): failing closed, an EPP failure is answered 503 with this Retry-After
	// instead of 500.
	EPPFailureRetryAfter time.Duration
}

// Server is one simulated model server: its own vllm-sim process on its own
// loopback address, so it can be killed alone.
type Server struct {
	IP   string
	Addr string // IP:port, as the EPP names it
	proc *procs.Process
	pod  *corev1.Pod // Kubernetes mode
}

// Stack is one system under test: the simulated fleet, the EPP (Sluice
// admission on) and the data plane, on loopback. Everything is stopped when
// the test ends.
type Stack struct {
	t    *testing.T
	opts StackOptions

	Servers []*Server
	// EPP is the running EPP; KillEPP, TerminateEPP and RestartEPP replace
	// it. Only the test goroutine touches it.
	EPP *runnertest.Process
	// Replicas are every EPP replica, EPP first (StackOptions.EPPReplicas).
	Replicas []*runnertest.Process
	// Target is the data plane's base URL.
	Target string

	dataplane     *procs.Process
	endpointsFile string // static mode
	client        *http.Client

	mu     sync.Mutex
	active []bool // static mode: servers listed in the endpoints file
}

// StartStack starts the fleet, the EPP and the data plane and waits until
// each is ready. It does not wait for the EPP's first scrapes (see
// WaitFresh).
func StartStack(t *testing.T, opts StackOptions) *Stack {
	t.Helper()
	if err := os.MkdirAll(opts.Dir, 0o755); err != nil {
		t.Fatal(err)
	}
	s := &Stack{t: t, opts: opts, client: &http.Client{Timeout: 5 * time.Second}}
	t.Cleanup(s.client.CloseIdleConnections)
	ips := make([]string, opts.Servers)
	for i := range ips {
		ips[i] = "127.0.0." + strconv.Itoa(i+2)
	}
	port, err := procs.FreePortRange(1, ips...)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	var addrs []string
	for i, ip := range ips {
		srv := &Server{IP: ip, Addr: ip + ":" + strconv.Itoa(port)}
		args := append([]string{"--host=" + ip, "--port=" + strconv.Itoa(port), "--model=" + model,
			"--seed=" + strconv.Itoa(i+1), "--shutdown-timeout=2s"}, opts.ServerArgs...)
		srv.proc = s.start(fmt.Sprintf("vllm-sim-%d", i), benchsuite.SimulatorBinary, args...)
		if err := procs.WaitReady(ctx, time.Minute, "server "+srv.Addr, []*procs.Process{srv.proc},
			procs.HTTPOK(s.client, "http://"+srv.Addr+"/health")); err != nil {
			t.Fatal(err)
		}
		s.Servers = append(s.Servers, srv)
		addrs = append(addrs, srv.Addr)
	}

	eppArgs := append([]string{"--secure-serving=false", "--sluice-admission"}, opts.EPPArgs...)
	if opts.DecisionTrace {
		eppArgs = append(eppArgs, "--decision-trace="+strconv.Itoa(decisionTraceSize), "--decision-trace-rate=0")
	}
	var env []string
	switch opts.Mode {
	case Static:
		s.endpointsFile = filepath.Join(opts.Dir, "endpoints")
		s.active = make([]bool, len(s.Servers))
		for i := range s.active {
			s.active[i] = true
		}
		s.writeEndpoints()
		objectives := filepath.Join(opts.Dir, "objectives.yaml")
		if err := os.WriteFile(objectives, []byte(objectivesYAML), 0o644); err != nil {
			t.Fatal(err)
		}
		eppArgs = append(eppArgs, "--static-endpoints-file="+s.endpointsFile, "--static-endpoints-reload-interval=100ms",
			"--inference-objectives-file="+objectives)
	case Kubernetes:
		api := opts.Cluster.API
		api.CreatePool(t, port)
		for i, srv := range s.Servers {
			srv.pod = api.CreateReadyPod(t, "vllm-"+strconv.Itoa(i), srv.IP)
		}
		t.Cleanup(func() { s.deletePool(api) })
		env = []string{"KUBECONFIG=" + api.Kubeconfig, "NAMESPACE=" + namespace}
		// The suite reads the EPP's /metrics without a service account token.
		eppArgs = append(eppArgs, "--pool-name="+poolName, "--metrics-endpoint-auth=false")
	default:
		t.Fatalf("unknown mode %q", opts.Mode)
	}
	s.startEPPs(env, eppArgs)
	t.Cleanup(func() { s.saveEPPLog() })

	dpPort, err := procs.FreePortRange(1, "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	listen := "127.0.0.1:" + strconv.Itoa(dpPort)
	epps := make([]string, len(s.Replicas))
	for k, p := range s.Replicas {
		epps[k] = "127.0.0.1:" + strconv.Itoa(p.GRPCPort)
	}
	dpArgs := []string{"--listen=" + listen, "--epp=" + strings.Join(epps, ","),
		"--endpoints=" + strings.Join(addrs, ","), "--log-level=warn"}
	if opts.FailOpen {
		dpArgs = append(dpArgs, "--failure-mode-allow")
	}
	if opts.EPPFailureRetryAfter > 0 {
		dpArgs = append(dpArgs, "--epp-failure-retry-after="+opts.EPPFailureRetryAfter.String())
	}
	s.dataplane = s.start("dataplane", benchsuite.DataPlaneBinary, dpArgs...)
	if err := procs.WaitReady(ctx, time.Minute, "the data plane", []*procs.Process{s.dataplane}, procs.TCPAccepts(listen)); err != nil {
		t.Fatal(err)
	}
	s.Target = "http://" + listen
	return s
}

func (s *Stack) start(name, bin string, args ...string) *procs.Process {
	s.t.Helper()
	p, err := procs.Start(name, filepath.Join(s.opts.Dir, name+".log"), filepath.Join(s.opts.Bin, bin), args...)
	if err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(p.Stop)
	return p
}

// startEPPs starts the EPP, or its replicas, each naming the others by their health ports.
func (s *Stack) startEPPs(env, args []string) {
	s.t.Helper()
	n := max(1, s.opts.EPPReplicas)
	if n == 1 {
		s.EPP = runnertest.StartEPP(s.t, env, args...)
		s.Replicas = []*runnertest.Process{s.EPP}
		return
	}
	health, peers := make([]int, n), make([]string, n)
	for k := range health {
		health[k] = runnertest.FreePort(s.t)
		peers[k] = "127.0.0.1:" + strconv.Itoa(health[k])
	}
	for k := range n {
		replicaArgs := append(slices.Clone(args), "--peers="+strings.Join(peers, ","), "--grpc-health-port="+strconv.Itoa(health[k]))
		s.Replicas = append(s.Replicas, runnertest.StartEPP(s.t, env, replicaArgs...))
	}
	s.EPP = s.Replicas[0]
}

// saveEPPLog writes the EPP's output (all its incarnations) beside the
// other logs, and each further replica's.
func (s *Stack) saveEPPLog() {
	_ = os.WriteFile(filepath.Join(s.opts.Dir, "epp.log"), []byte(s.EPP.Output.String()), 0o644)
	for k, p := range s.Replicas[1:] {
		_ = os.WriteFile(filepath.Join(s.opts.Dir, fmt.Sprintf("epp-%d.log", k+1)), []byte(p.Output.String()), 0o644)
	}
}

// decisionTraceSize is the EPPs' --decision-trace with StackOptions.DecisionTrace: more than a full timeline's
// requests and bursts, so that each of a run's requests can be looked up (SaveDecisions).
const decisionTraceSize = 4096

// decisionsFile names replica k's decision trace in a run's folder.
func decisionsFile(k int) string {
	if k == 0 {
		return DecisionsFileName
	}
	return fmt.Sprintf("decisions-%d.json", k)
}

// SaveDecisions writes each live replica's decision trace into the stack's folder (decisionsFile) and returns the
// replicas it saved, skipping one that was killed; none without StackOptions.DecisionTrace.
func (s *Stack) SaveDecisions(ctx context.Context) ([]int, error) {
	if !s.opts.DecisionTrace {
		return nil, nil
	}
	var saved []int
	var errs []error
	for k, p := range s.Replicas {
		if p.Exited() {
			continue
		}
		url := fmt.Sprintf("http://127.0.0.1:%d%s", p.MetricsPort, runner.DecisionTracePath)
		if err := benchsuite.SaveURL(ctx, s.client, url, filepath.Join(s.opts.Dir, decisionsFile(k))); err != nil {
			errs = append(errs, fmt.Errorf("replica %d's decision trace: %w", k, err))
			continue
		}
		saved = append(saved, k)
	}
	return saved, errors.Join(errs...)
}

// deletePool removes the run's pool and pods from the shared API server.
func (s *Stack) deletePool(api *runnertest.APIServer) {
	ctx := context.Background()
	_ = api.Client.DeleteAllOf(ctx, &corev1.Pod{}, client.InNamespace(namespace), client.MatchingLabels{"app": poolName})
	_ = api.Client.Delete(ctx, &v1.InferencePool{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: poolName}})
}

// EPPMetrics scrapes the running EPP's /metrics.
func (s *Stack) EPPMetrics(ctx context.Context) (benchsuite.MetricPage, error) {
	return benchsuite.Scrape(ctx, s.client, fmt.Sprintf("http://127.0.0.1:%d/metrics", s.EPP.MetricsPort))
}

// Poll calls check every 100 ms until it returns "", or fails with its last
// message after timeout. It bounds waits on real processes (a scrape, a
// watch event); it is not a timing assertion.
func Poll(ctx context.Context, timeout time.Duration, check func() string) error {
	deadline := time.Now().Add(timeout)
	for {
		msg := check()
		if msg == "" {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("after %v: %s", timeout, msg)
		}
		if err := loadgen.Sleep(ctx, 100*time.Millisecond); err != nil {
			return err
		}
	}
}

// WaitFresh waits until the EPP knows every active server and has fresh
// metrics for all of them.
func (s *Stack) WaitFresh(ctx context.Context, timeout time.Duration) error {
	return Poll(ctx, timeout, func() string {
		page, err := s.EPPMetrics(ctx)
		if err != nil {
			return err.Error()
		}
		ready, stale := page.Sum("inference_pool_ready_pods"), page.Sum("sluice_flowcontrol_stale_endpoints")
		if _, ok := page["sluice_flowcontrol_stale_endpoints"]; !ok || int(ready) != len(s.Servers) || stale != 0 {
			return fmt.Sprintf("the EPP knows %v of %d servers, %v with stale metrics", ready, len(s.Servers), stale)
		}
		return ""
	})
}

// WaitQueued waits until at least n requests wait in the EPP.
func (s *Stack) WaitQueued(ctx context.Context, n int, timeout time.Duration) error {
	return Poll(ctx, timeout, func() string {
		page, err := s.EPPMetrics(ctx)
		if err != nil {
			return err.Error()
		}
		if q := page.Sum("sluice_flowcontrol_queue_length"); q < float64(n) {
			return fmt.Sprintf("%v requests queued in the EPP, want %d", q, n)
		}
		return ""
	})
}

// WaitDrained waits until nothing waits in the EPP and no reservation is
// left, which must happen within a few scrapes once the load has ended; a
// queue entry or reservation that stays is a leak.
func (s *Stack) WaitDrained(ctx context.Context, timeout time.Duration) error {
	return Poll(ctx, timeout, func() string {
		page, err := s.EPPMetrics(ctx)
		if err != nil {
			return err.Error()
		}
		q, r := page.Sum("sluice_flowcontrol_queue_length"), page.Sum("sluice_flowcontrol_reserved_requests")
		if _, ok := page["sluice_flowcontrol_reserved_requests"]; !ok || q != 0 || r != 0 {
			return fmt.Sprintf("%v requests queued and %v reservations held in the EPP after the load", q, r)
		}
		return ""
	})
}

// SetFaults replaces server i's injected faults (POST /admin/faults).
func (s *Stack) SetFaults(i int, f simulator.Faults) {
	s.t.Helper()
	body, err := json.Marshal(f)
	if err != nil {
		s.t.Fatal(err)
	}
	resp, err := s.client.Post("http://"+s.Servers[i].Addr+"/admin/faults", "application/json", bytes.NewReader(body))
	if err != nil {
		s.t.Fatalf("setting faults on %s: %v", s.Servers[i].Addr, err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		s.t.Fatalf("setting faults on %s: %s", s.Servers[i].Addr, resp.Status)
	}
}

// KillServer ends server i with SIGKILL: its connections and streams are
// cut and its port refuses connections.
func (s *Stack) KillServer(i int) { s.Servers[i].proc.Kill() }

// RestartServer starts server i again, empty, and waits until it is
// healthy.
func (s *Stack) RestartServer(i int) {
	s.t.Helper()
	p, err := s.Servers[i].proc.Restart()
	if err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(p.Stop)
	s.Servers[i].proc = p
	if err := procs.WaitReady(s.t.Context(), time.Minute, "server "+s.Servers[i].Addr, []*procs.Process{p},
		procs.HTTPOK(s.client, "http://"+s.Servers[i].Addr+"/health")); err != nil {
		s.t.Fatal(err)
	}
}

// SetInPool puts server i in or out of the pool: in static mode by
// rewriting the endpoints file, in Kubernetes mode by its pod's Ready
// condition.
func (s *Stack) SetInPool(i int, in bool) {
	s.t.Helper()
	switch s.opts.Mode {
	case Static:
		s.mu.Lock()
		s.active[i] = in
		s.mu.Unlock()
		s.writeEndpoints()
	case Kubernetes:
		srv := s.Servers[i]
		if err := s.opts.Cluster.API.Client.Get(context.Background(), client.ObjectKeyFromObject(srv.pod), srv.pod); err != nil {
			s.t.Fatal(err)
		}
		s.opts.Cluster.API.SetPodReady(s.t, srv.pod, srv.IP, in)
	}
}

// DeleteFromPool removes server i from the pool for good: in Kubernetes
// mode its pod is deleted, in static mode it leaves the endpoints file. The
// server itself keeps running, as a terminating pod's server finishes what
// it serves.
func (s *Stack) DeleteFromPool(i int) {
	s.t.Helper()
	if s.opts.Mode == Static {
		s.SetInPool(i, false)
		return
	}
	if err := s.opts.Cluster.API.Client.Delete(context.Background(), s.Servers[i].pod); err != nil {
		s.t.Fatal(err)
	}
}

// SelectPool edits the InferencePool's selector (Kubernetes mode) so that it
// selects the servers for which in is true (they get the label
// chaos-shard=in), or, with in nil, every server again.
func (s *Stack) SelectPool(in func(i int) bool) {
	s.t.Helper()
	ctx := context.Background()
	c := s.opts.Cluster.API.Client
	for i, srv := range s.Servers {
		if in == nil {
			break
		}
		if err := c.Get(ctx, client.ObjectKeyFromObject(srv.pod), srv.pod); err != nil {
			s.t.Fatal(err)
		}
		if in(i) {
			srv.pod.Labels["chaos-shard"] = "in"
		} else {
			delete(srv.pod.Labels, "chaos-shard")
		}
		if err := c.Update(ctx, srv.pod); err != nil {
			s.t.Fatal(err)
		}
	}
	pool := &v1.InferencePool{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: poolName}, pool); err != nil {
		s.t.Fatal(err)
	}
	pool.Spec.Selector.MatchLabels = map[v1.LabelKey]v1.LabelValue{"app": poolName}
	if in != nil {
		pool.Spec.Selector.MatchLabels["chaos-shard"] = "in"
	}
	if err := c.Update(ctx, pool); err != nil {
		s.t.Fatal(err)
	}
}

// writeEndpoints writes the static endpoints file: the servers in the pool,
// through a rename so the EPP never reads half a file.
func (s *Stack) writeEndpoints() {
	s.t.Helper()
	s.mu.Lock()
	var b strings.Builder
	for i, srv := range s.Servers {
		if s.active[i] {
			fmt.Fprintln(&b, srv.Addr)
		} else {
			fmt.Fprintf(&b, "# %s (out of the pool)\n", srv.Addr)
		}
	}
	s.mu.Unlock()
	tmp := s.endpointsFile + ".tmp"
	if err := os.WriteFile(tmp, []byte(b.String()), 0o644); err != nil {
		s.t.Fatal(err)
	}
	if err := os.Rename(tmp, s.endpointsFile); err != nil {
		s.t.Fatal(err)
	}
}

// KillReplica ends EPP replica k (not the first, which the suite reads) with SIGKILL.
func (s *Stack) KillReplica(k int) {
	if k == 0 {
		s.t.Fatal("KillReplica(0): kill a replica the suite does not read, or use KillEPP")
	}
	s.Replicas[k].Kill()
}

// KillEPP ends the EPP with SIGKILL.
func (s *Stack) KillEPP() { s.EPP.Kill() }

// TerminateEPP sends the EPP SIGTERM and waits for it to exit; the error is
// its exit status (or that it did not exit in time).
func (s *Stack) TerminateEPP(limit time.Duration) error {
	exit, err := s.EPP.Terminate(limit)
	if err != nil {
		return err
	}
	return exit
}

// RestartEPP starts the EPP again on the same ports and waits until it is
// ready.
func (s *Stack) RestartEPP() {
	s.EPP = s.EPP.Restart(s.t)
	s.Replicas[0] = s.EPP
}
