package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/sluice-gw/sluice/crds"
	"github.com/sluice-gw/sluice/plugins"
	"github.com/sluice-gw/sluice/runner/runnertest"
	"github.com/sluice-gw/sluice/testbed/dataplane"
	"github.com/sluice-gw/sluice/testbed/fleettest"
	"github.com/sluice-gw/sluice/testbed/simulator"
	"github.com/sluice-gw/sluice/testbed/simulator/engine"
)

// The release every chart test installs, and the model server label its pool selects.
const (
	chartRelease = "vllm-llama3"
	modelLabel   = "vllm-llama3"
	servedModel  = "meta-llama/Llama-3.1-8B-Instruct"
)

// sluiceImage are the only values a drop-in changes: upstream's chart with Sluice's image (`make image` tags it
// sluice/epp:VERSION; the registry is wherever it was pushed), plus the pool's selector every install sets.
var sluiceImage = []string{
	"--set", "inferenceExtension.image.registry=registry.example.com",
	"--set", "inferenceExtension.image.repository=sluice/epp",
	"--set", "inferenceExtension.image.tag=v0.1.0",
	"--set", "inferencePool.modelServers.matchLabels.app=" + modelLabel,
}

// chartVariant is one way upstream's chart is commonly installed.
type chartVariant struct {
	name   string
	values []string
	// skipped are the kinds it renders that the test API server does not serve (a provider's or a monitoring
	// stack's CRDs), which only that provider's controllers read.
	skipped []string
	// metricsReader is the service account whose token scrapes /metrics, "" for none.
	metricsReader string
}

var chartVariants = []chartVariant{
	{name: "default"},
	{name: "leader-election", values: []string{"--set", "inferenceExtension.replicas=3"}},
	{
		name:          "gke-monitoring",
		values:        []string{"--set", "provider.name=gke", "--set", "inferenceExtension.monitoring.prometheus.enabled=true"},
		skipped:       []string{"GCPBackendPolicy.networking.gke.io", "HealthCheckPolicy.networking.gke.io", "PodMonitoring.monitoring.googleapis.com"},
		metricsReader: chartRelease + "-metrics-reader-sa",
	},
}

// TestUpstreamChartDropIn installs GIE v1.5.0's own inferencepool chart with only the image values pointing at
// Sluice's image, for the chart's main variants, against a real API server, and runs the rendered EPP container
// with Sluice's binary and then with upstream's, under the chart's service account and RBAC: each must become
// ready, route through the Service's ext_proc port to the chart's pool (simulated vLLM servers as its pods),
// serve the Service's metrics port, pass the chart's probes and stop cleanly on SIGTERM, and Sluice's binary must
// do exactly what upstream's does.
func TestUpstreamChartDropIn(t *testing.T) {
	helmBinary(t)
	binaries := []struct{ name, path string }{{"sluice", runnertest.EPPPath(t)}, {"upstream", runnertest.UpstreamEPPPath(t)}}
	chart := upstreamChart(t)
	api := runnertest.StartAPIServer(t, nil)
	servers := startModelServers(t)

	var defaultEPP corev1.Container
	for _, v := range chartVariants {
		t.Run(v.name, func(t *testing.T) {
			ns := "chart-" + v.name
			objs := renderChart(t, chart, chartRelease, ns, slices.Concat(sluiceImage, v.values)...)
			var deploy appsv1.Deployment
			findObject(t, objs, "Deployment", chartRelease+"-epp", &deploy)
			epp := eppContainer(t, &deploy)
			if want := "registry.example.com/sluice/epp:v0.1.0"; epp.Image != want {
				t.Fatalf("rendered the epp container with image %s, want %s", epp.Image, want)
			}
			if v.name == "default" {
				defaultEPP = epp
			} else if v.name == "gke-monitoring" && !reflect.DeepEqual(epp, defaultEPP) {
				// GKE's objects are the provider's; the EPP container must be the default's.
				t.Errorf("provider gke changed the EPP container:\n%+v\ndefault:\n%+v", epp, defaultEPP)
			}
			if got := applyObjects(t, api, ns, objs); !reflect.DeepEqual(got, v.skipped) {
				t.Errorf("kinds the API server does not serve: %v, want %v", got, v.skipped)
			}
			createModelServerPods(t, api, ns, servers)

			seen := map[string]chartObservation{}
			for _, bin := range binaries {
				t.Run(bin.name, func(t *testing.T) {
					seen[bin.name] = observeChartEPP(t, api, objs, &deploy, bin.path, v.metricsReader)
				})
			}
			if s, u := seen["sluice"], seen["upstream"]; !reflect.DeepEqual(s, u) {
				t.Errorf("Sluice's EPP differs from upstream's under the same chart:\nsluice   %+v\nupstream %+v", s, u)
			}
			if got, want := seen["sluice"], serving(v.metricsReader != ""); !reflect.DeepEqual(got, want) {
				t.Errorf("Sluice's EPP under the chart: %+v, want %+v", got, want)
			}
		})
	}

	t.Run("istio", func(t *testing.T) {
		// Istio's variant adds a DestinationRule that makes the gateway dial the EPP over TLS without verifying
		// its certificate, which is how every variant above dials it; it changes nothing the EPP runs with.
		ns := "chart-istio"
		objs := renderChart(t, chart, chartRelease, ns, slices.Concat(sluiceImage, []string{"--set", "provider.name=istio"})...)
		var deploy appsv1.Deployment
		findObject(t, objs, "Deployment", chartRelease+"-epp", &deploy)
		if epp := eppContainer(t, &deploy); !reflect.DeepEqual(epp, defaultEPP) {
			t.Errorf("provider istio changed the EPP container:\n%+v\ndefault:\n%+v", epp, defaultEPP)
		}
		var rule struct {
			Spec struct {
				Host          string `json:"host"`
				TrafficPolicy struct {
					TLS map[string]any `json:"tls"`
				} `json:"trafficPolicy"`
			} `json:"spec"`
		}
		findObject(t, objs, "DestinationRule", chartRelease+"-epp", &rule)
		wantHost := chartRelease + "-epp." + ns + ".svc.cluster.local"
		if rule.Spec.Host != wantHost || rule.Spec.TrafficPolicy.TLS["mode"] != "SIMPLE" || rule.Spec.TrafficPolicy.TLS["insecureSkipVerify"] != true {
			t.Errorf("DestinationRule %+v, want host %s with TLS SIMPLE, insecureSkipVerify", rule.Spec, wantHost)
		}
	})
}

// TestUpstreamChartWithSluiceValues installs Sluice on upstream's chart as the README says: Sluice's image, then
// Sluice's CRD and examples/helm/sluice-rbac.yaml bound to the chart's service account, then
// examples/helm/sluice-values.yaml. Sluice admission and Sluice's default profile run, under the chart's and that
// RBAC only, and a FlowControlPolicy is accepted; also with replicas > 1 and the EPP's Service named as the peers, as
// the values file says to run replicas that share the endpoints.
func TestUpstreamChartWithSluiceValues(t *testing.T) {
	helmBinary(t)
	chart := upstreamChart(t)
	api := runnertest.StartAPIServer(t, nil, crds.AddToScheme)
	servers := startModelServers(t)
	root := filepath.Join("..", "..")
	ctx := context.Background()

	// The values file's profile is Sluice's default profile, the one the EPP runs without a configuration.
	values, err := os.ReadFile(filepath.Join(root, "examples", "helm", "sluice-values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var parsed struct {
		InferenceExtension struct {
			PluginsConfigFile   string            `json:"pluginsConfigFile"`
			PluginsCustomConfig map[string]string `json:"pluginsCustomConfig"`
		} `json:"inferenceExtension"`
	}
	if err := yaml.Unmarshal(values, &parsed); err != nil {
		t.Fatal(err)
	}
	profile, err := plugins.DefaultEndpointPickerConfig()
	if err != nil {
		t.Fatal(err)
	}
	if got := parsed.InferenceExtension.PluginsCustomConfig[parsed.InferenceExtension.PluginsConfigFile]; !yamlEqual(t, got, profile) {
		t.Errorf("sluice-values.yaml's %s is not Sluice's default profile (plugins.DefaultEndpointPickerConfig):\n%s\nwant:\n%s",
			parsed.InferenceExtension.PluginsConfigFile, got, profile)
	}

	api.InstallCRDs(t, filepath.Join(root, "crds", "manifests"))
	// Sluice's values, and with them replicas that share the endpoints: the chart adds --ha-enable-leader-election
	// whenever it runs more than one replica, and naming the EPP's own Service as the peers supersedes it, so the
	// replica is ready without being elected (each replica is; the test runs one, the container's ports being fixed).
	for _, v := range []struct {
		name   string
		values []string
		// wantArgs must be among the rendered container's arguments, wantLog in the EPP's log.
		wantArgs, wantLog []string
		// leaseHeld: another replica holds the leader-election Lease, so a replica waiting to be elected is never
		// ready.
		leaseHeld bool
	}{
		{name: "one replica"},
		{
			name:     "replicas sharing the endpoints",
			values:   []string{"--set", "inferenceExtension.replicas=2", "--set", "inferenceExtension.flags.peers-service=" + chartRelease + "-epp"},
			wantArgs: []string{"--ha-enable-leader-election", "--peers-service"},
			wantLog: []string{`"msg":"--ha-enable-leader-election is superseded by the peers: every replica is active and they share the pool's endpoints"`,
				`"msg":"Sharing the pool's endpoints with peer replicas"`},
			leaseHeld: true,
		},
	} {
		t.Run(v.name, func(t *testing.T) {
			ns := "chart-sluice-" + strings.ReplaceAll(v.name, " ", "-")
			objs := renderChart(t, chart, chartRelease, ns, slices.Concat(sluiceImage, []string{"-f", filepath.Join(root, "examples", "helm", "sluice-values.yaml")}, v.values)...)
			if skipped := applyObjects(t, api, ns, objs); len(skipped) > 0 {
				t.Errorf("kinds the API server does not serve: %v", skipped)
			}
			// Step 2 of the README: the CRD (installed once, above), the ClusterRole, and the binding `kubectl create
			// rolebinding` makes.
			rbac, err := os.ReadFile(filepath.Join(root, "examples", "helm", "sluice-rbac.yaml"))
			if err != nil {
				t.Fatal(err)
			}
			applyObjects(t, api, ns, parseObjects(t, rbac))
			binding := &rbacv1.RoleBinding{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: chartRelease + "-sluice"},
				RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "sluice-epp"},
				Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: chartRelease + "-epp"}},
			}
			if err := api.Client.Create(ctx, binding); err != nil {
				t.Fatal(err)
			}
			createModelServerPods(t, api, ns, servers)

			var deploy appsv1.Deployment
			findObject(t, objs, "Deployment", chartRelease+"-epp", &deploy)
			args := eppContainer(t, &deploy).Args
			for _, a := range v.wantArgs {
				if !slices.Contains(args, a) {
					t.Fatalf("the chart rendered the epp container without %s: %q", a, args)
				}
			}
			policy := &crds.FlowControlPolicy{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "bands"},
				Spec: crds.FlowControlPolicySpec{
					PoolRef:           crds.PoolReference{Name: chartRelease},
					MaxQueuedRequests: ptr.To[int64](500),
					// Scrapes on a busy test machine can lag behind the 200ms default.
					Endpoint: &crds.EndpointThresholds{MetricsStalenessThreshold: &metav1.Duration{Duration: 3 * time.Second}},
				},
			}
			if err := api.Client.Create(ctx, policy); err != nil {
				t.Fatal(err)
			}
			if v.leaseHeld {
				// The Lease upstream's manager elects its leader with (runserver's LeaderElectionID), held for an hour.
				lease := &coordinationv1.Lease{
					ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("epp-%s-%s.gateway-api-inference-extension.sigs.k8s.io", ns, chartRelease)},
					Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("another-replica"), LeaseDurationSeconds: ptr.To[int32](3600),
						AcquireTime: &metav1.MicroTime{Time: time.Now()}, RenewTime: &metav1.MicroTime{Time: time.Now()}},
				}
				if err := api.Client.Create(ctx, lease); err != nil {
					t.Fatal(err)
				}
			}
			var pod *podProcess
			got := observeChartEPPWith(t, api, objs, &deploy, runnertest.EPPPath(t), "", func(p *podProcess) {
				pod = p
				runnertest.Eventually(t, "the EPP, under the chart's service account, accepts the FlowControlPolicy", func() string {
					var p crds.FlowControlPolicy
					if err := api.Client.Get(ctx, client.ObjectKeyFromObject(policy), &p); err != nil {
						return err.Error()
					}
					if !meta.IsStatusConditionTrue(p.Status.Conditions, crds.ConditionAccepted) {
						return fmt.Sprintf("conditions %+v", p.Status.Conditions)
					}
					return ""
				})
			})
			if want := serving(false); !reflect.DeepEqual(got, want) {
				t.Errorf("Sluice's EPP under the chart with Sluice's values: %+v, want %+v", got, want)
			}
			out := pod.output.String()
			for _, s := range append([]string{`"msg":"Sluice admission enabled"`, `"msg":"Flow control policy applied"`}, v.wantLog...) {
				if !strings.Contains(out, s) {
					t.Errorf("the EPP's log lacks %s", s)
				}
			}
			if strings.Contains(out, "No "+plugins.HeadroomFilterType+" plugin is configured") {
				t.Errorf("the EPP runs without Sluice's headroom filter: the values' profile is not in force")
			}
		})
	}
}

// eppContainer returns deploy's container named epp, its release namespace written NAMESPACE so that variants
// installed in different namespaces compare.
func eppContainer(t *testing.T, deploy *appsv1.Deployment) corev1.Container {
	t.Helper()
	for _, c := range deploy.Spec.Template.Spec.Containers {
		if c.Name == "epp" {
			c.Args = slices.Clone(c.Args)
			for i, a := range c.Args {
				if a == deploy.Namespace {
					c.Args[i] = "NAMESPACE"
				}
			}
			return c
		}
	}
	t.Fatalf("Deployment %s has no epp container", deploy.Name)
	return corev1.Container{}
}

// chartRequests is how many requests each run sends through the Service's ext_proc port.
const chartRequests = 6

// chartObservation is what a run of the rendered EPP container did; Sluice's and upstream's must be equal.
type chartObservation struct {
	// Ready and Live: the chart's readiness and liveness probes pass.
	Ready, Live bool
	// Routed says how many chat requests, sent through a data plane dialling the Service's ext_proc port as the
	// gateway does (TLS, unverified), were answered 200 by the pool's servers.
	Routed string
	// Metrics is the HTTP status of GET /metrics on the Service's metrics port, per caller: "anonymous", and
	// "reader" with the token of the chart's metrics reader, when it renders one.
	Metrics map[string]int
	// PoolGauges: what the reader scraped has upstream's pool gauges.
	PoolGauges bool
	// Stopped is how the process ended on SIGTERM.
	Stopped string
}

// serving is what a healthy EPP under the chart does: ready and live, every request routed, /metrics refused
// without a token (the chart leaves metrics auth on), and, with the token of a reader the chart grants /metrics,
// served with upstream's pool gauges; SIGTERM ends it cleanly.
func serving(reader bool) chartObservation {
	o := chartObservation{Ready: true, Live: true, Routed: fmt.Sprintf("%d/%d answered 200 by the pool's servers", chartRequests, chartRequests),
		Metrics: map[string]int{"anonymous": http.StatusUnauthorized}, Stopped: "exited 0"}
	if reader {
		o.Metrics["reader"], o.PoolGauges = http.StatusOK, true
	}
	return o
}

func observeChartEPP(t *testing.T, api *runnertest.APIServer, objs []*unstructured.Unstructured, deploy *appsv1.Deployment, binary, metricsReader string) chartObservation {
	return observeChartEPPWith(t, api, objs, deploy, binary, metricsReader, nil)
}

// observeChartEPPWith runs deploy's epp container with binary, runs also (when not nil) once it is ready, observes
// it, and stops it.
func observeChartEPPWith(t *testing.T, api *runnertest.APIServer, objs []*unstructured.Unstructured, deploy *appsv1.Deployment, binary, metricsReader string, also func(*podProcess)) chartObservation {
	t.Helper()
	p := startPod(t, api, deploy, "epp", binary)
	p.waitReady()
	if also != nil {
		also(p)
	}
	var svc corev1.Service
	findObject(t, objs, "Service", chartRelease+"-epp", &svc)
	o := chartObservation{Ready: true, Live: p.probe(p.container.LivenessProbe), Metrics: map[string]int{}}
	for _, sp := range svc.Spec.Ports {
		port := sp.Port
		switch {
		case sp.TargetPort.StrVal != "":
			port = p.port(sp.TargetPort.StrVal)
		case sp.TargetPort.IntVal != 0:
			port = sp.TargetPort.IntVal
		}
		p.waitListening(port)
		switch sp.Name {
		case "grpc-ext-proc":
			o.Routed = routeThroughDataPlane(t, int(port))
		case "http-metrics":
			url := fmt.Sprintf("http://127.0.0.1:%d/metrics", port)
			o.Metrics["anonymous"], _ = scrape(t, url, "")
			if metricsReader != "" {
				o.Metrics["reader"], o.PoolGauges = scrapePoolGauges(t, url, api.ServiceAccountToken(t, deploy.Namespace, metricsReader))
			}
		default:
			t.Errorf("Service port %s: the test does not know what it serves", sp.Name)
		}
	}
	o.Stopped = p.stop()
	return o
}

// routeThroughDataPlane sends chat requests through a data plane that asks the EPP on port, over TLS as the
// chart's InferencePool tells the gateway, and says how many were answered 200 by the pool's servers.
func routeThroughDataPlane(t *testing.T, port int) string {
	t.Helper()
	url := fleettest.StartDataPlane(t, dataplane.Config{EPPAddress: fmt.Sprintf("127.0.0.1:%d", port), EPPTLS: true, ReportServedHeader: true})
	ok := 0
	for i := range chartRequests {
		body := fmt.Sprintf(`{"model":%q,"max_tokens":8,"messages":[{"role":"user","content":"hello %d"}]}`, servedModel, i)
		resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		out, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		served := resp.Header.Get("x-gateway-destination-endpoint-served")
		if resp.StatusCode == http.StatusOK && strings.HasPrefix(served, modelServerIPPrefix) && json.Valid(out) {
			ok++
		} else {
			t.Logf("request %d: status %d, served by %q: %s", i, resp.StatusCode, served, out)
		}
	}
	return fmt.Sprintf("%d/%d answered 200 by the pool's servers", ok, chartRequests)
}

// scrapePoolGauges scrapes url with token until it shows upstream's pool gauges, which the EPP sets every
// --refresh-prometheus-metrics-interval (5s), with the pool's two ready pods, for at most 20s. It returns the last
// status and whether it did.
func scrapePoolGauges(t *testing.T, url, token string) (int, bool) {
	t.Helper()
	want := fmt.Sprintf("inference_pool_ready_pods{name=%q} 2", chartRelease)
	deadline := time.Now().Add(20 * time.Second)
	for {
		status, body := scrape(t, url, token)
		if status == http.StatusOK && strings.Contains(body, want) && strings.Contains(body, "inference_pool_average_queue_size{") {
			return status, true
		}
		if time.Now().After(deadline) {
			t.Logf("after 20s, /metrics (status %d) lacks %s or inference_pool_average_queue_size", status, want)
			return status, false
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// scrape GETs url, with a bearer token when not empty, and returns the status and body.
func scrape(t *testing.T, url, token string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	c := &http.Client{Timeout: 10 * time.Second}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// modelServerIPPrefix: the simulated model servers listen on 127.0.10.x, port 8000 (the chart's default target
// port), which is also their pods' IPs.
const modelServerIPPrefix = "127.0.10."

// startModelServers serves two simulated vLLM servers (H100-like) for the whole test and returns their IPs.
func startModelServers(t *testing.T) []string {
	t.Helper()
	cfg, err := engine.Profile("h100")
	if err != nil {
		t.Fatal(err)
	}
	var ips []string
	for i := 1; i <= 2; i++ {
		ip := fmt.Sprintf("%s%d", modelServerIPPrefix, i)
		fleettest.StartSimulator(t, ip+":8000", simulator.Options{Model: servedModel, Engine: cfg, Seed: uint64(i)})
		ips = append(ips, ip)
	}
	return ips
}

// createModelServerPods creates one Ready pod of the pool per server IP in namespace.
func createModelServerPods(t *testing.T, api *runnertest.APIServer, namespace string, ips []string) {
	t.Helper()
	for i, ip := range ips {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: fmt.Sprintf("%s-%d", modelLabel, i), Labels: map[string]string{"app": modelLabel}},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "vllm", Image: "vllm/vllm-openai"}}},
		}
		if err := api.Client.Create(context.Background(), pod); err != nil {
			t.Fatal(err)
		}
		api.SetPodReady(t, pod, ip, true)
	}
}

// yamlEqual reports whether two YAML documents hold the same data.
func yamlEqual(t *testing.T, a, b string) bool {
	t.Helper()
	var x, y any
	if err := yaml.Unmarshal([]byte(a), &x); err != nil {
		t.Fatalf("%v in\n%s", err, a)
	}
	if err := yaml.Unmarshal([]byte(b), &y); err != nil {
		t.Fatalf("%v in\n%s", err, b)
	}
	return reflect.DeepEqual(x, y)
}
