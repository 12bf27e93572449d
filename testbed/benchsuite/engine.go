package benchsuite

import (
	"cmp"
	"context"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/sluice-gw/sluice/testbed/loadgen"
)

// Engine runs one scenario against one contender. RealTime runs real
// processes on loopback; a virtual-time engine implements the same method.
type Engine interface {
	Run(ctx context.Context, sc *Scenario, c Contender) (*RunResult, error)
}

// InterleavingEngine is an Engine that can also run several contenders in
// one load, the requests dealt among them in turns (Scenario.Interleave);
// it returns one result per contender, in order, or an error for all.
type InterleavingEngine interface {
	Engine
	RunInterleaved(ctx context.Context, sc *Scenario, cs []Contender) ([]*RunResult, error)
}

// RunResult is everything one run measured. It is what the report, the
// plots and the raw JSON are made of.
type RunResult struct {
	Scenario  string `json:"scenario"`
	Contender string `json:"contender"`
	// Describe is Contender.Describe of the contender that ran.
	Describe string `json:"describe"`
	// Engine names the engine ("real-time", "virtual").
	Engine  string        `json:"engine"`
	Started time.Time     `json:"started"`
	Wall    time.Duration `json:"wall_ns"`
	// Summary and Records come from the load generator: every attempt of
	// every request.
	Summary loadgen.Summary  `json:"summary"`
	Records []loadgen.Record `json:"records"`
	// Fleet are the model servers' counters at the end of the run (a fresh
	// fleet: they count this run only).
	Fleet FleetCounters `json:"fleet"`
	// Admission are Sluice admission's counters; nil when the contender
	// runs none.
	Admission *AdmissionCounters `json:"admission,omitempty"`
	// Samples are queue depths over the run.
	Samples []QueueSample `json:"samples"`
	// LogDir holds the processes' logs, "" when the engine keeps none.
	LogDir string `json:"log_dir,omitempty"`
	// Virtual is a virtual-time run's span, from the start of the load to
	// the last answer (the Summary's denominator); 0 in real time.
	Virtual time.Duration `json:"virtual_ns,omitempty"`
	// EPPPerDecision is a virtual-time run's EPP cost: the wall time of the
	// request path per routed request (admission, scheduling, hooks). Nil
	// without an EPP and in real time, where it is not separable.
	EPPPerDecision *time.Duration `json:"epp_per_decision_ns,omitempty"`
	// PeerBytes counts the peer summaries' bytes the EPP replicas sent one
	// another (virtual time, Contender.PeerExchange).
	PeerBytes int64 `json:"peer_bytes,omitempty"`
	// CPU is a real-time run's CPU use while the load ran, per process;
	// nil in virtual time and where it cannot be read.
	CPU *ProcessCPU `json:"cpu,omitempty"`
}

// ProcessCPU is the CPU time (user + system) each of a real-time run's
// processes used from the start of the load to its end: what routing costs
// on a machine the EPP shares with the fleet, the data plane and the load
// generator.
type ProcessCPU struct {
	// Fleet is the simulated servers' process.
	Fleet time.Duration `json:"fleet_ns"`
	// EPP is zero for a contender without one.
	EPP       time.Duration `json:"epp_ns,omitempty"`
	DataPlane time.Duration `json:"data_plane_ns"`
}

// FleetCounters sum a counter over the fleet's servers.
type FleetCounters struct {
	// PrefixHitTokens of PrefixQueryTokens prompt tokens were served from
	// the prefix cache (vllm:prefix_cache_hits_total / _queries_total).
	PrefixHitTokens   float64 `json:"prefix_hit_tokens"`
	PrefixQueryTokens float64 `json:"prefix_query_tokens"`
	// AdapterLoads counts LoRA adapter loads onto GPUs
	// (sluice_sim_lora_loads_total).
	AdapterLoads float64 `json:"adapter_loads"`
	// Preemptions counts requests preempted for lack of KV cache
	// (vllm:num_preemptions_total).
	Preemptions float64 `json:"preemptions"`
}

// PrefixHitRate is the fraction of prompt tokens served from the prefix
// cache; ok is false when no prompt token was looked up.
func (f FleetCounters) PrefixHitRate() (rate float64, ok bool) {
	if f.PrefixQueryTokens <= 0 {
		return 0, false
	}
	return f.PrefixHitTokens / f.PrefixQueryTokens, true
}

// AdmissionCounters are Sluice admission's decisions (sluice_flowcontrol_*).
type AdmissionCounters struct {
	// Dispatched and Shed count requests per band; ShedByReason per reason;
	// BurstDispatched, per band, the dispatched requests that went out in
	// the burst tier.
	Dispatched      map[string]float64 `json:"dispatched"`
	BurstDispatched map[string]float64 `json:"burst_dispatched"`
	Shed            map[string]float64 `json:"shed"`
	ShedByReason    map[string]float64 `json:"shed_by_reason"`
}

// QueueSample is the requests waiting at one instant of a run.
type QueueSample struct {
	// At is the time since the load started.
	At time.Duration `json:"at_ns"`
	// ServerWaiting and ServerRunning sum vllm:num_requests_waiting and
	// vllm:num_requests_running over the fleet.
	ServerWaiting float64 `json:"server_waiting"`
	ServerRunning float64 `json:"server_running"`
	// EPPQueued is the EPP's queue per band (Sluice admission) or per
	// priority (upstream flow control); nil without an EPP queue.
	EPPQueued map[string]float64 `json:"epp_queued,omitempty"`
	// EPPStaleEndpoints is how many endpoints Sluice admission found with
	// metrics too old to prove headroom (it sends them nothing); nil
	// without Sluice admission.
	EPPStaleEndpoints *float64 `json:"epp_stale_endpoints,omitempty"`
}

// EPPQueuedTotal sums the EPP's queues.
func (s QueueSample) EPPQueuedTotal() float64 {
	var n float64
	for _, v := range s.EPPQueued {
		n += v
	}
	return n
}

// ClassShed counts one class's requests the gateway turned away.
type ClassShed struct {
	Class string `json:"class"`
	// Requests counts logical requests; ShedAttempts their attempts answered
	// 429 or 503; ShedFinal the requests whose last attempt was (they were
	// never served); Failed the requests that failed otherwise.
	Requests     int `json:"requests"`
	ShedAttempts int `json:"shed_attempts"`
	ShedFinal    int `json:"shed_final"`
	Failed       int `json:"failed"`
}

// ShedByClass counts shed requests per class from attempt records, sorted
// by class.
func ShedByClass(records []loadgen.Record) []ClassShed {
	index := map[string]int{}
	var out []ClassShed
	for _, r := range records {
		i, ok := index[r.Class]
		if !ok {
			i = len(out)
			index[r.Class] = i
			out = append(out, ClassShed{Class: r.Class})
		}
		c := &out[i]
		shed := isShed(r)
		if shed {
			c.ShedAttempts++
		}
		if !r.Final {
			continue
		}
		c.Requests++
		switch {
		case shed:
			c.ShedFinal++
		case !r.OK():
			c.Failed++
		}
	}
	slices.SortFunc(out, func(a, b ClassShed) int { return strings.Compare(a.Class, b.Class) })
	return out
}

// PromptOverlap is the share of successful streamed attempts that reached their endpoint while an earlier attempt
// there had not had its first token yet, as the client saw them (sent before, first token after this one was sent):
// prompts that shared their first steps with another. Round-robin on a uniform fleet shows the share that arrivals
// alone cause; a router above it is putting prompts on endpoints that are computing one. Client-side windows include
// the route to the endpoint and back, so in real time every EPP contender's share is inflated by its own hop's
// latency: compare EPP contenders with one another (a scenario's EPP round-robin control prices the hop), and with
// round-robin in virtual time, where routing takes no time. ok is false without such attempts or without the
// endpoint that served them.
func PromptOverlap(records []loadgen.Record) (share float64, ok bool) {
	type window struct{ start, firstToken time.Duration }
	byEndpoint := map[string][]window{}
	n := 0
	for _, r := range records {
		if !r.Stream || !r.OK() || r.TTFT <= 0 || r.Endpoint == "" {
			continue
		}
		byEndpoint[r.Endpoint] = append(byEndpoint[r.Endpoint], window{r.Start, r.Start + r.TTFT})
		n++
	}
	if n == 0 {
		return 0, false
	}
	overlapped := 0
	for _, ws := range byEndpoint {
		slices.SortFunc(ws, func(a, b window) int { return cmp.Compare(a.start, b.start) })
		// latest is the latest first token among the attempts sent before the current one.
		latest := time.Duration(math.MinInt64)
		for _, w := range ws {
			if latest > w.start {
				overlapped++
			}
			latest = max(latest, w.firstToken)
		}
	}
	return float64(overlapped) / float64(n), true
}
