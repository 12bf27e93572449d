package virtualbench

import (
	"time"

	"github.com/sluice-gw/sluice/flowcontrol"
	"github.com/sluice-gw/sluice/testbed/loadgen"
)

// Result is the outcome of a run.
type Result struct {
	// Records has one record per attempt, in the order the client finished them, exactly as loadgen.Run produces
	// them: every request's last attempt is Final. Times are virtual, from the start of the run.
	Records []loadgen.Record
	// Summary is loadgen.Summarize over Records, with the virtual duration of the run as denominator.
	Summary loadgen.Summary
	// Samples are taken every SampleInterval of virtual time.
	Samples []Sample
	// Fleet totals the servers' counters at the end of the run.
	Fleet FleetStats
	// EPP is what the endpoint picker cost, in wall and CPU time (zero for round-robin). Not deterministic.
	EPP EPPCost
	// ReplicaRequests counts the attempts (ext_proc streams) each EPP replica received; nil without an EPP.
	ReplicaRequests []int
	// PeerBytes counts the bytes of peer summaries the replicas sent one another (Router.PeerExchange).
	PeerBytes int64
	// Virtual is the virtual time from the start to the last answer.
	Virtual time.Duration
	// Wall is how long the run took; Events counts the discrete events it processed.
	Wall   time.Duration
	Events uint64
}

// Sample is the state of the system at one instant, plus what happened since the previous sample.
type Sample struct {
	// At is the sample's virtual time from the start.
	At time.Duration `json:"at_ns"`
	// Queued counts requests waiting in Sluice admission per band (Critical, Standard, Sheddable).
	Queued [flowcontrol.NumBands]int `json:"queued"`
	// Waiting and Running sum the servers' vllm:num_requests_waiting and running; MaxWaiting is the largest queue.
	Waiting    int `json:"waiting"`
	Running    int `json:"running"`
	MaxWaiting int `json:"max_waiting"`
	// InFlight counts client requests not yet answered for good (retries included).
	InFlight int `json:"in_flight"`
	// Dispatched counts attempts sent to a server since the previous sample, Completed attempts a server finished,
	// Shed attempts the gateway answered itself (429, 503 and other errors).
	Dispatched int `json:"dispatched"`
	Completed  int `json:"completed"`
	Shed       int `json:"shed"`
	// ServerWaiting and ServerRunning are per server (Config.ServerSeries).
	ServerWaiting []int `json:"server_waiting,omitempty"`
	ServerRunning []int `json:"server_running,omitempty"`
}

// FleetStats are the fleet's counters at the end of a run.
type FleetStats struct {
	// PrefixQueryTokens and PrefixHitTokens sum vllm:prefix_cache_queries_total and hits_total.
	PrefixQueryTokens uint64 `json:"prefix_query_tokens"`
	PrefixHitTokens   uint64 `json:"prefix_hit_tokens"`
	// AdapterLoads sums LoRA loads requests caused; Preemptions sums recompute preemptions.
	AdapterLoads uint64 `json:"adapter_loads"`
	Preemptions  uint64 `json:"preemptions"`
	// Dispatched counts the attempts each server received.
	Dispatched []uint64 `json:"dispatched"`
}

// PrefixHitRate is hits over queries, 0 without queries.
func (f FleetStats) PrefixHitRate() float64 {
	if f.PrefixQueryTokens == 0 {
		return 0
	}
	return float64(f.PrefixHitTokens) / float64(f.PrefixQueryTokens)
}

// EPPCost is the time spent in the endpoint picker.
type EPPCost struct {
	// Requests counts requests routed (Route calls); Routing is the wall time of the request path: Route,
	// admission snapshots and continuations, and the response hooks. RoutingCPU is the process's CPU time over the
	// same calls (user + system, garbage collection included): on a machine shared with other work, wall time also
	// counts the time the run waited for a CPU, CPU time does not.
	Requests   int           `json:"requests"`
	Routing    time.Duration `json:"routing_ns"`
	RoutingCPU time.Duration `json:"routing_cpu_ns"`
	// HookWait is the wall time spent, after calls into plugin code, waiting for the goroutines they started to end
	// (upstream's approximate prefix producer updates its index from one): a real EPP runs them beside the request
	// path, so it is not part of Routing.
	HookWait time.Duration `json:"hook_wait_ns"`
	// Scrapes counts endpoint scrapes and Scraping their extraction (not the servers' /metrics rendering).
	Scrapes  int           `json:"scrapes"`
	Scraping time.Duration `json:"scraping_ns"`
}

// PerRequest is the routing wall time per routed request.
func (c EPPCost) PerRequest() time.Duration {
	if c.Requests == 0 {
		return 0
	}
	return c.Routing / time.Duration(c.Requests)
}

// CPUPerRequest is the routing CPU time per routed request.
func (c EPPCost) CPUPerRequest() time.Duration {
	if c.Requests == 0 {
		return 0
	}
	return c.RoutingCPU / time.Duration(c.Requests)
}
