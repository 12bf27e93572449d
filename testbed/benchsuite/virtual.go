package benchsuite

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/sluice-gw/sluice/flowcontrol"
	"github.com/sluice-gw/sluice/runner"
	"github.com/sluice-gw/sluice/testbed/virtualbench"
)

// VirtualEngineName is RunResult.Engine of virtual-time runs.
const VirtualEngineName = "virtual"

// Virtual runs a scenario in virtual time (package virtualbench): the same
// fleet model, load, EPP plugins and admission as RealTime, in one process
// against a virtual clock, with no network, proxy or CPU contention. A run
// is deterministic: the same scenario and contender give the same records.
//
// What maps onto virtualbench.Config: the fleet (servers seeded 1, 2, ... as
// RealTime starts vllm-sim --seed=1), the adapters (--lora-modules), mix,
// arrival, duration, drain, seed, retry policy, SLO, the InferenceObjectives
// file (as name -> priority) and the contender's router, EndpointPickerConfig,
// flow-control policy and EPP replicas. A contender virtualbench cannot run is skipped
// (SkippedError), see Unsupported.
type Virtual struct {
	// SampleEvery is the queue-depth sampling period in virtual time
	// (DefaultSampleEvery when zero, as RealTime).
	SampleEvery time.Duration
}

var _ Engine = (*Virtual)(nil)

// SkippedError is an Engine's answer for a contender it cannot run. The
// suite records the reason and goes on: a skipped run is not a failure.
type SkippedError struct {
	Reason string
}

func (e *SkippedError) Error() string { return "skipped: " + e.Reason }

// Feature gates of an EndpointPickerConfig the virtual engine's in-process EPP
// refuses (upstream's flowcontrol.FeatureGate and
// datalayer.EnableLegacyMetricsFeatureGate).
const (
	upstreamFlowControlGate   = "flowControl"
	upstreamLegacyMetricsGate = "enableLegacyMetrics"
)

// Unsupported says why the virtual engine cannot run c ("" when it can).
// Upstream's experimental flow control runs its own dispatch loop on
// goroutines and wall-clock timers, and the legacy metrics path scrapes on
// its own: neither can run against a virtual clock. Under Sluice admission
// the flowControl gate is harmless (Sluice admission replaces upstream's).
func Unsupported(c Contender) string {
	if c.Router != RouterEPP || len(c.EndpointPickerConfig) == 0 {
		return ""
	}
	var gates struct {
		FeatureGates []string `json:"featureGates"`
	}
	if err := yaml.Unmarshal(c.EndpointPickerConfig, &gates); err != nil {
		return "" // the run reports the parse error
	}
	switch {
	case slices.Contains(gates.FeatureGates, upstreamFlowControlGate) && !c.SluiceAdmission:
		return fmt.Sprintf("upstream's experimental flow control (feature gate %s) runs on goroutines and wall-clock "+
			"timers and cannot run in virtual time; run it with --engine=%s", upstreamFlowControlGate, RealTimeEngineName)
	case slices.Contains(gates.FeatureGates, upstreamLegacyMetricsGate):
		return fmt.Sprintf("the legacy metrics path (feature gate %s) scrapes on its own goroutines and cannot run in "+
			"virtual time; run it with --engine=%s", upstreamLegacyMetricsGate, RealTimeEngineName)
	}
	return ""
}

// Run implements Engine. It checks ctx before it starts; a virtual run is
// not interruptible once started (the longest scenario takes seconds).
func (e *Virtual) Run(ctx context.Context, sc *Scenario, c Contender) (*RunResult, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if why := Unsupported(c); why != "" {
		return nil, &SkippedError{Reason: why}
	}
	cfg, err := VirtualConfig(sc, c)
	if err != nil {
		return nil, fmt.Errorf("%s/%s: %w", sc.Name, c.Name, err)
	}
	cfg.SampleInterval = e.SampleEvery
	if cfg.SampleInterval <= 0 {
		cfg.SampleInterval = DefaultSampleEvery
	}
	started := time.Now()
	res, err := virtualbench.Run(cfg)
	if err != nil {
		return nil, fmt.Errorf("%s/%s: %w", sc.Name, c.Name, err)
	}
	return virtualResult(sc, c, started, res), nil
}

// VirtualConfig maps a scenario and a contender onto a virtual run.
func VirtualConfig(sc *Scenario, c Contender) (virtualbench.Config, error) {
	var errs []error
	objectives, err := ParseObjectivePriorities(sc.Objectives)
	if err != nil {
		errs = append(errs, fmt.Errorf("objectives %s: %w", sc.ObjectivesSource, err))
	}
	router, err := virtualRouter(c)
	if err != nil {
		errs = append(errs, err)
	}
	mix, arrival := sc.Load(c)
	cfg := virtualbench.Config{
		Fleet:        sc.Fleet,
		Model:        sc.Model,
		LoRAModules:  sc.Adapters,
		ServerSeed:   1, // RealTime starts vllm-sim --seed=1
		OutputLength: sc.OutputLength,
		Mix:          mix,
		Arrival:      arrival,
		Duration:     sc.Duration,
		Drain:        sc.Drain,
		Seed:         sc.Seed,
		Retry:        sc.Retry,
		SLO:          sc.SLO,
		Objectives:   objectives,
		Router:       router,
	}
	return cfg, errors.Join(errs...)
}

// virtualRouter maps a contender onto virtualbench's routers.
func virtualRouter(c Contender) (virtualbench.Router, error) {
	switch c.Router {
	case RouterRoundRobin:
		return virtualbench.RoundRobinRouter(), nil
	case RouterEPP:
	default:
		return virtualbench.Router{}, fmt.Errorf("contender %s: unknown router %q", c.Name, c.Router)
	}
	router := virtualbench.Router{Kind: virtualbench.EPP, EndpointPickerConfig: c.EndpointPickerConfig}
	if c.SluiceAdmission {
		policy, err := ParseFlowControlPolicy(c.FlowControlPolicy)
		if err != nil {
			return virtualbench.Router{}, fmt.Errorf("contender %s: flow control policy %s: %w", c.Name, c.FlowControlPolicySource, err)
		}
		router = virtualbench.SluiceRouter(policy, c.EndpointPickerConfig)
	}
	router.Replicas, router.Balance, router.Ownership = c.Replicas, virtualbench.Balance(c.Balance), c.EndpointOwnership
	router.PeerExchange = c.PeerExchange
	return router, nil
}

// ParseFlowControlPolicy parses a --flow-control-config file's content
// (YAML or JSON) as the EPP does; empty content is Sluice's default policy.
func ParseFlowControlPolicy(data []byte) (*flowcontrol.Config, error) {
	js, err := yaml.YAMLToJSON(data)
	if err != nil {
		return nil, err
	}
	if string(js) == "null" {
		js = nil
	}
	return flowcontrol.ParseConfig(js)
}

// ParseObjectivePriorities reads an InferenceObjectives file's content
// (runner.ParseObjectives, what --inference-objectives-file loads) as
// name -> priority; an objective without a priority has 0, as in
// upstream's Director. Empty content gives nil.
func ParseObjectivePriorities(data []byte) (map[string]int, error) {
	if len(data) == 0 {
		return nil, nil
	}
	objs, err := runner.ParseObjectives(data)
	if err != nil {
		return nil, err
	}
	out := make(map[string]int, len(objs))
	for _, o := range objs {
		p := 0
		if o.Spec.Priority != nil {
			p = *o.Spec.Priority
		}
		out[o.Name] = p
	}
	return out, nil
}

// virtualResult fills the suite's RunResult from a virtual run.
func virtualResult(sc *Scenario, c Contender, started time.Time, res *virtualbench.Result) *RunResult {
	out := &RunResult{
		Scenario: sc.Name, Contender: c.Name, Describe: c.Describe(), Engine: VirtualEngineName,
		Started: started, Wall: res.Wall, Summary: res.Summary, Records: res.Records,
		Fleet: FleetCounters{
			PrefixHitTokens:   float64(res.Fleet.PrefixHitTokens),
			PrefixQueryTokens: float64(res.Fleet.PrefixQueryTokens),
			AdapterLoads:      float64(res.Fleet.AdapterLoads),
			Preemptions:       float64(res.Fleet.Preemptions),
		},
		Virtual:   res.Virtual,
		PeerBytes: res.PeerBytes,
	}
	if c.Router == RouterEPP {
		cost := res.EPP.PerRequest()
		out.EPPPerDecision = &cost
	}
	bands := flowcontrol.AllBands()
	for _, s := range res.Samples {
		q := QueueSample{At: s.At, ServerWaiting: float64(s.Waiting), ServerRunning: float64(s.Running)}
		if c.SluiceAdmission {
			// As RealTime reads sluice_flowcontrol_queue_length per band.
			q.EPPQueued = make(map[string]float64, len(bands))
			for _, b := range bands {
				q.EPPQueued[b.String()] = float64(s.Queued[b])
			}
		}
		out.Samples = append(out.Samples, q)
	}
	return out
}
