package runner

import (
	"errors"
	"fmt"
	"time"

	"github.com/spf13/pflag"
	runserver "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/server"

	"github.com/sluice-gw/sluice/flowcontrol/replication"
	"github.com/sluice-gw/sluice/plugins/decisiontrace"
)

// Options holds every upstream v1.5.0 EPP option, with upstream's flag names
// and defaults, plus Sluice's own.
type Options struct {
	*runserver.Options

	// StaticEndpoints lists host:port model-server endpoints for static mode.
	StaticEndpoints []string
	// StaticEndpointsFile names a file of endpoints for static mode; it is
	// re-read every StaticEndpointsReloadInterval.
	StaticEndpointsFile string
	// StaticEndpointsReloadInterval is how often StaticEndpointsFile is re-read.
	StaticEndpointsReloadInterval time.Duration
	// ObjectivesFile names a file of InferenceObjective objects for static
	// mode, which has no API server to watch them on.
	ObjectivesFile string
	// ModelSelectionMaxBodyBytes bounds the request body held while a
	// ModelSelector chooses the request's model; larger requests are
	// answered 413.
	ModelSelectionMaxBodyBytes int64
	// DecisionTrace is how many routing decisions the decision trace keeps
	// (DecisionTracePath on the metrics port); 0 turns it off.
	DecisionTrace int
	// DecisionTraceHeader, when set, traces only requests carrying this
	// header.
	DecisionTraceHeader string
	// DecisionTraceRate bounds the requests traced per second; 0 means no
	// bound.
	DecisionTraceRate float64
	// MetricsMaxLabelValues bounds the distinct values of each metric label
	// that clients choose (model_name, target_model_name, fairness_id); later
	// values are counted under "other".
	MetricsMaxLabelValues int
	// Peers lists the health addresses (host:port, --grpc-health-port) of every EPP replica of the pool, this one
	// included: the replicas then share the endpoints (see peers.go). PeersFile names a file of them instead.
	Peers     string
	PeersFile string
	// PeersService names the EPP's own Service in Kubernetes mode: its EndpointSlices' ready addresses, on
	// --grpc-health-port, are the peers.
	PeersService string
	// ReplicaID is this replica's own peer address; empty: derived (see newReplicationView).
	ReplicaID string
	// leaderElectionSuperseded records that Complete turned --ha-enable-leader-election off for a peer source.
	leaderElectionSuperseded bool
	// PeerProbeInterval is how often each peer's health is probed; PeerTimeout how long an unheard peer stays live.
	PeerProbeInterval time.Duration
	PeerTimeout       time.Duration
	// PeerExchangeInterval is how often each replica sends its peers its summary (runner/peerexchange.go); 0: never,
	// the replicas share by endpoint ownership alone.
	PeerExchangeInterval time.Duration
	// ResponseObserverWait turns the response observer on (responseobserver.go): how long a routed request whose
	// routing stream skips the response waits for its observer stream once the proxy ended the routing stream. 0: off.
	ResponseObserverWait time.Duration
	// ShowVersion prints the version and exits.
	ShowVersion bool

	fs *pflag.FlagSet
}

// NewOptions returns Options with upstream's defaults and Sluice's.
func NewOptions() *Options {
	return &Options{
		Options:                       runserver.NewOptions(),
		StaticEndpointsReloadInterval: 2 * time.Second,
		ModelSelectionMaxBodyBytes:    DefaultModelSelectionMaxBodyBytes,
		DecisionTraceRate:             decisiontrace.DefaultRate,
		MetricsMaxLabelValues:         DefaultMaxLabelValues,
		PeerProbeInterval:             replication.DefaultProbeInterval,
		PeerTimeout:                   replication.DefaultTimeout,
		PeerExchangeInterval:          replication.DefaultExchangeInterval,
	}
}

// AddFlags registers upstream's flags, then Sluice's, on fs.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	o.fs = fs
	o.Options.AddFlags(fs)
	fs.StringSliceVar(&o.StaticEndpoints, "static-endpoints", o.StaticEndpoints,
		"Static mode: comma-separated host:port model-server endpoints (IP addresses). "+
			"Runs the EPP with no Kubernetes API; mutually exclusive with --pool-name and --endpoint-selector.")
	fs.StringVar(&o.StaticEndpointsFile, "static-endpoints-file", o.StaticEndpointsFile,
		"Static mode: a file of host:port endpoints, one per line or comma-separated ('#' starts a comment). "+
			"Re-read while running, so endpoints can be added and removed without a restart.")
	fs.DurationVar(&o.StaticEndpointsReloadInterval, "static-endpoints-reload-interval", o.StaticEndpointsReloadInterval,
		"Static mode: how often --static-endpoints-file is re-read.")
	fs.StringVar(&o.ObjectivesFile, "inference-objectives-file", o.ObjectivesFile,
		"Static mode: a YAML file of InferenceObjective objects (inference.networking.x-k8s.io/v1alpha2), as kubectl applies them; "+
			"requests name one in x-gateway-inference-objective to get its priority.")
	fs.Int64Var(&o.ModelSelectionMaxBodyBytes, "model-selection-max-body-bytes", o.ModelSelectionMaxBodyBytes,
		"Model rewrites (InferenceModelRewrite): the largest request body the EPP holds to choose a request's model; "+
			"larger requests are answered 413 with an OpenAI-style error.")
	fs.IntVar(&o.DecisionTrace, "decision-trace", o.DecisionTrace,
		"Decision trace: keep the last N routing decisions (band, queue wait, each filter's and scorer's effect per endpoint, "+
			"the endpoint chosen or why the request was shed), served as JSON at "+DecisionTracePath+" on the metrics port and "+
			"logged at -v=3. 0 (the default) turns it off.")
	fs.StringVar(&o.DecisionTraceHeader, "decision-trace-header", o.DecisionTraceHeader,
		"Decision trace: trace only requests that carry this header (any value); empty traces any request.")
	fs.Float64Var(&o.DecisionTraceRate, "decision-trace-rate", o.DecisionTraceRate,
		"Decision trace: at most this many requests are traced per second; 0 means no bound.")
	fs.IntVar(&o.MetricsMaxLabelValues, "metrics-max-label-values", o.MetricsMaxLabelValues,
		"The most distinct values each metric label that clients choose (model_name, target_model_name, fairness_id) "+
			"keeps on /metrics; later values are counted under \"other\", so no client can grow the EPP's series without bound.")
	fs.StringVar(&o.Peers, "peers", o.Peers,
		"Several active EPP replicas: comma-separated host:port health addresses (--grpc-health-port) of every replica "+
			"of the pool, this one included. The live replicas partition the endpoints; each admits on and routes to its "+
			"own, and takes over a silent peer's within --peer-timeout. Static or Kubernetes mode. Any peer flag "+
			"supersedes --ha-enable-leader-election, which upstream's chart adds whenever replicas > 1.")
	fs.StringVar(&o.PeersFile, "peers-file", o.PeersFile,
		"Like --peers, from a file (one per line or comma-separated, '#' starts a comment), read at startup.")
	fs.StringVar(&o.PeersService, "peers-service", o.PeersService,
		"Kubernetes mode: the EPP's own Service; the ready addresses of its EndpointSlices, on --grpc-health-port, are "+
			"the peers (needs list/watch on discovery.k8s.io endpointslices in the pool's namespace).")
	fs.StringVar(&o.ReplicaID, "replica-id", o.ReplicaID,
		"This replica's own host:port among the peers. Default: with --peers, the peer on --grpc-health-port at an "+
			"address of this machine; with --peers-service, the pod's address and --grpc-health-port.")
	fs.DurationVar(&o.PeerProbeInterval, "peer-probe-interval", o.PeerProbeInterval,
		"How often each peer replica's gRPC health is probed.")
	fs.DurationVar(&o.PeerTimeout, "peer-timeout", o.PeerTimeout,
		"How long a peer replica that stops answering still owns its endpoints (one whose connection attempt fails, "+
			"with nothing heard from it for a probe interval, loses them then); keep it plus the metrics refresh "+
			"interval within --metrics-staleness-threshold.")
	fs.DurationVar(&o.PeerExchangeInterval, "peer-exchange-interval", o.PeerExchangeInterval,
		"How often each replica sends its peers a summary of its seats (Sluice admission), so that the replicas size "+
			"the Critical reserve for the whole pool and send a Critical request that would wait to a peer's idle seat; "+
			"0 shares by endpoint ownership alone.")
	fs.DurationVar(&o.ResponseObserverWait, "response-observer-wait", o.ResponseObserverWait,
		"Response observer (an opt-in of the proxy; examples/envoy/envoy-response-observer.yaml): take each response from a "+
			"second ext_proc filter in observability mode, joined by request.id, for requests whose routing filter skips the "+
			"response (response_body_mode NONE). A routed request waits at most this long for its observer once the proxy "+
			"ended its routing stream; then it ends (sluice_response_observer_total{outcome=\"missing\"}). 0 (the default) "+
			"turns it off. One EPP replica only: both streams of a request must reach it. A client that leaves after "+
			"routing, before the response begins, also ends only after this wait (counted missing): keep it short.")
	fs.BoolVar(&o.ShowVersion, "version", o.ShowVersion, "Print the Sluice version, the GIE version it is built on, and the commit, then exit.")
}

// StaticMode reports whether the EPP runs without a Kubernetes API.
func (o *Options) StaticMode() bool {
	return len(o.StaticEndpoints) > 0 || o.StaticEndpointsFile != ""
}

// Complete post-processes the parsed flags, as upstream does.
func (o *Options) Complete() error {
	// Replicas that share the endpoints are all active, so a peer source supersedes leader election (one active
	// replica). Upstream's chart passes --ha-enable-leader-election whenever it runs more than one replica, and its
	// values can add flags but not remove one: with the peers named, a chart install with replicas > 1 runs them all.
	if o.Replicated() && !o.StaticMode() && o.EnableLeaderElection {
		o.EnableLeaderElection, o.leaderElectionSuperseded = false, true
	}
	return o.Options.Complete()
}

// staticPoolName names the pool that static mode synthesises.
const staticPoolName = "static"

// Validate checks the options. Static mode is checked first, since upstream's
// validation insists on a pool name or an endpoint selector; the rest of
// upstream's checks then run unchanged.
func (o *Options) Validate() error {
	if o.ModelSelectionMaxBodyBytes <= 0 {
		return fmt.Errorf("--model-selection-max-body-bytes must be positive, got %d", o.ModelSelectionMaxBodyBytes)
	}
	if err := o.validateDecisionTrace(); err != nil {
		return err
	}
	if o.MetricsMaxLabelValues < 1 {
		return fmt.Errorf("--metrics-max-label-values must be at least 1, got %d", o.MetricsMaxLabelValues)
	}
	if err := o.validatePeers(); err != nil {
		return err
	}
	if o.ResponseObserverWait < 0 {
		return fmt.Errorf("--response-observer-wait must not be negative, got %s", o.ResponseObserverWait)
	}
	if o.ResponseObserverWait > 0 && o.Replicated() {
		return errors.New("--response-observer-wait needs both ext_proc streams of a request on one replica: it does not go with --peers, --peers-file or --peers-service")
	}
	if !o.StaticMode() {
		if o.ObjectivesFile != "" {
			return errors.Join(o.Options.Validate(), errors.New("--inference-objectives-file is for static mode; in Kubernetes mode InferenceObjectives come from the API server"))
		}
		return o.Options.Validate()
	}
	var errs []error
	if o.PoolName != "" || o.EndpointSelector != "" {
		errs = append(errs, errors.New("--static-endpoints/--static-endpoints-file cannot be combined with --pool-name or --endpoint-selector: "+
			"static mode runs without a Kubernetes API, Kubernetes mode discovers endpoints through it; choose one"))
	}
	if len(o.StaticEndpoints) > 0 && o.StaticEndpointsFile != "" {
		errs = append(errs, errors.New("set either --static-endpoints or --static-endpoints-file, not both"))
	}
	if o.EnableLeaderElection {
		errs = append(errs, errors.New("--ha-enable-leader-election needs a Kubernetes API and cannot be used in static mode"))
	}
	if o.MetricsEndpointAuth {
		if o.flagChanged("metrics-endpoint-auth") {
			errs = append(errs, errors.New("--metrics-endpoint-auth authenticates through the Kubernetes API and cannot be used in static mode"))
		}
		// Upstream's default (true) cannot work without an API server; static
		// mode serves metrics unauthenticated unless told otherwise (above).
		o.MetricsEndpointAuth = false
	}
	if o.StaticEndpointsReloadInterval <= 0 {
		errs = append(errs, fmt.Errorf("--static-endpoints-reload-interval must be positive, got %s", o.StaticEndpointsReloadInterval))
	}
	if len(o.StaticEndpoints) > 0 {
		if _, err := ParseEndpoints(o.StaticEndpoints); err != nil {
			errs = append(errs, fmt.Errorf("--static-endpoints: %w", err))
		}
	}
	if len(errs) == 0 {
		// Run upstream's remaining checks (config, scheme, logging, deprecated
		// metric flags) on a copy that names the synthetic pool.
		upstream := *o.Options
		upstream.PoolName = staticPoolName
		if err := upstream.Validate(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// validateDecisionTrace checks the decision trace's flags, also while it is off (0), so that turning it on later
// does not find a mistake.
func (o *Options) validateDecisionTrace() error {
	cfg := decisiontrace.Config{Size: o.DecisionTrace, Header: o.DecisionTraceHeader, Rate: o.DecisionTraceRate}
	if cfg.Size == 0 {
		cfg.Size = 1
	}
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("--decision-trace: %w", err)
	}
	return nil
}

func (o *Options) flagChanged(name string) bool {
	if o.fs == nil {
		return false
	}
	f := o.fs.Lookup(name)
	return f != nil && f.Changed
}
