package virtualbench

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/flowcontrol"
	"github.com/sluice-gw/sluice/testbed/loadgen"
)

func mustMix(t testing.TB, text string) *loadgen.Mix {
	t.Helper()
	m, err := loadgen.ParseMix([]byte(text))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// busyMix exercises every path: priorities, tenants, shared prefixes, multi-turn chats, both APIs, streaming and
// not, requests without max_tokens' bound (output_tokens 0 is not allowed, so lengths vary instead).
const busyMix = `
api: chat
stream: true
classes:
  - {name: critical, model: meta-llama/Llama-3.1-8B-Instruct, weight: 2, objective: critical, tenant: a, prompt_tokens: {min: 100, max: 400}, output_tokens: {min: 16, max: 96}}
  - {name: grouped, model: meta-llama/Llama-3.1-8B-Instruct, weight: 4, tenant: b, prompt_tokens: 150, output_tokens: 48, shared_prefix: {groups: 6, tokens: 600, zipf_s: 1.1}}
  - {name: chat, model: meta-llama/Llama-3.1-8B-Instruct, weight: 2, tenant: b, prompt_tokens: 120, output_tokens: 32, multi_turn: {turns: 3, concurrent: 4}}
  - {name: batch, model: meta-llama/Llama-3.1-8B-Instruct, weight: 3, objective: sheddable, tenant: c, api: completions, stream: false, prompt_tokens: 300, output_tokens: 64}
`

var objectives = map[string]int{"critical": 10, "standard": 0, "sheddable": -1}

func busyConfig(t testing.TB, router Router) Config {
	return Config{
		Fleet: "h100:1,a10g:2", Mix: mustMix(t, busyMix), Seed: 7, Objectives: objectives, Router: router,
		Arrival:  loadgen.ArrivalConfig{Kind: loadgen.ArrivalPoisson, Rate: 40},
		Duration: 4 * time.Second,
		Retry:    loadgen.RetryPolicy{MaxAttempts: 3, MaxWait: 2 * time.Second},
	}
}

func allRouters() map[string]Router {
	return map[string]Router{"round-robin": RoundRobinRouter(), "upstream": UpstreamRouter(), "sluice": SluiceRouter(nil, nil)}
}

func TestRunIsDeterministic(t *testing.T) {
	for name, router := range allRouters() {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			encode := func() []byte {
				res, err := Run(busyConfig(t, router))
				if err != nil {
					t.Fatal(err)
				}
				// Two empty runs are equal too: make sure this one measured something.
				if s := res.Summary.Overall; len(res.Records) == 0 || s.Succeeded == 0 || len(res.Samples) == 0 {
					t.Fatalf("the run produced %d records (%d requests served) and %d samples: nothing to compare",
						len(res.Records), s.Succeeded, len(res.Samples))
				}
				out, err := json.Marshal(struct {
					Records []loadgen.Record
					Samples []Sample
					Fleet   FleetStats
				}{res.Records, res.Samples, res.Fleet})
				if err != nil {
					t.Fatal(err)
				}
				return out
			}
			a, b := encode(), encode()
			if !bytes.Equal(a, b) {
				t.Fatal("two runs of the same config produced different records")
			}
		})
	}
}

// checkNothingLost checks loadgen's record invariants: every issued request (Seq 0..n-1, in open loop the
// generator numbers every arrival) has attempts 1..k, exactly the last of them Final.
func checkNothingLost(t *testing.T, records []loadgen.Record) (requests int) {
	t.Helper()
	attempts := map[int][]loadgen.Record{}
	maxSeq := -1
	for _, r := range records {
		attempts[r.Seq] = append(attempts[r.Seq], r)
		maxSeq = max(maxSeq, r.Seq)
	}
	for seq := 0; seq <= maxSeq; seq++ {
		rs := attempts[seq]
		if len(rs) == 0 {
			t.Fatalf("request %d has no record", seq)
		}
		finals := 0
		for i, r := range rs {
			if r.Attempt != i+1 {
				t.Fatalf("request %d: record %d is attempt %d", seq, i, r.Attempt)
			}
			if r.Final {
				finals++
				if i != len(rs)-1 {
					t.Fatalf("request %d: attempt %d is final but not the last", seq, r.Attempt)
				}
			}
			if !r.OK() && r.Error == "" {
				t.Fatalf("request %d attempt %d: status %d without an error", seq, r.Attempt, r.Status)
			}
		}
		if finals != 1 {
			t.Fatalf("request %d has %d final records, want exactly 1", seq, finals)
		}
	}
	return maxSeq + 1
}

func TestNothingIsLost(t *testing.T) {
	for name, router := range allRouters() {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			cfg := busyConfig(t, router)
			cfg.Arrival.Rate = 120 // overload: queues, sheds, retries
			cfg.RequestTimeout = 4 * time.Second
			cfg.Drain = 2 * time.Second
			cfg.MaxInFlight = 300
			res, err := Run(cfg)
			if err != nil {
				t.Fatal(err)
			}
			n := checkNothingLost(t, res.Records)
			s := res.Summary.Overall
			if s.Requests != n || s.Succeeded+s.Failed != n {
				t.Fatalf("summary counts %d requests (%d ok, %d failed), records hold %d", s.Requests, s.Succeeded, s.Failed, n)
			}
			reasons := map[string]int{}
			for _, r := range res.Records {
				if r.Final && !r.OK() {
					reasons[strings.SplitN(r.Error, ":", 2)[0]]++
				}
			}
			t.Logf("%d requests, %d ok, failures %v", n, s.Succeeded, reasons)
			if s.Succeeded == 0 || s.Failed == 0 {
				t.Fatalf("an overloaded run with short timeouts should both serve and fail requests: %v", reasons)
			}
		})
	}
}

func TestClosedLoopAndMaxRequests(t *testing.T) {
	cfg := busyConfig(t, SluiceRouter(nil, nil))
	cfg.Mode, cfg.Users, cfg.Duration, cfg.MaxRequests = loadgen.ModeClosed, 5, 0, 60
	res, err := Run(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if n := checkNothingLost(t, res.Records); n != 60 {
		t.Fatalf("%d requests, want MaxRequests = 60", n)
	}
	for _, smp := range res.Samples {
		if smp.InFlight > 5 {
			t.Fatalf("%d requests in flight with 5 closed-loop users", smp.InFlight)
		}
	}
}

func TestRecordsMatchTheLoadGenerator(t *testing.T) {
	cfg := busyConfig(t, RoundRobinRouter())
	res, err := Run(cfg)
	if err != nil {
		t.Fatal(err)
	}
	gen := loadgen.NewGenerator(cfg.Mix, cfg.Seed)
	arr, _ := loadgen.NewArrivals(cfg.Arrival, cfg.Seed)
	bySeq := map[int]loadgen.Record{}
	for _, r := range res.Records {
		if r.Attempt == 1 {
			bySeq[r.Seq] = r
		}
	}
	for seq := range len(bySeq) {
		spec, at := gen.Next(), arr.Next()
		r := bySeq[seq]
		if r.Class != spec.Class || r.PromptTokens != spec.PromptTokens || r.MaxTokens != spec.MaxTokens ||
			r.Scheduled != at || r.Start != at {
			t.Fatalf("request %d: record %+v does not match the generator's %s at %v", seq, r, spec.Class, at)
		}
		if r.OK() && (r.OutputTokens != spec.MaxTokens || r.TTFT <= 0 || r.E2E < r.TTFT ||
			(spec.Stream && len(r.ITL) != spec.MaxTokens-1)) {
			t.Fatalf("request %d: ok record %+v inconsistent with max_tokens %d", seq, r, spec.MaxTokens)
		}
	}
}

func TestConfigErrors(t *testing.T) {
	mix := mustMix(t, busyMix)
	for _, tc := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"no fleet", Config{Mix: mix, Duration: time.Second, Arrival: loadgen.ArrivalConfig{Kind: "poisson", Rate: 1}, Router: RoundRobinRouter()}, "fleet is required"},
		{"bad fleet", Config{Fleet: "tpu:1", Mix: mix, Duration: time.Second, Arrival: loadgen.ArrivalConfig{Kind: "poisson", Rate: 1}, Router: RoundRobinRouter()}, "unknown hardware profile"},
		{"no end", Config{Fleet: "h100:1", Mix: mix, Arrival: loadgen.ArrivalConfig{Kind: "poisson", Rate: 1}, Router: RoundRobinRouter()}, "must end by itself"},
		{"no router", Config{Fleet: "h100:1", Mix: mix, Duration: time.Second, Arrival: loadgen.ArrivalConfig{Kind: "poisson", Rate: 1}}, "router kind"},
		{"rr with policy", Config{Fleet: "h100:1", Mix: mix, Duration: time.Second, Arrival: loadgen.ArrivalConfig{Kind: "poisson", Rate: 1},
			Router: Router{Kind: RoundRobin, Admission: flowcontrol.DefaultConfig()}}, "round-robin takes no"},
		{"bad picker config", Config{Fleet: "h100:1", Mix: mix, Duration: time.Second, Arrival: loadgen.ArrivalConfig{Kind: "poisson", Rate: 1},
			Router: Router{Kind: EPP, EndpointPickerConfig: []byte("plugins: [{type: no-such-plugin}]")}}, "no-such-plugin"},
		{"unregistered preload", Config{Fleet: "h100:1", Mix: mix, Duration: time.Second, Arrival: loadgen.ArrivalConfig{Kind: "poisson", Rate: 1},
			Router: RoundRobinRouter(), PreloadLoRAs: []string{"x"}}, "not a registered"},
	} {
		_, err := Run(tc.cfg)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want %q", tc.name, err, tc.want)
		}
	}
}

// The scenario EndpointPickerConfigs of the benchmark suite (testbed/bench/scenarios), inline so the test does not depend
// on where the suite keeps its files.
const (
	upstreamLoRAConfig = `apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: lora-affinity-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - {pluginRef: queue-scorer, weight: 2}
  - {pluginRef: kv-cache-utilization-scorer, weight: 2}
  - {pluginRef: lora-affinity-scorer, weight: 2}
  - pluginRef: max-score-picker
`
	sluiceLoRAConfig = `apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: sluice-lora-affinity-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - {pluginRef: queue-scorer, weight: 2}
  - {pluginRef: kv-cache-utilization-scorer, weight: 2}
  - {pluginRef: sluice-lora-affinity-scorer, weight: 2}
  - pluginRef: max-score-picker
`
	sluicePrefixConfig = `apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: sluice-prefix-cache-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - {pluginRef: queue-scorer, weight: 2}
  - {pluginRef: kv-cache-utilization-scorer, weight: 2}
  - {pluginRef: sluice-prefix-cache-scorer, weight: 3}
  - pluginRef: max-score-picker
`
	loraMix = `
api: chat
stream: true
classes:
  - {name: base, model: meta-llama/Llama-3.1-8B-Instruct, weight: 3, prompt_tokens: 256, output_tokens: 32}
  - {name: a0, model: meta-llama/Llama-3.1-8B-Instruct, lora: adapter-00, weight: 4, prompt_tokens: 256, output_tokens: 32}
  - {name: a1, model: meta-llama/Llama-3.1-8B-Instruct, lora: adapter-01, weight: 2, prompt_tokens: 256, output_tokens: 32}
  - {name: a2, model: meta-llama/Llama-3.1-8B-Instruct, lora: adapter-02, weight: 1, prompt_tokens: 256, output_tokens: 32}
  - {name: a3, model: meta-llama/Llama-3.1-8B-Instruct, lora: adapter-03, weight: 1, prompt_tokens: 256, output_tokens: 32}
  - {name: a4, model: meta-llama/Llama-3.1-8B-Instruct, lora: adapter-04, weight: 1, prompt_tokens: 256, output_tokens: 32}
`
	prefixMix = `
api: chat
stream: true
classes:
  - {name: grouped, model: meta-llama/Llama-3.1-8B-Instruct, weight: 8, prompt_tokens: 200, output_tokens: 64, shared_prefix: {groups: 16, tokens: 2048, zipf_s: 1.1}}
  - {name: multi-turn, model: meta-llama/Llama-3.1-8B-Instruct, weight: 2, prompt_tokens: 200, output_tokens: 64, multi_turn: {turns: 4, concurrent: 8}}
`
)

// TestScenarioConfigsLoad runs the LoRA and shared-prefix scenario configurations in process on small loads: they
// load, route, and the fleet shows the adapter loads and prefix hits they are about.
func TestScenarioConfigsLoad(t *testing.T) {
	adapters := []string{"adapter-00", "adapter-01", "adapter-02", "adapter-03", "adapter-04"}
	for _, tc := range []struct {
		name, mix, config string
		loras             []string
		check             func(*Result) error
	}{
		{"upstream lora", loraMix, upstreamLoRAConfig, adapters, loadsAdapters},
		{"sluice lora", loraMix, sluiceLoRAConfig, adapters, loadsAdapters},
		{"sluice shared prefix", prefixMix, sluicePrefixConfig, nil, hitsPrefixes},
		{"upstream shared prefix", prefixMix, "", nil, hitsPrefixes},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			res, err := Run(Config{Fleet: "h100:3", LoRAModules: tc.loras, Mix: mustMix(t, tc.mix), Seed: 3,
				Router:  Router{Kind: EPP, EndpointPickerConfig: []byte(tc.config)},
				Arrival: loadgen.ArrivalConfig{Kind: loadgen.ArrivalPoisson, Rate: 20}, Duration: 4 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			checkNothingLost(t, res.Records)
			if s := res.Summary.Overall; s.Failed != 0 {
				t.Fatalf("%d of %d requests failed: %v", s.Failed, s.Requests, s.Status)
			}
			if err := tc.check(res); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func loadsAdapters(res *Result) error {
	if res.Fleet.AdapterLoads == 0 {
		return errors.New("no adapter was ever loaded")
	}
	return nil
}

func hitsPrefixes(res *Result) error {
	if rate := res.Fleet.PrefixHitRate(); rate < 0.3 {
		return fmt.Errorf("prefix-cache hit rate %.3f with 2k-token shared prefixes", rate)
	}
	return nil
}

// TestAdmissionTimersRunInVirtualTime: a request that waits in Sluice admission past its band's maximum queue time
// is answered exactly then, by the controller's timer on the virtual clock.
func TestAdmissionTimersRunInVirtualTime(t *testing.T) {
	policy, err := flowcontrol.ParseConfig([]byte(`{"endpoint":{"queueDepthThreshold":1,"runningThreshold":2},
		"bands":{"standard":{"maxQueueTime":"1500ms"}}}`))
	if err != nil {
		t.Fatal(err)
	}
	res, err := Run(Config{Fleet: "a10g:1", Mix: mustMix(t, busyMix), Seed: 5, Objectives: objectives,
		Router: SluiceRouter(policy, nil), Arrival: loadgen.ArrivalConfig{Kind: loadgen.ArrivalPoisson, Rate: 30},
		Duration: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	checkNothingLost(t, res.Records)
	timeouts := 0
	for _, r := range res.Records {
		if strings.Contains(r.Error, "queue_timeout") {
			timeouts++
			if r.Class == "critical" || r.E2E != 1500*time.Millisecond {
				t.Fatalf("%s request %d timed out after %v in the queue, want Standard after exactly 1.5s", r.Class, r.Seq, r.E2E)
			}
		}
	}
	if timeouts == 0 {
		t.Fatal("no request reached its maximum queue time; the scenario no longer tests the timer")
	}
}
