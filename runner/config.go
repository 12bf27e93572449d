package runner

import (
	"context"
	"fmt"
	"os"

	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"

	configapi "sigs.k8s.io/gateway-api-inference-extension/apix/config/v1alpha1"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/config"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/config/loader"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/datalayer"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/datastore"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/flowcontrol"
	fwkdl "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/datalayer"
	fwkplugin "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/plugin"
	fwkrh "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/requesthandling"
	extractormetrics "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/datalayer/extractor/metrics"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/handlers"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/requestcontrol"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/util/env"
)

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
