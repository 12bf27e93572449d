package runner

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/spf13/pflag"
	"google.golang.org/grpc/encoding"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/sluice-gw/sluice/flowcontrol/replication"
	"github.com/sluice-gw/sluice/plugins"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/common"
	logutil "sigs.k8s.io/gateway-api-inference-extension/pkg/common/observability/logging"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/common/observability/tracing"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/metrics"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/metrics/collectors"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/scheduling"
	gieversion "sigs.k8s.io/gateway-api-inference-extension/version"
)

// ManagerSetup extends the controller-runtime manager the runner builds in
// Kubernetes mode, e.g. with a reconciler for Sluice's own CRDs. Neither
// function is called in static mode, which has no manager. pool is what the
// EPP serves: its InferencePool, or, with --endpoint-selector, its Deployment.
type ManagerSetup struct {
	// Options (may be nil) adjusts the manager's options before the manager
	// is created. Register extra API types with opts.Scheme (upstream's
	// process-wide scheme, which the manager's client and cache use) and
	// restrict what the cache watches with opts.Cache.ByObject entries (the
	// cache is cluster-wide for types without one). Do not replace
	// opts.Scheme or remove upstream's entries.
	Options func(opts *ctrl.Options, pool common.GKNN) error
	// Setup (may be nil) runs after the manager is created and upstream's
	// reconcilers are registered, before the manager starts: add controllers
	// or runnables to mgr here.
	Setup func(mgr manager.Manager, pool common.GKNN) error
}

// Runner builds and runs the Sluice EPP.
type Runner struct {
	admission     AdmissionFactory
	modelSelector ModelSelectorFactory
	hotPath       func(opts *Options) bool
	managerSetups []ManagerSetup
	shapers       []ResponseShaper
	flags         []func(fs *pflag.FlagSet)
	completers    []func(opts *Options) error
	restConfig    *rest.Config
	clock         clock.WithTicker
	stdout        io.Writer
	// shutdownGrace bounds how long the gRPC servers drain on shutdown.
	shutdownGrace time.Duration
	// extProcHandler, when set (by this package's benchmarks), is handed the ext_proc handler the gRPC server serves
	// and the codec it decodes and encodes the messages with, so that it can be driven in process, without a
	// transport.
	extProcHandler func(extprocv3.ExternalProcessorServer, encoding.CodecV2)
}

// New returns a Runner with upstream's admission and OpenAI-style error
// bodies on immediate responses.
func New() *Runner {
	return &Runner{
		admission:     UpstreamAdmission,
		shapers:       []ResponseShaper{OpenAIErrorBody},
		clock:         clock.RealClock{},
		stdout:        os.Stdout,
		shutdownGrace: 30 * time.Second,
	}
}

// WithAdmission replaces the admission controller factory.
func (r *Runner) WithAdmission(f AdmissionFactory) *Runner {
	r.admission = f
	return r
}

// WithManagerSetup extends the controller-runtime manager in Kubernetes mode
// (see ManagerSetup). Setups apply in the order given; an error from either
// function fails startup.
func (r *Runner) WithManagerSetup(s ManagerSetup) *Runner {
	r.managerSetups = append(r.managerSetups, s)
	return r
}

// WithFlags registers extra flags on the EPP's command line, parsed with
// upstream's and the runner's and listed by --help. complete (may be nil) runs
// after the options are parsed and completed and before they are validated;
// it may check the extra flags and adjust opts, e.g. choose a default
// EndpointPickerConfig.
func (r *Runner) WithFlags(add func(fs *pflag.FlagSet), complete func(opts *Options) error) *Runner {
	r.flags = append(r.flags, add)
	if complete != nil {
		r.completers = append(r.completers, complete)
	}
	return r
}

// WithResponseShapers appends shapers applied, in order, to every immediate
// response after the default ones.
func (r *Runner) WithResponseShapers(s ...ResponseShaper) *Runner {
	r.shapers = append(r.shapers, s...)
	return r
}

// WithRestConfig sets the Kubernetes client configuration instead of
// resolving it from KUBECONFIG or the in-cluster environment.
func (r *Runner) WithRestConfig(cfg *rest.Config) *Runner {
	r.restConfig = cfg
	return r
}

// WithOutput sets where --help and --version print.
func (r *Runner) WithOutput(w io.Writer) *Runner {
	r.stdout = w
	return r
}

var setupLog = ctrl.Log.WithName("setup")

// Run parses args (without the program name) and runs the EPP until ctx ends.
// --help and --version print and return nil.
func (r *Runner) Run(ctx context.Context, args []string) error {
	logutil.InitSetupLogging()
	fs := pflag.NewFlagSet("epp", pflag.ContinueOnError)
	fs.SetOutput(r.stdout)
	opts := NewOptions()
	opts.AddFlags(fs)
	for _, add := range r.flags {
		add(fs)
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return nil
		}
		return err
	}
	if opts.ShowVersion {
		_, err := fmt.Fprintln(r.stdout, Version())
		return err
	}
	if err := opts.Complete(); err != nil {
		return err
	}
	for _, complete := range r.completers {
		if err := complete(opts); err != nil {
			return err
		}
	}
	if err := opts.Validate(); err != nil {
		return err
	}
	setupLog.Info("Sluice EPP build", "version", Version().Version, "commit", Version().Commit, "gie", gieversion.BundleVersion)
	flags := map[string]any{}
	fs.VisitAll(func(f *pflag.Flag) { flags[f.Name] = f.Value })
	setupLog.Info("Flags processed", "flags", flags)
	if opts.leaderElectionSuperseded {
		setupLog.Info("--ha-enable-leader-election is superseded by the peers: every replica is active and they share the pool's endpoints")
	}
	logutil.InitLogging(&opts.ZapOptions)
	boundMetricLabels(opts.MetricsMaxLabelValues)
	return r.run(ctx, opts)
}

// process is an assembled EPP: either a controller-runtime manager that runs
// the runnables (Kubernetes mode), or the runnables alone (static mode).
type process struct {
	mgr       manager.Manager
	runnables []manager.Runnable
}

// add runs rs with the process: under the manager, or beside the other
// runnables in static mode.
func (p *process) add(rs ...manager.Runnable) error {
	if p.mgr == nil {
		p.runnables = append(p.runnables, rs...)
		return nil
	}
	for _, rn := range rs {
		if err := p.mgr.Add(rn); err != nil {
			return err
		}
	}
	return nil
}

func (r *Runner) run(ctx context.Context, opts *Options) error {
	if opts.Tracing {
		if err := tracing.InitTracing(ctx, setupLog, "gateway-api-inference-extension/epp"); err != nil {
			return fmt.Errorf("failed to init tracing: %w", err)
		}
	}
	// Endpoint metrics are collected until the process has stopped, not only until the stop signal: admission
	// keeps dispatching the requests queued in it during its shutdown grace, and decides only on fresh metrics.
	collect, stopCollecting := context.WithCancel(context.WithoutCancel(ctx))
	defer stopCollecting()
	p, err := r.setup(ctx, collect, opts)
	if err != nil {
		return err
	}
	if p.mgr != nil {
		setupLog.Info("Controller manager starting")
		if err := p.mgr.Start(ctx); err != nil {
			return fmt.Errorf("controller manager: %w", err)
		}
		setupLog.Info("Controller manager terminated")
		return nil
	}
	return runAll(ctx, p.runnables)
}

// runAll runs runnables until ctx ends or one fails; a failure stops the rest.
func runAll(ctx context.Context, runnables []manager.Runnable) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg       sync.WaitGroup
		once     sync.Once
		firstErr error
	)
	for _, rn := range runnables {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := rn.Start(ctx); err != nil {
				once.Do(func() { firstErr = err })
				cancel()
			}
		}()
	}
	wg.Wait()
	return firstErr
}

// installPlugins installs Sluice's plugin registry into upstream's global one
// exactly once per process; its scorers' metrics go to the registry /metrics
// serves.
var installPlugins = sync.OnceValue(func() error {
	reg, err := plugins.DefaultWithMetrics(crmetrics.Registry)
	if err != nil {
		return err
	}
	return reg.Install()
})

// setup assembles the EPP in upstream's order: plugins and configuration, the
// metrics data layer, the datastore, the configured plugins, the manager (or,
// in static mode, the metrics server), the running data layer, the request
// path (admission, model selection, Director; with the decision trace, a
// scheduler that traces), the manager's reconcilers, and the gRPC servers.
// The datastore's metrics collectors run under collect, which outlives ctx
// until the process has stopped.
func (r *Runner) setup(ctx, collect context.Context, opts *Options) (*process, error) {
	if err := installPlugins(); err != nil {
		return nil, fmt.Errorf("registering plugins: %w", err)
	}
	rawConfig, featureGates, err := loadRawConfig(ctx, opts)
	if err != nil {
		return nil, err
	}
	dl, err := newDataLayer(opts, featureGates)
	if err != nil {
		return nil, err
	}
	gknn, err := poolGKNN(opts)
	if err != nil {
		return nil, err
	}
	ds, kube, err := r.newDatastore(collect, opts, dl.endpoints, *gknn)
	if err != nil {
		return nil, err
	}
	eppConfig, rcConfig, parser, configured, err := instantiateConfig(ctx, rawConfig, ds)
	if err != nil {
		return nil, err
	}
	metrics.Register(collectors.NewInferencePoolMetricsCollector(ds))
	metrics.RecordInferenceExtensionInfo(gieversion.CommitSHA, gieversion.BuildRef)
	decisions, err := newDecisionRecorder(opts)
	if err != nil {
		return nil, err
	}
	isLeader := &atomic.Bool{}
	isLeader.Store(!opts.EnableLeaderElection)
	p, err := r.newProcess(ctx, opts, *gknn, kube, isLeader, decisions)
	if err != nil {
		return nil, err
	}
	if eppConfig.SchedulerConfig == nil {
		return nil, errors.New("scheduler config must be set either by config api or through code")
	}
	schedulerConfig := eppConfig.SchedulerConfig
	if decisions != nil {
		// The decision trace sees the scheduler's plugins through wrappers; without it, upstream's configuration runs.
		if schedulerConfig, err = plugins.TracedSchedulerConfig(rawConfig.SchedulingProfiles, configured); err != nil {
			return nil, fmt.Errorf("decision trace: %w", err)
		}
	}
	scheduler := scheduling.NewSchedulerWithConfig(schedulerConfig)
	if err := r.startDataLayer(ctx, opts, p, dl, eppConfig.DataConfig, ds, gknn.Namespace); err != nil {
		return nil, err
	}
	view, err := newReplicationView(ctx, opts)
	if err != nil {
		return nil, fmt.Errorf("EPP replicas: %w", err)
	}
	var exchange *replication.Exchange
	if view != nil && opts.PeerExchangeInterval > 0 {
		exchange = replication.NewExchange(view.Self(), opts.PeerTimeout)
	}
	req, err := r.newRequestPath(ctx, opts, *gknn, ds, featureGates, eppConfig, rcConfig, configured, scheduler, parser, view, exchange)
	if err != nil {
		return nil, err
	}
	req.decisions = decisions
	if p.mgr != nil {
		if err := r.extendManager(p.mgr, *gknn, ds, kube); err != nil {
			return nil, err
		}
	}
	if view != nil {
		if err := r.replicate(p, opts, *gknn, view, req.peers); err != nil {
			return nil, err
		}
	}
	servers, err := r.servers(ctx, opts, ds, req, isLeader, dl.newMetrics)
	if err != nil {
		return nil, err
	}
	return p, p.add(servers...)
}
