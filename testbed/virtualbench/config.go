package virtualbench

import (
	"errors"
	"fmt"
	"time"

	"github.com/sluice-gw/sluice/flowcontrol"
	"github.com/sluice-gw/sluice/plugins"
	"github.com/sluice-gw/sluice/testbed/loadgen"
	"github.com/sluice-gw/sluice/testbed/simulator"
	"github.com/sluice-gw/sluice/testbed/simulator/engine"
)

// Defaults of Config.
const (
	// DefaultModel is the served base model, as in testbed/bench/lib.sh.
	DefaultModel = "meta-llama/Llama-3.1-8B-Instruct"
	// DefaultScrapeInterval is upstream's --refresh-metrics-interval default, also Sluice admission's snapshot
	// interval.
	DefaultScrapeInterval = 50 * time.Millisecond
	// DefaultSampleInterval is the period of Result.Samples.
	DefaultSampleInterval = time.Second
	// DefaultMaxTokensWhenUnset bounds the output of requests without max_tokens (vllm-sim --default-max-tokens).
	DefaultMaxTokensWhenUnset = 128
	// BasePort is the port of server 0; server i is 127.0.0.1:BasePort+i, as testbed/bench/lib.sh starts the fleet.
	BasePort = 28001
)

// RouterKind names what sits between the clients and the fleet.
type RouterKind string

const (
	// RoundRobin is the data plane alone, rotating over the fleet (dataplane --round-robin).
	RoundRobin RouterKind = "round-robin"
	// EPP is the data plane asking an endpoint picker: Sluice's request path in process (inProcessEPP).
	EPP RouterKind = "epp"
)

// Router is the contender under test.
type Router struct {
	Kind RouterKind
	// EndpointPickerConfig is the EPP's EndpointPickerConfig (YAML or JSON). Empty means what the EPP runs without
	// --config-file: upstream's default, or plugins.DefaultEndpointPickerConfig with Admission.
	EndpointPickerConfig []byte
	// Admission turns Sluice admission on with this policy; nil means upstream's admission.
	Admission *flowcontrol.Config
	// AdmissionOptions adjust the admission adapter (DefaultOutputTokens); the snapshot interval is ScrapeInterval.
	AdmissionOptions plugins.FlowControlOptions
	// Replicas runs this many EPP replicas (EPP only; default 1), each a whole EPP of its own that scrapes every
	// server, and the data plane spreads requests over them by Balance (default BalanceRoundRobin).
	Replicas int
	Balance  Balance
	// Ownership runs the replicas as the EPP's --peers does: each scrapes every server, and its admission takes and
	// routes to only the servers it owns (replication.View over replica names epp-0, ..., every replica hearing
	// every other), so it sees every request sent to them.
	Ownership bool
	// PeerExchange, with Ownership, runs the EPP's peer exchange too: every replication.DefaultExchangeInterval each
	// replica sends every other its summary (plugins.FlowControl.PeerSummary), which arrives PeerDelay later
	// (HearPeer); Result.PeerBytes counts the bytes sent.
	PeerExchange bool
}

// PeerDelay is how long a peer summary takes from one replica to another in virtual time: a message between two
// pods of one cluster, plus the sender's and receiver's handling.
const PeerDelay = time.Millisecond

// RoundRobinRouter is the round-robin contender.
func RoundRobinRouter() Router { return Router{Kind: RoundRobin} }

// UpstreamRouter is upstream v1.5.0's EPP with its default configuration (no --config-file): queue, KV-cache and
// prefix-cache scorers, the max-score picker, the approximate prefix producer, and legacy admission.
func UpstreamRouter() Router { return Router{Kind: EPP} }

// SluiceRouter is the Sluice EPP: Sluice admission with policy (nil: flowcontrol.DefaultConfig()) and the given
// EndpointPickerConfig (empty: plugins.DefaultEndpointPickerConfig()).
func SluiceRouter(policy *flowcontrol.Config, endpointPickerConfig []byte) Router {
	if policy == nil {
		policy = flowcontrol.DefaultConfig()
	}
	return Router{Kind: EPP, EndpointPickerConfig: endpointPickerConfig, Admission: policy}
}

// maxReplicas bounds Router.Replicas: each replica is a whole EPP.
const maxReplicas = 64

// withDefaults validates the replica settings and defaults them, appending problems to errs.
func (rt Router) withDefaults(errs []error) (Router, []error) {
	if err := rt.Balance.Validate(); err != nil {
		errs = append(errs, err)
	}
	switch {
	case rt.Replicas < 0 || rt.Replicas > maxReplicas:
		errs = append(errs, fmt.Errorf("replicas must be 1..%d, got %d", maxReplicas, rt.Replicas))
	case rt.Replicas > 1 && rt.Kind != EPP:
		errs = append(errs, fmt.Errorf("replicas apply to the EPP router, not %q", rt.Kind))
	case rt.Ownership && rt.Replicas < 2:
		errs = append(errs, errors.New("endpoint ownership needs at least 2 replicas"))
	case rt.PeerExchange && !rt.Ownership:
		errs = append(errs, errors.New("the peer exchange runs with endpoint ownership"))
	case rt.Replicas == 0:
		rt.Replicas = 1
	}
	if rt.Balance == "" {
		rt.Balance = BalanceRoundRobin
	}
	return rt, errs
}

// Config describes one virtual-time run: a fleet, a load, a contender. Everything is plain data; nothing names a
// file. Zero values take the defaults documented per field.
type Config struct {
	// Servers sizes each simulated server (engine.Profile plus overrides). Exactly one of Servers and Fleet.
	Servers []engine.Config
	// Fleet is a fleet spec, "h100:2,a10g:2" (vllm-sim --fleet).
	Fleet string
	// Model is the served base model. Default DefaultModel.
	Model string
	// LoRAModules are the adapter names registered on every server (vllm-sim --lora-modules).
	LoRAModules []string
	// PreloadLoRAs are registered adapters resident at start on every server.
	PreloadLoRAs []string
	// DefaultMaxTokens bounds the output of requests without max_tokens. Default 128.
	DefaultMaxTokens int
	// OutputLength is how long an answer to a request that sets max_tokens is (vllm-sim --output-length): exactly
	// max_tokens ("" or simulator.OutputExact) or uniform in [1, max_tokens] (simulator.OutputCeiling).
	OutputLength simulator.OutputLength
	// ServerSeed seeds the servers: server i uses ServerSeed+i (vllm-sim --seed). testbed/bench/lib.sh uses 1.
	ServerSeed uint64

	// Mix is the request mix (loadgen.ParseMix). Required.
	Mix *loadgen.Mix
	// Mode is open (arrivals) or closed (Users). Default open.
	Mode loadgen.Mode
	// Arrival drives open-loop mode.
	Arrival loadgen.ArrivalConfig
	// Users is the number of closed-loop users.
	Users int
	// Duration stops issuing requests after this much virtual time; MaxRequests after that many. At least one.
	Duration    time.Duration
	MaxRequests int
	// Seed seeds the load (as loadgen's --seed) and the EPP's random choices.
	Seed uint64
	// Retry is the clients' Retry-After policy, as loadgen's.
	Retry loadgen.RetryPolicy
	// RequestTimeout bounds one attempt. Default loadgen.DefaultRequestTimeout.
	RequestTimeout time.Duration
	// Drain bounds how long requests in flight when issuing stops may take; the rest are cancelled. Default
	// RequestTimeout.
	Drain time.Duration
	// MaxInFlight drops open-loop arrivals beyond this many requests in flight, as loadgen does. 0: no limit.
	MaxInFlight int
	// SLO applies to classes that set none (for Result.Summary).
	SLO loadgen.SLO

	// Objectives maps InferenceObjective names (x-gateway-inference-objective) to priorities.
	Objectives map[string]int
	// Router is the contender. Required.
	Router Router
	// ScrapeInterval is how often the EPP scrapes each server and Sluice admission takes its snapshot. Default
	// DefaultScrapeInterval.
	ScrapeInterval time.Duration
	// SampleInterval is the period of Result.Samples. Default DefaultSampleInterval.
	SampleInterval time.Duration
	// DiscardITL leaves Record.ITL empty, for runs too large to keep every inter-token gap (Summarize then reports
	// no ITL, and ITL SLOs hold trivially).
	DiscardITL bool
	// ServerSeries adds per-server waiting and running counts to each Sample.
	ServerSeries bool
	// EveryChunk reports every chunk of a streamed response to the EPP's ResponseBody plugins, as upstream does;
	// by default only the first and the last (the plugins that act on others, sluice-outlier-filter's pace
	// detection, then see no stream's pace). Costs a plugin call per token.
	EveryChunk bool
	// Slowdowns are faults: from At on, server Server's engine steps take Factor times as long (the chaos suite's
	// server-slow-10x in virtual time).
	Slowdowns []Slowdown
	// Blips are faults: the first request server Server receives at or after At is answered 500 at once (one
	// failed answer of a healthy server, the simulator's error_rate fault for one request).
	Blips []Blip
}

// Blip makes one server fail one request.
type Blip struct {
	Server int
	At     time.Duration
}

// Slowdown makes one server slower from a point in the run on.
type Slowdown struct {
	Server int
	At     time.Duration
	Factor float64
}

// withDefaults validates c and returns a copy with defaults applied and Servers filled from Fleet.
func (c Config) withDefaults() (Config, error) {
	var errs []error
	switch {
	case len(c.Servers) > 0 && c.Fleet != "":
		errs = append(errs, errors.New("give Servers or Fleet, not both"))
	case c.Fleet != "":
		servers, err := engine.FleetConfigs(c.Fleet)
		if err != nil {
			errs = append(errs, err)
		}
		c.Servers = servers
	case len(c.Servers) == 0:
		errs = append(errs, errors.New("a fleet is required: set Servers or Fleet"))
	}
	for _, b := range c.Blips {
		if b.Server < 0 || b.Server >= len(c.Servers) || b.At < 0 {
			errs = append(errs, fmt.Errorf("blip %+v: want a server of the fleet (0-%d) and a time not negative", b, len(c.Servers)-1))
		}
	}
	for _, sd := range c.Slowdowns {
		if sd.Server < 0 || sd.Server >= len(c.Servers) || sd.At < 0 || !(sd.Factor >= 1) {
			errs = append(errs, fmt.Errorf("slowdown %+v: want a server of the fleet (0-%d), a time not negative and a factor of at least 1", sd, len(c.Servers)-1))
		}
	}
	for i, s := range c.Servers {
		if err := s.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("server %d: %w", i, err))
		}
		if len(c.LoRAModules) > 0 && s.MaxLoRAs == 0 {
			errs = append(errs, fmt.Errorf("server %d: LoRA modules given but max-loras is 0", i))
		}
		if len(c.PreloadLoRAs) > s.MaxLoRAs {
			errs = append(errs, fmt.Errorf("server %d: %d LoRAs to preload but only %d slots", i, len(c.PreloadLoRAs), s.MaxLoRAs))
		}
	}
	if c.Model == "" {
		c.Model = DefaultModel
	}
	registered := map[string]bool{}
	for _, m := range c.LoRAModules {
		switch {
		case m == "" || m == c.Model:
			errs = append(errs, fmt.Errorf("LoRA module name %q is empty or the base model's", m))
		case registered[m]:
			errs = append(errs, fmt.Errorf("LoRA module %q registered twice", m))
		}
		registered[m] = true
	}
	for _, m := range c.PreloadLoRAs {
		if !registered[m] {
			errs = append(errs, fmt.Errorf("preloaded LoRA %q is not a registered LoRA module", m))
		}
	}
	if c.DefaultMaxTokens == 0 {
		c.DefaultMaxTokens = DefaultMaxTokensWhenUnset
	}
	if _, err := simulator.ParseOutputLength(string(c.OutputLength)); err != nil {
		errs = append(errs, err)
	}
	if c.Mode == "" {
		c.Mode = loadgen.ModeOpen
	}
	load := loadgen.RunConfig{Mix: c.Mix, Mode: c.Mode, Arrival: c.Arrival, Users: c.Users, Duration: c.Duration,
		MaxRequests: c.MaxRequests, RequestTimeout: c.RequestTimeout, Drain: c.Drain, MaxInFlight: c.MaxInFlight,
		Retry: c.Retry}
	if err := load.ValidateLoad(); err != nil {
		errs = append(errs, err)
	}
	c.Router, errs = c.Router.withDefaults(errs)
	if c.ScrapeInterval < 0 || c.SampleInterval < 0 || c.DefaultMaxTokens < 0 {
		errs = append(errs, errors.New("scrape and sample intervals and default max tokens must not be negative"))
	}
	if c.RequestTimeout == 0 {
		c.RequestTimeout = loadgen.DefaultRequestTimeout
	}
	if c.Drain == 0 {
		c.Drain = c.RequestTimeout
	}
	if c.Retry.MaxWait == 0 {
		c.Retry.MaxWait = loadgen.DefaultMaxRetryWait
	}
	if c.ScrapeInterval == 0 {
		c.ScrapeInterval = DefaultScrapeInterval
	}
	if c.SampleInterval == 0 {
		c.SampleInterval = DefaultSampleInterval
	}
	switch c.Router.Kind {
	case RoundRobin:
		if len(c.Router.EndpointPickerConfig) > 0 || c.Router.Admission != nil {
			errs = append(errs, errors.New("round-robin takes no EndpointPickerConfig and no admission policy"))
		}
	case EPP:
	default:
		errs = append(errs, fmt.Errorf("router kind %q is not %q or %q", c.Router.Kind, RoundRobin, EPP))
	}
	if BasePort+len(c.Servers)-1 > 65535 {
		errs = append(errs, fmt.Errorf("%d servers do not fit in ports %d..65535", len(c.Servers), BasePort))
	}
	return c, errors.Join(errs...)
}
