package runner

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/pprof"
	"os"
	"regexp"
	goruntime "runtime"
	"sync"
	"sync/atomic"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/go-logr/logr"
	"github.com/spf13/pflag"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/sluice-gw/sluice/plugins"
	configapi "sigs.k8s.io/gateway-api-inference-extension/apix/config/v1alpha1"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/common"
	logutil "sigs.k8s.io/gateway-api-inference-extension/pkg/common/observability/logging"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/common/observability/tracing"
	backendmetrics "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/backend/metrics"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/config"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/config/loader"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/datalayer"
	datalayerlogger "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/datalayer/logger"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/datastore"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/flowcontrol"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/flowcontrol/contracts"
	fccontroller "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/flowcontrol/controller"
	fcregistry "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/flowcontrol/registry"
	fwkdl "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/datalayer"
	fwkfc "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/flowcontrol"
	fwkplugin "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/plugin"
	fwkrh "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/requesthandling"
	extractormetrics "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/datalayer/extractor/metrics"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/handlers"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/metrics"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/metrics/collectors"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/requestcontrol"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/scheduling"
	runserver "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/server"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/util/env"
	gieversion "sigs.k8s.io/gateway-api-inference-extension/version"
)

// enableExperimentalFlowControlLayer is upstream's deprecated environment
// switch for the flow control feature gate; it is honoured the same way.
const enableExperimentalFlowControlLayer = "ENABLE_EXPERIMENTAL_FLOW_CONTROL_LAYER"

// AdmissionDeps is what an AdmissionFactory may use to build the admission
// controller.
type AdmissionDeps struct {
	Options            *Options
	Datastore          datastore.Datastore
	EndpointCandidates contracts.EndpointCandidates
	SaturationDetector fwkfc.SaturationDetector
	Config             *config.Config
	FeatureGates       map[string]bool
	Logger             logr.Logger
	// Plugins are the plugins instantiated from the EndpointPickerConfig, by
	// name, so that an admission controller can work with the plugins it
	// relies on in the scheduling profiles (e.g. a filter that restricts
	// scheduling to what admission decided).
	Plugins map[string]fwkplugin.Plugin
}

// AdmissionFactory builds the admission controller the Director consults for
// every request. It is the seam where Sluice's queued admission plugs in.
//
// An admission controller that is also a plugin (fwkplugin.Plugin) takes part
// in the request lifecycle like a configured request-control plugin: its
// PreRequest, ResponseHeader and ResponseBody hooks run for every request, so
// it can follow what it admitted to the end without being declared in the
// EndpointPickerConfig.
type AdmissionFactory func(ctx context.Context, deps AdmissionDeps) (requestcontrol.AdmissionController, error)

// UpstreamAdmission chooses admission exactly as upstream's runner does: the
// experimental flow controller when its feature gate is on, otherwise legacy
// saturation-based shedding of sheddable requests.
func UpstreamAdmission(ctx context.Context, deps AdmissionDeps) (requestcontrol.AdmissionController, error) {
	if !deps.FeatureGates[flowcontrol.FeatureGate] {
		deps.Logger.Info("Experimental Flow Control layer is disabled, using legacy admission control")
		return requestcontrol.NewLegacyAdmissionController(deps.SaturationDetector, deps.EndpointCandidates), nil
	}
	deps.Logger.Info("Initializing experimental Flow Control layer")
	registry, err := fcregistry.NewFlowRegistry(deps.Config.FlowControlConfig.Registry, deps.Logger)
	if err != nil {
		return nil, fmt.Errorf("failed to initialize Flow Registry: %w", err)
	}
	fc, err := fccontroller.NewFlowController(ctx, deps.Options.PoolName, deps.Config.FlowControlConfig.Controller,
		fccontroller.Deps{
			Registry:           registry,
			SaturationDetector: deps.SaturationDetector,
			EndpointCandidates: deps.EndpointCandidates,
			UsageLimitPolicy:   deps.Config.FlowControlConfig.UsageLimitPolicy,
		})
	if err != nil {
		return nil, fmt.Errorf("failed to initialize Flow Controller: %w", err)
	}
	go registry.Run(ctx)
	return requestcontrol.NewFlowControlAdmissionController(fc, deps.Options.PoolName), nil
}

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
	managerSetups []ManagerSetup
	shapers       []ResponseShaper
	flags         []func(fs *pflag.FlagSet)
	completers    []func(opts *Options) error
	restConfig    *rest.Config
	clock         clock.WithTicker
	stdout        io.Writer
	// shutdownGrace bounds how long the gRPC servers drain on shutdown.
	shutdownGrace time.Duration
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
	logutil.InitLogging(&opts.ZapOptions)
	return r.run(ctx, opts)
}

// process is an assembled EPP: either a controller-runtime manager that runs
// the runnables (Kubernetes mode), or the runnables alone (static mode).
type process struct {
	mgr       manager.Manager
	runnables []manager.Runnable
}

func (r *Runner) run(ctx context.Context, opts *Options) error {
	if opts.Tracing {
		if err := tracing.InitTracing(ctx, setupLog, "gateway-api-inference-extension/epp"); err != nil {
			return fmt.Errorf("failed to init tracing: %w", err)
		}
	}
	p, err := r.setup(ctx, opts)
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

func (r *Runner) setup(ctx context.Context, opts *Options) (*process, error) {
	logger := setupLog
	if err := installPlugins(); err != nil {
		return nil, fmt.Errorf("registering plugins: %w", err)
	}
	rawConfig, featureGates, err := loadRawConfig(ctx, opts)
	if err != nil {
		return nil, err
	}
	useNewMetrics := !featureGates[datalayer.EnableLegacyMetricsFeatureGate] || featureGates[datalayer.ExperimentalDatalayerFeatureGate]
	dlRuntime := datalayer.NewRuntime(opts.RefreshMetricsInterval)
	var epf datalayer.EndpointFactory = dlRuntime
	if !useNewMetrics {
		pmc, err := backendmetrics.NewPodMetricsClientImpl(logger, backendmetrics.Config{
			ModelServerMetricsScheme:        opts.ModelServerMetricsScheme,
			ModelServerMetricsHTTPSInsecure: opts.ModelServerMetricsHTTPSInsecure,
			ModelServerMetricsPath:          opts.ModelServerMetricsPath,
			TotalQueuedRequestsMetric:       opts.TotalQueuedRequestsMetric,
			TotalRunningRequestsMetric:      opts.TotalRunningRequestsMetric,
			KVCacheUsagePercentageMetric:    opts.KVCacheUsagePercentageMetric,
			LoRAInfoMetric:                  opts.LoRAInfoMetric,
			CacheInfoMetric:                 opts.CacheInfoMetric,
		})
		if err != nil {
			return nil, err
		}
		epf = backendmetrics.NewPodMetricsFactory(pmc, opts.RefreshMetricsInterval)
	}

	gknn, err := poolGKNN(opts)
	if err != nil {
		return nil, err
	}

	var (
		ds            datastore.Datastore
		controllerCfg runserver.ControllerConfig
		restConfig    *rest.Config
		staticRunner  manager.Runnable
	)
	if opts.StaticMode() {
		// The static endpoints are loaded once the data layer is configured
		// (below): an endpoint added before then gets no metrics collector.
		ds = datastore.NewDatastore(ctx, epf, int32(opts.ModelServerMetricsPort))
	} else {
		restConfig = r.restConfig
		if restConfig == nil {
			if restConfig, err = ctrl.GetConfig(); err != nil {
				return nil, fmt.Errorf("failed to get Kubernetes rest config: %w", err)
			}
		}
		startCrdReconcilers := opts.EndpointSelector == ""
		controllerCfg = runserver.NewControllerConfig(startCrdReconcilers)
		if err := controllerCfg.PopulateControllerConfig(restConfig); err != nil {
			return nil, fmt.Errorf("failed to populate controller config: %w", err)
		}
		kds := datastore.NewDatastore(ctx, epf, int32(opts.ModelServerMetricsPort))
		if !startCrdReconcilers {
			pool, err := endpointPoolFromSelector(gknn.Namespace, gknn.Name, opts.EndpointSelector, opts.EndpointTargetPorts)
			if err != nil {
				return nil, err
			}
			kds = kds.WithEndpointPool(pool)
		}
		ds = kds
	}

	eppConfig, rcConfig, parser, configured, err := instantiateConfig(ctx, rawConfig, ds)
	if err != nil {
		return nil, err
	}

	metrics.Register(collectors.NewInferencePoolMetricsCollector(ds))
	metrics.RecordInferenceExtensionInfo(gieversion.CommitSHA, gieversion.BuildRef)

	metricsOpts := metricsserver.Options{
		BindAddress:   fmt.Sprintf(":%d", opts.MetricsPort),
		ExtraHandlers: pprofHandlers(opts.EnablePprof),
	}
	if opts.MetricsEndpointAuth {
		metricsOpts.FilterProvider = filters.WithAuthenticationAndAuthorization
	}

	isLeader := &atomic.Bool{}
	isLeader.Store(!opts.EnableLeaderElection)

	p := &process{}
	if !opts.StaticMode() {
		var optionErrs []error
		extendOptions := func(o *ctrl.Options) {
			for _, s := range r.managerSetups {
				if s.Options != nil {
					optionErrs = append(optionErrs, s.Options(o, *gknn))
				}
			}
		}
		p.mgr, err = runserver.NewDefaultManager(controllerCfg, *gknn, restConfig, metricsOpts, opts.EnableLeaderElection, extendOptions)
		if err := errors.Join(optionErrs...); err != nil {
			return nil, fmt.Errorf("extending the controller manager's options: %w", err)
		}
		if err != nil {
			return nil, err
		}
		if opts.EnableLeaderElection {
			logger.Info("Leader election enabled")
			go func() {
				select {
				case <-p.mgr.Elected():
					isLeader.Store(true)
					logger.Info("This instance is now the leader!")
				case <-ctx.Done():
				}
			}()
		}
	} else {
		ms, err := metricsserver.NewServer(metricsOpts, nil, nil)
		if err != nil {
			return nil, err
		}
		p.runnables = append(p.runnables, ms)
	}

	if eppConfig.SchedulerConfig == nil {
		return nil, errors.New("scheduler config must be set either by config api or through code")
	}
	scheduler := scheduling.NewSchedulerWithConfig(eppConfig.SchedulerConfig)

	if err := dlRuntime.Configure(eppConfig.DataConfig, useNewMetrics, disallowedExtractor(useNewMetrics), logger); err != nil {
		return nil, fmt.Errorf("failed to initialize data layer: %w", err)
	}
	if p.mgr != nil {
		if err := dlRuntime.Start(ctx, p.mgr); err != nil {
			return nil, fmt.Errorf("failed to start data layer: %w", err)
		}
	} else if src := notificationSource(eppConfig.DataConfig); src != "" {
		return nil, fmt.Errorf("data source %q watches Kubernetes objects and cannot run in static mode", src)
	}
	if opts.StaticMode() {
		if staticRunner, err = r.startStatic(ctx, opts, ds, gknn.Namespace); err != nil {
			return nil, err
		}
		p.runnables = append(p.runnables, staticRunner)
	}

	candidates := requestcontrol.NewDatastoreEndpointCandidates(ds, requestcontrol.WithDisableEndpointSubsetFilter(opts.DisableEndpointSubsetFilter))
	var endpointCandidates contracts.EndpointCandidates = candidates
	if featureGates[flowcontrol.FeatureGate] {
		endpointCandidates = requestcontrol.NewCachedEndpointCandidates(ctx, candidates, 50*time.Millisecond)
	}
	admission, err := r.admission(ctx, AdmissionDeps{
		Options:            opts,
		Datastore:          ds,
		EndpointCandidates: endpointCandidates,
		SaturationDetector: eppConfig.SaturationDetector,
		Config:             eppConfig,
		FeatureGates:       featureGates,
		Logger:             logger,
		Plugins:            configured,
	})
	if err != nil {
		return nil, err
	}
	if p, ok := admission.(fwkplugin.Plugin); ok {
		rcConfig.AddPlugins(p)
	}
	var selector ModelSelector
	if r.modelSelector != nil {
		if selector, err = r.modelSelector(ctx, ModelSelectorDeps{Options: opts, Pool: *gknn, Logger: ctrl.Log.WithName("model-selector")}); err != nil {
			return nil, err
		}
	}
	var directorStore requestcontrol.Datastore = ds
	if selector != nil {
		directorStore = withoutUpstreamRewrites{ds}
	}
	director := requestcontrol.NewDirectorWithConfig(directorStore, scheduler, admission, parser, endpointCandidates, rcConfig)

	if p.mgr != nil {
		reconcilers := &runserver.ExtProcServerRunner{GKNN: *gknn, Datastore: ds, ControllerCfg: controllerCfg}
		if err := reconcilers.SetupWithManager(p.mgr); err != nil {
			return nil, fmt.Errorf("failed to setup EPP controllers: %w", err)
		}
		for _, s := range r.managerSetups {
			if s.Setup == nil {
				continue
			}
			if err := s.Setup(p.mgr, *gknn); err != nil {
				return nil, fmt.Errorf("extending the controller manager: %w", err)
			}
		}
	}

	extProc, err := r.extProcServer(ctx, opts, ds, director, parser, selector)
	if err != nil {
		return nil, err
	}
	healthSrv := grpc.NewServer()
	healthpb.RegisterHealthServer(healthSrv, &healthServer{
		logger:                ctrl.Log.WithName("health"),
		pool:                  ds,
		isLeader:              isLeader,
		leaderElectionEnabled: opts.EnableLeaderElection,
	})
	servers := []manager.Runnable{
		&grpcServer{name: "health", server: healthSrv, port: opts.GRPCHealthPort, gracePeriod: r.shutdownGrace, logger: ctrl.Log.WithName("health")},
		&grpcServer{name: "ext-proc", server: extProc, port: opts.GRPCPort, gracePeriod: r.shutdownGrace, logger: ctrl.Log.WithName("ext-proc")},
		manager.RunnableFunc(func(ctx context.Context) error {
			// Upstream logs a periodic metrics summary of the pool.
			startMetricsLogger(ctx, ds, opts, useNewMetrics)
			<-ctx.Done()
			return nil
		}),
	}
	if p.mgr != nil {
		for _, s := range servers {
			if err := p.mgr.Add(s); err != nil {
				return nil, err
			}
		}
	} else {
		p.runnables = append(p.runnables, servers...)
	}
	return p, nil
}

// extProcServer builds the ext_proc gRPC server: upstream's streaming server
// behind Sluice's model selector (may be nil) and response shapers, with
// upstream's TLS and health options.
func (r *Runner) extProcServer(ctx context.Context, opts *Options, ds datastore.Datastore, director *requestcontrol.Director, parser fwkrh.Parser, selector ModelSelector) (*grpc.Server, error) {
	var serverOpts []grpc.ServerOption
	if opts.SecureServing {
		creds, err := serverCredentials(ctx, opts.CertPath, opts.EnableCertReload)
		if err != nil {
			return nil, err
		}
		serverOpts = append(serverOpts, grpc.Creds(creds))
	}
	srv := grpc.NewServer(serverOpts...)
	extprocv3.RegisterExternalProcessorServer(srv, &shapingServer{
		upstream:     handlers.NewStreamingServer(ds, director, parser),
		shapers:      r.shapers,
		selector:     selector,
		maxBodyBytes: opts.ModelSelectionMaxBodyBytes,
		clock:        r.clock,
	})
	if opts.HealthChecking {
		hc := health.NewServer()
		healthpb.RegisterHealthServer(srv, hc)
		hc.SetServingStatus(extprocv3.ExternalProcessor_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	}
	return srv, nil
}

// startStatic loads the static endpoints into the datastore and returns the
// runnable that keeps a static endpoints file in force (a no-op runnable for
// --static-endpoints, which cannot change).
func (r *Runner) startStatic(ctx context.Context, opts *Options, ds datastore.Datastore, namespace string) (manager.Runnable, error) {
	pool := &staticPool{namespace: namespace}
	logger := ctrl.Log.WithName("static-endpoints")
	if opts.ObjectivesFile != "" {
		n, err := loadObjectivesFile(opts.ObjectivesFile, namespace, ds)
		if err != nil {
			return nil, err
		}
		logger.Info("Inference objectives loaded", "file", opts.ObjectivesFile, "objectives", n)
	}
	if opts.StaticEndpointsFile == "" {
		eps, err := ParseEndpoints(opts.StaticEndpoints)
		if err != nil {
			return nil, fmt.Errorf("--static-endpoints: %w", err)
		}
		if err := pool.apply(ctx, ds, eps); err != nil {
			return nil, err
		}
		logger.Info("Static endpoints loaded", "endpoints", len(eps))
		return manager.RunnableFunc(func(ctx context.Context) error { <-ctx.Done(); return nil }), nil
	}
	w := &fileWatcher{
		path:     opts.StaticEndpointsFile,
		interval: opts.StaticEndpointsReloadInterval,
		clock:    r.clock,
		pool:     pool,
		store:    ds,
		logger:   logger,
	}
	if err := w.load(ctx); err != nil {
		return nil, err
	}
	return w, nil
}

// loadRawConfig reads the EndpointPickerConfig from --config-text or
// --config-file (or upstream's default when neither is set).
func loadRawConfig(ctx context.Context, opts *Options) (*configapi.EndpointPickerConfig, map[string]bool, error) {
	var configBytes []byte
	if opts.ConfigText != "" {
		configBytes = []byte(opts.ConfigText)
	} else if opts.ConfigFile != "" {
		var err error
		if configBytes, err = os.ReadFile(opts.ConfigFile); err != nil {
			return nil, nil, fmt.Errorf("failed to load config from a file '%s' - %w", opts.ConfigFile, err)
		}
	}
	loader.RegisterFeatureGate(datalayer.ExperimentalDatalayerFeatureGate)
	loader.RegisterFeatureGate(datalayer.EnableLegacyMetricsFeatureGate)
	loader.RegisterFeatureGate(flowcontrol.FeatureGate)
	raw, gates, err := loader.LoadRawConfig(configBytes, ctrl.LoggerFrom(ctx))
	if err != nil {
		return nil, nil, fmt.Errorf("failed to parse config - %w", err)
	}
	if _, ok := os.LookupEnv(enableExperimentalFlowControlLayer); ok {
		setupLog.Info("Enabling the experimental Flow Control layer using environment variables is deprecated and will be removed in next version")
		if env.GetEnvBool(enableExperimentalFlowControlLayer, false, setupLog) {
			raw.FeatureGates = append(raw.FeatureGates, flowcontrol.FeatureGate)
			gates[flowcontrol.FeatureGate] = true
		}
	}
	return raw, gates, nil
}

// instantiateConfig instantiates the configured plugins and derives the
// request-control plugin order and the request parser, as upstream does. It
// also returns the instantiated plugins by name.
func instantiateConfig(ctx context.Context, raw *configapi.EndpointPickerConfig, ds datastore.Datastore) (*config.Config, *requestcontrol.Config, fwkrh.Parser, map[string]fwkplugin.Plugin, error) {
	handle := fwkplugin.NewEppHandle(ctx, podListFunc(ds))
	cfg, err := loader.InstantiateAndConfigure(raw, handle, ctrl.LoggerFrom(ctx))
	if err != nil {
		return nil, nil, nil, nil, fmt.Errorf("failed to load the configuration - %w", err)
	}
	rc := requestcontrol.NewConfig()
	rc.AddPlugins(handle.GetAllPlugins()...)
	dag, err := datalayer.ValidateAndOrderDataDependencies(handle.GetAllPlugins())
	if err != nil {
		return nil, nil, nil, nil, fmt.Errorf("failed to load the configuration - %w", err)
	}
	rc.OrderPrepareDataPlugins(dag)
	return cfg, rc, handlers.NewParser(cfg.ParserConfig), handle.GetAllPluginsWithNames(), nil
}

func podListFunc(ds datastore.Datastore) func() []types.NamespacedName {
	return func() []types.NamespacedName {
		pods := ds.PodList(datastore.AllPodsPredicate)
		names := make([]types.NamespacedName, 0, len(pods))
		for _, p := range pods {
			names = append(names, p.GetMetadata().NamespacedName)
		}
		return names
	}
}

func disallowedExtractor(useNewMetrics bool) string {
	if useNewMetrics {
		return ""
	}
	return extractormetrics.MetricsExtractorType
}

// notificationSource returns the name of the first configured data source
// that needs Kubernetes notifications, or "".
func notificationSource(cfg *datalayer.Config) string {
	if cfg == nil {
		return ""
	}
	for _, s := range cfg.Sources {
		if _, ok := s.Plugin.(fwkdl.NotificationSource); ok {
			return s.Plugin.TypedName().String()
		}
	}
	return ""
}

// startMetricsLogger starts upstream's periodic pool metrics summary for the
// metrics pipeline in use.
func startMetricsLogger(ctx context.Context, ds datastore.Datastore, opts *Options, useNewMetrics bool) {
	if useNewMetrics {
		datalayerlogger.StartMetricsLogger(ctx, ds, opts.RefreshPrometheusMetricsInterval, opts.MetricsStalenessThreshold)
		return
	}
	backendmetrics.StartMetricsLogger(ctx, ds, opts.RefreshPrometheusMetricsInterval, opts.MetricsStalenessThreshold)
}

// pprofHandlers serves upstream's profiles on the metrics server, plus the CPU
// profile (/debug/pprof/profile?seconds=N), which upstream leaves out and which
// is what shows where an EPP's CPU goes under load.
func pprofHandlers(enabled bool) map[string]http.Handler {
	if !enabled {
		return nil
	}
	goruntime.SetMutexProfileFraction(1)
	goruntime.SetBlockProfileRate(1)
	h := map[string]http.Handler{}
	for _, p := range []string{"heap", "goroutine", "allocs", "threadcreate", "block", "mutex"} {
		h["/debug/pprof/"+p] = pprof.Handler(p)
	}
	h["/debug/pprof/profile"] = http.HandlerFunc(pprof.Profile)
	return h
}

// poolGKNN names the pool (or, with an endpoint selector, the EPP deployment)
// as upstream does; static mode names its synthetic pool.
func poolGKNN(opts *Options) (*common.GKNN, error) {
	ns := poolNamespace(opts.PoolNamespace)
	switch {
	case opts.StaticMode():
		return &common.GKNN{
			NamespacedName: types.NamespacedName{Namespace: ns, Name: staticPoolName},
			GroupKind:      schema.GroupKind{Group: opts.PoolGroup, Kind: "InferencePool"},
		}, nil
	case opts.PoolName != "":
		return &common.GKNN{
			NamespacedName: types.NamespacedName{Namespace: ns, Name: opts.PoolName},
			GroupKind:      schema.GroupKind{Group: opts.PoolGroup, Kind: "InferencePool"},
		}, nil
	case opts.EndpointSelector != "":
		podName := os.Getenv("POD_NAME")
		if podName == "" {
			return nil, errors.New("failed to get environment variable POD_NAME")
		}
		name, err := deploymentName(podName)
		if err != nil {
			return nil, err
		}
		return &common.GKNN{
			NamespacedName: types.NamespacedName{Namespace: ns, Name: name},
			GroupKind:      schema.GroupKind{Group: "apps", Kind: "Deployment"},
		}, nil
	}
	return nil, errors.New("can't construct gknn as both pool-name and endpoint-selector are missing")
}

var deploymentPodName = regexp.MustCompile(`^(.+)-[a-z0-9]+-[a-z0-9]+$`)

// deploymentName derives a Deployment's name from one of its pods' names.
func deploymentName(podName string) (string, error) {
	if m := deploymentPodName.FindStringSubmatch(podName); len(m) == 2 {
		return m[1], nil
	}
	return "", fmt.Errorf("failed to parse deployment name from pod name %s", podName)
}

// poolNamespace resolves the pool namespace: the flag, else NAMESPACE, else
// "default".
func poolNamespace(flagValue string) string {
	if flagValue != "" {
		return flagValue
	}
	if ns := os.Getenv("NAMESPACE"); ns != "" {
		return ns
	}
	return runserver.DefaultPoolNamespace
}

// endpointPoolFromSelector builds the pool for upstream's endpoint-selector
// (standalone) mode. It is named after the EPP's deployment and namespace:
// upstream v1.5.0 passes the (necessarily empty) --pool-name here and so
// refuses to start in this mode.
func endpointPoolFromSelector(namespace, name, selector string, ports []int) (*datalayer.EndpointPool, error) {
	if len(ports) == 0 {
		return nil, errors.New("endpoint target ports must not be empty")
	}
	sel, err := labels.ConvertSelectorToLabelsMap(selector)
	if err != nil {
		return nil, fmt.Errorf("failed to parse endpoint selector %q: %w", selector, err)
	}
	pool := datalayer.NewEndpointPool(namespace, name)
	pool.Selector = sel
	pool.TargetPorts = append(pool.TargetPorts, ports...)
	return pool, nil
}
