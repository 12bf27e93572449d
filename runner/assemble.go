package runner

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/http/pprof"
	goruntime "runtime"
	"slices"
	"sync/atomic"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"sigs.k8s.io/gateway-api-inference-extension/pkg/common"
	backendmetrics "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/backend/metrics"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/config"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/datalayer"
	datalayerlogger "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/datalayer/logger"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/datastore"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/flowcontrol"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/flowcontrol/contracts"
	fwkplugin "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/plugin"
	fwkrh "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/requesthandling"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/handlers"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/requestcontrol"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/scheduling"
	runserver "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/server"

	"github.com/sluice-gw/sluice/flowcontrol/replication"
	"github.com/sluice-gw/sluice/plugins/decisiontrace"
)

// The steps of Runner.setup, in the order it takes them.

// dataLayer is the metrics pipeline endpoints are created with: upstream's
// data layer runtime, or, with the legacy metrics feature gate, its pod
// metrics factory.
type dataLayer struct {
	runtime    *datalayer.Runtime
	endpoints  datalayer.EndpointFactory
	newMetrics bool
}

func newDataLayer(opts *Options, featureGates map[string]bool) (*dataLayer, error) {
	useNewMetrics := !featureGates[datalayer.EnableLegacyMetricsFeatureGate] || featureGates[datalayer.ExperimentalDatalayerFeatureGate]
	dlRuntime := datalayer.NewRuntime(opts.RefreshMetricsInterval)
	dl := &dataLayer{runtime: dlRuntime, endpoints: dlRuntime, newMetrics: useNewMetrics}
	if !useNewMetrics {
		pmc, err := backendmetrics.NewPodMetricsClientImpl(setupLog, backendmetrics.Config{
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
		dl.endpoints = backendmetrics.NewPodMetricsFactory(pmc, opts.RefreshMetricsInterval)
	}
	return dl, nil
}

// kubernetes is what Kubernetes mode connects with; nil in static mode.
type kubernetes struct {
	restConfig    *rest.Config
	controllerCfg runserver.ControllerConfig
}

// newDatastore creates the datastore, whose endpoints' metrics are collected
// until ctx ends, and, in Kubernetes mode, the connection to the API server. Static endpoints are loaded later (startDataLayer): an
// endpoint added before the data layer is configured gets no metrics
// collector.
func (r *Runner) newDatastore(ctx context.Context, opts *Options, epf datalayer.EndpointFactory, gknn common.GKNN) (datastore.Datastore, *kubernetes, error) {
	// Each endpoint's collector takes its logger from this context, and upstream's extractor derives one with the
	// endpoint's name at every poll (every 50 ms per endpoint) for a line written only at -v=5.
	ctx = withHeldValues(ctx)
	if opts.StaticMode() {
		return datastore.NewDatastore(ctx, epf, int32(opts.ModelServerMetricsPort)), nil, nil
	}
	kube := &kubernetes{restConfig: r.restConfig}
	if kube.restConfig == nil {
		var err error
		if kube.restConfig, err = ctrl.GetConfig(); err != nil {
			return nil, nil, fmt.Errorf("failed to get Kubernetes rest config: %w", err)
		}
	}
	startCrdReconcilers := opts.EndpointSelector == ""
	kube.controllerCfg = runserver.NewControllerConfig(startCrdReconcilers)
	if err := kube.controllerCfg.PopulateControllerConfig(kube.restConfig); err != nil {
		return nil, nil, fmt.Errorf("failed to populate controller config: %w", err)
	}
	ds := datastore.NewDatastore(ctx, epf, int32(opts.ModelServerMetricsPort))
	if !startCrdReconcilers {
		pool, err := endpointPoolFromSelector(gknn.Namespace, gknn.Name, opts.EndpointSelector, opts.EndpointTargetPorts)
		if err != nil {
			return nil, nil, err
		}
		ds = ds.WithEndpointPool(pool)
	}
	return ds, kube, nil
}

// newProcess creates the controller-runtime manager, extended by the
// ManagerSetups' Options, in Kubernetes mode (and follows its leader
// election into isLeader), or the metrics server alone in static mode. The
// metrics server serves the profiles and, when on, the decision trace.
func (r *Runner) newProcess(ctx context.Context, opts *Options, gknn common.GKNN, kube *kubernetes, isLeader *atomic.Bool,
	decisions *decisiontrace.Recorder) (*process, error) {
	metricsOpts := metricsserver.Options{
		BindAddress:   fmt.Sprintf(":%d", opts.MetricsPort),
		ExtraHandlers: pprofHandlers(opts.EnablePprof),
	}
	if decisions != nil {
		if metricsOpts.ExtraHandlers == nil {
			metricsOpts.ExtraHandlers = map[string]http.Handler{}
		}
		metricsOpts.ExtraHandlers[DecisionTracePath] = decisions
	}
	if opts.MetricsEndpointAuth {
		metricsOpts.FilterProvider = filters.WithAuthenticationAndAuthorization
	}
	p := &process{}
	if kube == nil {
		ms, err := metricsserver.NewServer(metricsOpts, nil, nil)
		if err != nil {
			return nil, err
		}
		p.runnables = append(p.runnables, ms)
		return p, nil
	}
	var optionErrs []error
	extendOptions := func(o *ctrl.Options) {
		promptInformers(o)
		if opts.PeersService != "" {
			peersCache(o, gknn.Namespace, opts.PeersService)
		}
		for _, s := range r.managerSetups {
			if s.Options != nil {
				optionErrs = append(optionErrs, s.Options(o, gknn))
			}
		}
	}
	var err error
	p.mgr, err = runserver.NewDefaultManager(kube.controllerCfg, gknn, kube.restConfig, metricsOpts, opts.EnableLeaderElection, extendOptions)
	if err := errors.Join(optionErrs...); err != nil {
		return nil, fmt.Errorf("extending the controller manager's options: %w", err)
	}
	if err != nil {
		return nil, err
	}
	if opts.EnableLeaderElection {
		setupLog.Info("Leader election enabled")
		go func() {
			select {
			case <-p.mgr.Elected():
				isLeader.Store(true)
				setupLog.Info("This instance is now the leader!")
			case <-ctx.Done():
			}
		}()
	}
	return p, nil
}

// startDataLayer configures the data layer's sources and extractors and
// starts its Kubernetes notifications (none can run in static mode); in
// static mode it then loads the static endpoints.
func (r *Runner) startDataLayer(ctx context.Context, opts *Options, p *process, dl *dataLayer, cfg *datalayer.Config, ds datastore.Datastore, namespace string) error {
	if err := dl.runtime.Configure(cfg, dl.newMetrics, disallowedExtractor(dl.newMetrics), setupLog); err != nil {
		return fmt.Errorf("failed to initialize data layer: %w", err)
	}
	if p.mgr != nil {
		if err := dl.runtime.Start(ctx, p.mgr); err != nil {
			return fmt.Errorf("failed to start data layer: %w", err)
		}
	} else if src := notificationSource(cfg); src != "" {
		return fmt.Errorf("data source %q watches Kubernetes objects and cannot run in static mode", src)
	}
	if opts.StaticMode() {
		staticRunner, err := r.startStatic(ctx, opts, ds, namespace)
		if err != nil {
			return err
		}
		p.runnables = append(p.runnables, staticRunner)
	}
	return nil
}

// requestPath is what handles each request: the Director (admission,
// scheduling, request-control plugins) behind the parser and the model
// selector (nil when none is installed).
type requestPath struct {
	admission requestcontrol.AdmissionController
	director  handlers.Director
	parser    fwkrh.Parser
	selector  ModelSelector
	decisions *decisiontrace.Recorder // nil when the decision trace is off
	// narrowing: the admission controller narrows the Director's candidates, by request ID (plugins.WithRequestID).
	narrowing bool
	// peers is the admission controller when it takes part in the peer exchange (nil otherwise), view the replica's
	// view of its peers.
	peers PeerExchanger
	view  *replication.View
	// hot reports Sluice's hot path (WithHotPath): the Director is a hotDirector.
	hot bool
}

// newRequestPath builds the admission controller (a plugin one joins the
// request-control plugins), the model selector and the Director.
func (r *Runner) newRequestPath(ctx context.Context, opts *Options, gknn common.GKNN, ds datastore.Datastore, featureGates map[string]bool,
	eppConfig *config.Config, rcConfig *requestcontrol.Config, configured map[string]fwkplugin.Plugin, scheduler *scheduling.Scheduler, parser fwkrh.Parser,
	view *replication.View, exchange *replication.Exchange) (*requestPath, error) {
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
		Logger:             setupLog,
		Plugins:            configured,
		Replication:        view,
		PeerExchange:       exchange,
	})
	if err != nil {
		return nil, err
	}
	requestPlugins := slices.Collect(maps.Values(configured))
	if p, ok := admission.(fwkplugin.Plugin); ok {
		rcConfig.AddPlugins(p)
		requestPlugins = append(requestPlugins, p)
	}
	path := &requestPath{admission: admission, parser: parser, hot: r.hotPath != nil && r.hotPath(opts)}
	if x, ok := admission.(PeerExchanger); ok && exchange != nil {
		path.peers, path.view = x, view
	}
	if r.modelSelector != nil {
		if path.selector, err = r.modelSelector(ctx, ModelSelectorDeps{Options: opts, Pool: gknn, Logger: ctrl.Log.WithName("model-selector")}); err != nil {
			return nil, err
		}
	}
	var directorStore requestcontrol.Datastore = ds
	if path.selector != nil {
		directorStore = withoutUpstreamRewrites{ds}
	}
	directorCandidates := endpointCandidates
	if n, ok := admission.(CandidateNarrower); ok {
		directorCandidates, path.narrowing = n.NarrowCandidates(endpointCandidates), true
	}
	directorAdmission := admission
	if path.selector != nil {
		directorAdmission = joinedBodyReleasingAdmission{admission}
	}
	director := requestcontrol.NewDirectorWithConfig(directorStore, scheduler, directorAdmission, parser, directorCandidates, rcConfig)
	path.director = director
	if path.hot {
		chunks, observers := chunkInterestOf(requestPlugins)
		hot := &hotDirector{Director: director, chunks: chunks, observers: observers}
		if screen, ok := parser.(usageScreen); ok && chunks != chunksEvery {
			hot.screen = screen
		}
		path.director = hot
	}
	return path, nil
}

// extendManager registers upstream's reconcilers and then the ManagerSetups'
// Setup functions with the manager.
func (r *Runner) extendManager(mgr manager.Manager, gknn common.GKNN, ds datastore.Datastore, kube *kubernetes) error {
	reconcilers := &runserver.ExtProcServerRunner{GKNN: gknn, Datastore: ds, ControllerCfg: kube.controllerCfg}
	if err := reconcilers.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("failed to setup EPP controllers: %w", err)
	}
	for _, s := range r.managerSetups {
		if s.Setup == nil {
			continue
		}
		if err := s.Setup(mgr, gknn); err != nil {
			return fmt.Errorf("extending the controller manager: %w", err)
		}
	}
	return nil
}

// servers returns the health and ext_proc gRPC servers, upstream's periodic
// pool metrics summary and, if it is a runnable, the admission controller.
func (r *Runner) servers(ctx context.Context, opts *Options, ds datastore.Datastore, req *requestPath, isLeader *atomic.Bool, useNewMetrics bool) ([]manager.Runnable, error) {
	extProc, err := r.extProcServer(ctx, opts, ds, req)
	if err != nil {
		return nil, err
	}
	healthSrv := grpc.NewServer()
	healthStopping := make(chan struct{}) // closed as the health server stops: ends the peers' streams (peerReceiver)
	healthpb.RegisterHealthServer(healthSrv, &healthServer{
		logger:                ctrl.Log.WithName("health"),
		pool:                  ds,
		isLeader:              isLeader,
		leaderElectionEnabled: opts.EnableLeaderElection,
	})
	if req.peers != nil {
		traffic, err := exchangeTraffic()
		if err != nil {
			return nil, fmt.Errorf("registering the peer exchange's metrics: %w", err)
		}
		healthSrv.RegisterService(&peerExchangeDesc, &peerReceiver{view: req.view, admission: req.peers, clock: r.clock,
			logger: ctrl.Log.WithName("replication"), traffic: traffic, stopping: healthStopping})
	}
	servers := []manager.Runnable{
		&grpcServer{name: "health", server: healthSrv, port: opts.GRPCHealthPort, gracePeriod: r.shutdownGrace, logger: ctrl.Log.WithName("health"),
			stopping: healthStopping},
		&grpcServer{name: "ext-proc", server: extProc, port: opts.GRPCPort, gracePeriod: r.shutdownGrace, logger: ctrl.Log.WithName("ext-proc")},
		manager.RunnableFunc(func(ctx context.Context) error {
			// Upstream logs a periodic metrics summary of the pool.
			startMetricsLogger(ctx, ds, opts, useNewMetrics)
			<-ctx.Done()
			return nil
		}),
	}
	if admission, ok := req.admission.(manager.Runnable); ok {
		// Joined like the servers: the process does not exit before it has answered what waits in it.
		servers = append(servers, everyReplica{admission})
	}
	return servers, nil
}

// everyReplica runs a runnable on every replica, as the gRPC servers run,
// not only on the elected leader.
type everyReplica struct{ manager.Runnable }

// NeedLeaderElection implements manager.LeaderElectionRunnable.
func (everyReplica) NeedLeaderElection() bool { return false }

// extProcServer builds the ext_proc gRPC server: upstream's streaming server
// behind Sluice's model selector (may be nil) and response shapers, with
// upstream's TLS and health options; on the hot path it decodes with
// extProcCodec.
func (r *Runner) extProcServer(ctx context.Context, opts *Options, ds datastore.Datastore, req *requestPath) (*grpc.Server, error) {
	var serverOpts []grpc.ServerOption
	if opts.SecureServing {
		creds, err := serverCredentials(ctx, opts.CertPath, opts.EnableCertReload)
		if err != nil {
			return nil, err
		}
		serverOpts = append(serverOpts, grpc.Creds(creds))
	}
	codec := encoding.GetCodecV2(grpcproto.Name) // what gRPC picks for the proxy's messages
	if req.hot {
		codec = newExtProcCodec()
		serverOpts = append(serverOpts, grpc.ForceServerCodecV2(codec))
	}
	serverOpts = append(serverOpts, grpc.MaxRecvMsgSize(maxExtProcMessageBytes(opts.ModelSelectionMaxBodyBytes)))
	srv := grpc.NewServer(serverOpts...)
	handler := &shapingServer{
		upstream:     handlers.NewStreamingServer(ds, req.director, req.parser),
		shapers:      r.shapers,
		selector:     req.selector,
		maxBodyBytes: opts.ModelSelectionMaxBodyBytes,
		clock:        r.clock,
		decisions:    req.decisions,
		requestIDs:   req.narrowing,
		hot:          req.hot,
		wireChunks:   req.hot, // the server's codec is extProcCodec
	}
	if opts.ResponseObserverWait > 0 {
		recorder, err := responseObserverCounter()
		if err != nil {
			return nil, err
		}
		handler.observers = newObserverJoin(opts.ResponseObserverWait, recorder)
	}
	if r.extProcHandler != nil {
		r.extProcHandler(handler, codec)
	}
	extprocv3.RegisterExternalProcessorServer(srv, handler)
	if opts.HealthChecking {
		hc := health.NewServer()
		healthpb.RegisterHealthServer(srv, hc)
		hc.SetServingStatus(extprocv3.ExternalProcessor_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	}
	return srv, nil
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
