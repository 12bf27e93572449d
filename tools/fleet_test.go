package tools

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/sluice-gw/sluice/runner/runnertest"
	"github.com/sluice-gw/sluice/testbed/dataplane"
	"github.com/sluice-gw/sluice/testbed/fleettest"
	"github.com/sluice-gw/sluice/testbed/loadgen"
	"github.com/sluice-gw/sluice/testbed/simulator"
	"github.com/sluice-gw/sluice/testbed/simulator/engine"
)

// The fleet behind the EPP: two servers of the base model with LoRA adapters. Clients ask for "chat", which a
// rewrite splits between the base model (stable) and "canary", which no server serves: every canary request fails
// (404), so the canary's guardrail trips.
const baseModel = "base"

var adapters = []string{"lora-a", "lora-b", "lora-c"}

// Every Sluice feature the dashboard and alerts cover: admission with a policy (bands, a tenant cap), objectives,
// Sluice's default profile (headroom and served-model filters, saturation, prefix-cache and LoRA-affinity scorers),
// and a canary rewrite with the guardrail.
const (
	objectivesYAML = `apiVersion: inference.networking.x-k8s.io/v1alpha2
kind: InferenceObjective
metadata: {name: critical}
spec: {priority: 10, poolRef: {name: static}}
---
apiVersion: inference.networking.x-k8s.io/v1alpha2
kind: InferenceObjective
metadata: {name: sheddable}
spec: {priority: -1, poolRef: {name: static}}
`
	policyYAML = `tenants:
- {name: batch, maxBand: Sheddable}
`
	rewritesYAML = `apiVersion: inference.networking.x-k8s.io/v1alpha2
kind: InferenceModelRewrite
metadata: {name: chat-canary}
spec:
  rules:
  - matches: [{model: {value: chat}}]
    targets:
    - {modelRewrite: base, weight: 70}
    - {modelRewrite: canary, weight: 30}
`
	// Twice what two A10G-like servers serve, in three priority classes, plus the canary's and the adapters'
	// traffic; capped batch requests ask for Critical and are served as Sheddable.
	mixYAML = `api: chat
stream: true
classes:
- {name: critical, model: base, weight: 15, objective: critical, tenant: interactive, prompt_tokens: 256, output_tokens: 32, shared_prefix: {groups: 4, tokens: 512}}
- {name: standard, model: base, weight: 30, tenant: apps, prompt_tokens: 256, output_tokens: 32, shared_prefix: {groups: 4, tokens: 512}}
- {name: sheddable, model: base, weight: 25, objective: sheddable, tenant: offline, prompt_tokens: 256, output_tokens: 32}
- {name: capped, model: base, weight: 5, objective: critical, tenant: batch, prompt_tokens: 256, output_tokens: 32}
- {name: canary, model: chat, weight: 15, tenant: apps, prompt_tokens: 128, output_tokens: 16}
- {name: adapters, model: base, lora: lora-a, weight: 10, tenant: apps, prompt_tokens: 128, output_tokens: 16}
`
	burstYAML = `api: chat
stream: true
classes:
- {name: standard, model: base, tenant: apps, prompt_tokens: 512, output_tokens: 32}
`
)

// exposition is what one scrape of /metrics exposed: for each sample name (a histogram's _bucket, _sum and _count
// each), the names of its labels and the values each took.
type exposition map[string]map[string]map[string]bool

// runEveryFeature runs the EPP binary in static mode with every feature on in front of simulated servers, drives
// overload through a data plane for a few seconds, and returns what /metrics then exposes.
func runEveryFeature(t *testing.T) exposition {
	t.Helper()
	dir := t.TempDir()
	files := map[string]string{"objectives.yaml": objectivesYAML, "policy.yaml": policyYAML, "rewrites.yaml": rewritesYAML}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	var endpoints []string
	for i := range 2 {
		endpoints = append(endpoints, startSimulator(t, fmt.Sprintf("127.0.20.%d", i+1), simulator.Options{Model: baseModel, Seed: uint64(i + 1)}))
	}
	epp := runnertest.StartEPP(t, nil,
		"--static-endpoints="+strings.Join(endpoints, ","), "--secure-serving=false",
		"--flow-control-config="+filepath.Join(dir, "policy.yaml"),
		"--inference-objectives-file="+filepath.Join(dir, "objectives.yaml"),
		"--model-rewrites-file="+filepath.Join(dir, "rewrites.yaml"),
		"--model-rewrite-guardrail", "--model-rewrite-guardrail-min-requests=3")
	url := fleettest.StartDataPlane(t, dataplane.Config{EPPAddress: fmt.Sprintf("127.0.0.1:%d", epp.GRPCPort)})

	// Overload with every class, then Standard alone, which the burst tier serves while no Critical arrives.
	for _, phase := range []struct {
		mix      string
		duration time.Duration
	}{{mixYAML, 6 * time.Second}, {burstYAML, 3 * time.Second}} {
		mix, err := loadgen.ParseMix([]byte(phase.mix))
		if err != nil {
			t.Fatal(err)
		}
		res, err := loadgen.Run(context.Background(), loadgen.RunConfig{
			Target: url, Mix: mix, Seed: 1, Mode: loadgen.ModeOpen,
			Arrival:        loadgen.ArrivalConfig{Kind: loadgen.ArrivalPoisson, Rate: 60},
			Duration:       phase.duration,
			RequestTimeout: 30 * time.Second,
		})
		if err != nil {
			t.Fatal(err)
		}
		var report strings.Builder
		if err := loadgen.WriteReport(&report, res.Summary); err != nil {
			t.Fatal(err)
		}
		t.Logf("load:\n%s", report.String())
	}
	// Upstream's pool gauges are set every --refresh-prometheus-metrics-interval (5s).
	var exp exposition
	runnertest.Eventually(t, "upstream's pool gauges are exposed", func() string {
		exp = scrape(t, fmt.Sprintf("http://127.0.0.1:%d/metrics", epp.MetricsPort))
		if exp["inference_pool_ready_pods"] == nil {
			return "no inference_pool_ready_pods yet"
		}
		return ""
	})
	return exp
}

// scrape parses one /metrics page into an exposition.
func scrape(t *testing.T, url string) exposition {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parsing %s: %v", url, err)
	}
	exp := exposition{}
	add := func(name string, labels []*dto.LabelPair, extra ...string) {
		if exp[name] == nil {
			exp[name] = map[string]map[string]bool{}
		}
		pairs := map[string]string{}
		for _, l := range labels {
			pairs[l.GetName()] = l.GetValue()
		}
		for i := 0; i+1 < len(extra); i += 2 {
			pairs[extra[i]] = extra[i+1]
		}
		for k, v := range pairs {
			if exp[name][k] == nil {
				exp[name][k] = map[string]bool{}
			}
			exp[name][k][v] = true
		}
	}
	for name, f := range families {
		for _, m := range f.Metric {
			switch f.GetType() {
			case dto.MetricType_HISTOGRAM:
				for _, b := range m.GetHistogram().GetBucket() {
					add(name+"_bucket", m.Label, "le", fmt.Sprint(b.GetUpperBound()))
				}
				add(name+"_bucket", m.Label, "le", "+Inf")
				add(name+"_sum", m.Label)
				add(name+"_count", m.Label)
			case dto.MetricType_SUMMARY:
				add(name+"_sum", m.Label)
				add(name+"_count", m.Label)
				add(name, m.Label)
			default:
				add(name, m.Label)
			}
		}
	}
	return exp
}

// startSimulator serves an A10G-like simulated server with the adapters registered on ip until the test ends.
func startSimulator(t *testing.T, ip string, opts simulator.Options) string {
	t.Helper()
	cfg, err := engine.Profile("a10g")
	if err != nil {
		t.Fatal(err)
	}
	opts.Engine = cfg
	for _, a := range adapters {
		opts.LoRAModules = append(opts.LoRAModules, simulator.LoRAModule{Name: a, Path: "/adapters/" + a})
	}
	return fleettest.StartSimulator(t, ip+":0", opts)
}
