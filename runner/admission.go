package runner

import (
	"context"
	"fmt"

	"github.com/go-logr/logr"

	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/config"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/datastore"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/flowcontrol"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/flowcontrol/contracts"
	fccontroller "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/flowcontrol/controller"
	fcregistry "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/flowcontrol/registry"
	fwkfc "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/flowcontrol"
	fwkplugin "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/plugin"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/requestcontrol"

	"github.com/sluice-gw/sluice/flowcontrol/replication"
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
	// Replication is this replica's view of its peers when the EPP runs with --peers, --peers-file or
	// --peers-service (nil otherwise): admission should take only the endpoints it owns (View.Owned).
	Replication *replication.View
	// PeerExchange is this replica's side of the peer exchange, with Replication, unless --peer-exchange-interval is
	// 0 (nil then). An admission controller that takes it and implements PeerExchanger is sent and hears summaries.
	PeerExchange *replication.Exchange
}

// AdmissionFactory builds the admission controller the Director consults for
// every request. It is the seam where Sluice's queued admission plugs in.
//
// An admission controller that is also a plugin (fwkplugin.Plugin) takes part
// in the request lifecycle like a configured request-control plugin: its
// PreRequest, ResponseHeader and ResponseBody hooks run for every request, so
// it can follow what it admitted to the end without being declared in the
// EndpointPickerConfig.
//
// An admission controller that is also a controller-runtime
// manager.Runnable runs beside the EPP's gRPC servers, on every replica, from
// when they start until the EPP is told to stop, and the EPP waits for its
// Start to return before it exits (in Kubernetes mode, within the manager's
// graceful shutdown period): it can answer the requests still waiting in it
// while the servers drain.
type AdmissionFactory func(ctx context.Context, deps AdmissionDeps) (requestcontrol.AdmissionController, error)

// CandidateNarrower is an admission controller that narrows the endpoints the
// Director schedules a request among (plugins.FlowControl.NarrowCandidates):
// the runner hands the Director the narrowed candidates and puts each
// stream's request ID in its context (plugins.WithRequestID), so Locate knows
// the request admission decided.
type CandidateNarrower interface {
	NarrowCandidates(inner contracts.EndpointCandidates) contracts.EndpointCandidates
}

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
