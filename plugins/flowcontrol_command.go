package plugins

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"
	"sigs.k8s.io/yaml"

	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/config/loader"
	fwkplugin "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/plugin"
	runserver "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/server"

	"github.com/sluice-gw/sluice/flowcontrol"
	"github.com/sluice-gw/sluice/flowcontrol/replication"
)

// flowControlMetricTenants bounds the tenant label of Sluice's flow-control metrics: the first this many fairness IDs
// keep their name, the rest are counted as "other".
const flowControlMetricTenants = 32

// FlowControlCommand is Sluice admission as the EPP binary exposes it: its command-line flags, its policy file, and
// the FlowControl it starts. cmd/epp registers its flags, calls Complete after parsing, Start from the runner's
// admission factory, and installs it as a response shaper.
//
// Sluice admission is off unless --sluice-admission or --flow-control-config is given; then the EPP behaves exactly
// like upstream's (upstream's admission, no Sluice headers). When on:
//
//   - The policy is a flowcontrol.APIConfig (JSON or YAML) read from --flow-control-config, or the defaults. In
//     Kubernetes mode cmd/epp feeds the FlowControlPolicy CRD (same schema) through Apply, live.
//   - Without --config-file/--config-text, the EPP runs Sluice's default profile (DefaultEndpointPickerConfig:
//     served-model and headroom filters, queue and KV scorers, Sluice's prefix-cache and LoRA-affinity scorers). A
//     given configuration is used as is; add the headroom filter to its scheduling profiles (Start logs a warning
//     when it is missing).
//   - Bind and Release run as request-control hooks of the admission controller itself; nothing to declare.
//
// Concurrency: flags and Complete run before Start; ShapeImmediateResponse is safe for concurrent use at any time and
// does nothing until Start has succeeded; Apply is safe for concurrent use at any time.
type FlowControlCommand struct {
	enabled    bool
	configFile string
	opts       FlowControlOptions

	cfg     *flowcontrol.Config
	started atomic.Pointer[FlowControl]

	// mu orders Apply against Start, so a configuration applied while Start runs is neither lost nor overwritten.
	mu sync.Mutex
	// applied is the configuration Apply received before Start; it takes precedence over cfg.
	applied *flowcontrol.Config
}

// NewFlowControlCommand returns the command with its defaults.
func NewFlowControlCommand() *FlowControlCommand {
	c := &FlowControlCommand{}
	c.opts.applyDefaults()
	return c
}

// AddFlags registers Sluice admission's flags.
func (c *FlowControlCommand) AddFlags(fs *pflag.FlagSet) {
	fs.BoolVar(&c.enabled, "sluice-admission", c.enabled,
		"Sluice admission: priority bands (Critical/Standard/Sheddable) with queued admission in the EPP, per-endpoint "+
			"dispatch, and 429/503 with Retry-After and x-sluice-shed-reason. Off by default (upstream admission); "+
			"--flow-control-config turns it on too.")
	fs.StringVar(&c.configFile, "flow-control-config", c.configFile,
		"Sluice admission policy file (JSON or YAML of the FlowControlPolicy spec: bands, priorityMapping, endpoint "+
			"thresholds, tenants, tenantHeader, aboveMaxBand). Turns Sluice admission on; unset fields take defaults.")
	fs.IntVar(&c.opts.DefaultOutputTokens, "flow-control-default-output-tokens", c.opts.DefaultOutputTokens,
		"Sluice admission: expected output tokens of a request without max_tokens, for its fair-queuing cost.")
	fs.DurationVar(&c.opts.ShutdownGrace, "flow-control-shutdown-grace", c.opts.ShutdownGrace,
		"Sluice admission: on shutdown, how long queued requests may still be dispatched before they are answered 503.")
	fs.IntVar(&c.opts.MaxCandidates, "flow-control-max-candidates", c.opts.MaxCandidates,
		"Sluice admission: schedule each admitted request among at most this many endpoints, the least loaded by "+
			"admission's ranking (among those serving its model), instead of scoring every endpoint of the pool; "+
			"a negative value scores every endpoint.")
	fs.DurationVar(&c.opts.WarmUp, "flow-control-warmup", c.opts.WarmUp,
		"Sluice admission: at most how long, from the start, requests that arrive before any endpoint's metrics were "+
			"scraped wait for them (instead of 503 no_endpoints).")
}

// PolicyFile returns the --flow-control-config path; "" when none was given.
func (c *FlowControlCommand) PolicyFile() string { return c.configFile }

// Enabled reports whether Sluice admission is on.
func (c *FlowControlCommand) Enabled() bool { return c.enabled || c.configFile != "" }

// Complete loads and validates the policy, so a bad file fails at startup, and, when Sluice admission is on and no
// EndpointPickerConfig is given, selects DefaultEndpointPickerConfig.
func (c *FlowControlCommand) Complete(opts *runserver.Options) error {
	if !c.Enabled() {
		return nil
	}
	if err := c.opts.validate(); err != nil {
		return err
	}
	cfg, err := LoadFlowControlConfig(c.configFile)
	if err != nil {
		return err
	}
	c.cfg = cfg
	if opts.ConfigFile == "" && opts.ConfigText == "" {
		text, err := DefaultEndpointPickerConfig()
		if err != nil {
			return err
		}
		opts.ConfigText = text
	}
	return nil
}

// LoadFlowControlConfig reads a policy file (JSON or YAML; "" means the defaults), applies defaults and validates it.
func LoadFlowControlConfig(path string) (*flowcontrol.Config, error) {
	if path == "" {
		return flowcontrol.DefaultConfig(), nil
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--flow-control-config: %w", err)
	}
	js, err := yaml.YAMLToJSON(raw)
	if err != nil {
		return nil, fmt.Errorf("--flow-control-config %s: %w", path, err)
	}
	if string(js) == "null" {
		js = nil
	}
	cfg, err := flowcontrol.ParseConfig(js)
	if err != nil {
		return nil, fmt.Errorf("--flow-control-config %s: %w", path, err)
	}
	return cfg, nil
}

// sluiceDefaultProfile is Sluice's default EndpointPickerConfig. Its weights are upstream's default weights for the
// load scorers both share (queue 2, KV cache 2); Sluice's prefix-cache scorer replaces upstream's with weight 4
// (beside admission's saturation scorer, a third load scorer, a lower weight spreads skewed prefix groups further than
// their load asks), and Sluice adds LoRA affinity (3: at a lower weight the saturation scorer's penalty for an
// endpoint computing a prompt outweighs adapter residency) and admission's fresh saturation. The weights are chosen
// by the virtual-time suite against upstream's default (`make bench ENGINE=virtual`); testbed/bench/scenarios/README.md
// records what the alternatives measured.
//
//   - sluice-served-model-filter first: in a pool of servers of several base models (a canary Deployment beside the
//     stable one) a request goes to a server of its target model; a no-op otherwise. It must precede the headroom
//     filter: admission dispatches on the whole pool's headroom, whatever the model, so restricting to headroom first
//     could leave only servers of another model, which answer 404.
//   - sluice-outlier-filter: of those, it leaves out the servers that answered 5xx several times in a row, for a
//     while (passive outlier detection, package outlier): a server that fails every request answers at once, so it
//     always has headroom and the shortest queue, and every filter and scorer below would prefer it. It precedes the
//     headroom filter, which could otherwise leave the failing server as the only candidate.
//   - sluice-headroom-filter: among those, only endpoints Sluice admission found headroom on are scheduled, and those
//     that hold much more of the request's prompt than any of them (all of them when none has headroom).
//   - sluice-saturation-scorer (weight 2): ranks endpoints by admission's saturation, which counts each dispatch at
//     once, so requests between two scrapes do not all go to the endpoint that looked best at the last one, and each
//     streamed prompt until its first token, so prompts spread over the endpoints that are not computing others;
//     when all are, it prefers the one where a new prompt is expected to start answering first (round-robin's
//     rotation does that by construction, which is why the uniform fleet's TTFT tail needs it).
//   - sluice-lora-residency-extractor on the metrics source: which adapters are resident and which base model a
//     server serves (vLLM's model_name label), so base-model requests are never scored by adapter state.
//   - sluice-metrics-data-source: upstream's metrics source, building only the families its extractors read (and of
//     each histogram and summary only what an extractor can read), without expfmt for the pages model servers write,
//     and asking for pages uncompressed (MetricsSourceType).
//   - sluice-openai-parser: upstream's parser plus usage.prompt_tokens_details.cached_tokens, which the prefix-cache
//     scorer calibrates its per-pod capacity with.
const sluiceDefaultProfile = `apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: ` + ServedModelFilterType + `
- type: ` + OutlierFilterType + `
- type: ` + HeadroomFilterType + `
- type: ` + SaturationScorerType + `
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: ` + PrefixCacheType + `
- type: ` + LoRAAffinityType + `
- type: max-score-picker
- type: ` + OpenAIParserType + `
- type: ` + MetricsSourceType + `
- type: core-metrics-extractor
- type: ` + LoRAResidencyExtractorType + `
parser:
  pluginRef: ` + OpenAIParserType + `
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: ` + ServedModelFilterType + `
  - pluginRef: ` + OutlierFilterType + `
  - pluginRef: ` + HeadroomFilterType + `
  - pluginRef: ` + SaturationScorerType + `
    weight: 2
  - pluginRef: queue-scorer
    weight: 2
  - pluginRef: kv-cache-utilization-scorer
    weight: 2
  - pluginRef: ` + PrefixCacheType + `
    weight: 4
  - pluginRef: ` + LoRAAffinityType + `
    weight: 3
  - pluginRef: max-score-picker
dataLayer:
  sources:
  - pluginRef: ` + MetricsSourceType + `
    extractors:
    - pluginRef: core-metrics-extractor
    - pluginRef: ` + LoRAResidencyExtractorType + `
`

// DefaultEndpointPickerConfig is the EndpointPickerConfig Sluice admission runs when none is given: Sluice's default
// profile (see sluiceDefaultProfile), validated by upstream's loader so a broken default fails at startup.
func DefaultEndpointPickerConfig() (string, error) {
	if _, _, err := loader.LoadRawConfig([]byte(sluiceDefaultProfile), logr.Discard()); err != nil {
		return "", fmt.Errorf("invalid default EPP configuration: %w", err)
	}
	return sluiceDefaultProfile, nil
}

// FlowControlEnv is what Start needs from the assembled EPP.
type FlowControlEnv struct {
	// Endpoints is the EPP's datastore.
	Endpoints EndpointLister
	// Plugins are the plugins instantiated from the EndpointPickerConfig, by name; HeadroomFilters among them are
	// attached.
	Plugins map[string]fwkplugin.Plugin
	// RefreshInterval is the EPP's metrics refresh interval, used as the snapshot interval.
	RefreshInterval time.Duration
	// Registerer receives the flow-control metrics (the registry the EPP's /metrics serves); nil means none.
	Registerer prometheus.Registerer
	// Ownership is the EPP's replication view when it runs with peers; nil means this replica owns every endpoint.
	Ownership EndpointOwnership
	// Peers is this replica's side of the peer exchange (with Ownership); nil: none.
	Peers  *replication.Exchange
	Logger logr.Logger
}

// Start builds the FlowControl from the completed flags and env and attaches the configured HeadroomFilters. It may be
// called once. The caller runs the FlowControl (its Start, or Run) until the EPP stops: the runner does, and waits
// for it, when it is the admission controller.
func (c *FlowControlCommand) Start(_ context.Context, env FlowControlEnv) (*FlowControl, error) {
	if !c.Enabled() {
		return nil, errors.New("sluice admission is not enabled")
	}
	if c.cfg == nil {
		return nil, errors.New("sluice admission: Complete must run before Start")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.started.Load() != nil {
		return nil, errors.New("sluice admission already started")
	}
	cfg, source := c.cfg, "policyFile"
	if c.applied != nil {
		cfg, source = c.applied, "applied"
	}
	opts := c.opts
	if env.RefreshInterval > 0 {
		opts.SnapshotInterval = env.RefreshInterval
	}
	deps := FlowControlDeps{Endpoints: env.Endpoints, Ownership: env.Ownership, Peers: env.Peers, Logger: env.Logger}
	if env.Registerer != nil {
		rec, err := flowcontrol.NewPrometheusRecorder(env.Registerer, flowControlMetricTenants)
		if err != nil {
			return nil, fmt.Errorf("registering flow control metrics: %w", err)
		}
		deps.Recorder = rec
	}
	fc, err := NewFlowControl(cfg, opts, deps)
	if err != nil {
		return nil, err
	}
	if env.Registerer != nil {
		if err := env.Registerer.Register(endpointCollector{fc}); err != nil {
			return nil, fmt.Errorf("registering flow control endpoint metrics: %w", err)
		}
		if fc.peers != nil {
			if err := env.Registerer.Register(peerCollector{fc}); err != nil {
				return nil, fmt.Errorf("registering peer exchange metrics: %w", err)
			}
		}
	}
	if fc.Attach(env.Plugins) == 0 {
		fc.logger.Info("No " + HeadroomFilterType + " plugin is configured: the scheduler may place admitted requests " +
			"on endpoints without headroom for their band; add it to the scheduling profiles")
	}
	c.started.Store(fc)
	fc.logger.Info("Sluice admission enabled", "policyFile", c.configFile, "policySource", source,
		"snapshotInterval", opts.SnapshotInterval)
	return fc, nil
}

// Apply puts cfg in force: at once on the running controller after Start (see flowcontrol.Controller.SetConfig for
// what applies to requests already waiting), or, before Start, as the configuration Start will use instead of the
// policy file. An invalid cfg is rejected and the configuration in force stays.
func (c *FlowControlCommand) Apply(cfg *flowcontrol.Config) error {
	if !c.Enabled() {
		return errors.New("sluice admission is not enabled")
	}
	if cfg == nil {
		return errors.New("sluice admission: configuration must not be nil")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if fc := c.started.Load(); fc != nil {
		return fc.SetConfig(cfg)
	}
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("invalid flow control configuration: %w", err)
	}
	c.applied = cfg
	return nil
}

// Shed implements the runner's Shedder by delegating to the started FlowControl.
func (c *FlowControlCommand) Shed(requestID string) bool {
	fc := c.started.Load()
	return fc != nil && fc.Shed(requestID)
}

// ShapeImmediateResponse implements the runner's ResponseShaper by delegating to the started FlowControl.
func (c *FlowControlCommand) ShapeImmediateResponse(ctx context.Context, requestID string, resp *extprocv3.ImmediateResponse) {
	if fc := c.started.Load(); fc != nil {
		fc.ShapeImmediateResponse(ctx, requestID, resp)
	}
}
