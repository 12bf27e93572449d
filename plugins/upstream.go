package plugins

import (
	"fmt"
	"maps"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/utils/clock"

	fwkplugin "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/plugin"
	extractormetrics "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/datalayer/extractor/metrics"
	sourcemetrics "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/datalayer/source/metrics"
	sourcenotifications "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/datalayer/source/notifications"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/flowcontrol/fairness"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/flowcontrol/ordering"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/flowcontrol/saturationdetector/concurrency"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/flowcontrol/saturationdetector/utilization"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/flowcontrol/usagelimits"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/requestcontrol/admitter/latencyslo"
	reqdataprodprefix "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/requestcontrol/dataproducer/approximateprefix"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/requestcontrol/requestattributereporter"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/requestcontrol/requestdataproducer/inflightload"
	latencyproducer "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/requestcontrol/requestdataproducer/predictedlatency"
	testresponsereceived "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/requestcontrol/test/responsereceived"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/requesthandling/parsers/openai"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/requesthandling/parsers/passthrough"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/requesthandling/parsers/vllmgrpc"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/scheduling/filter/prefixcacheaffinity"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/scheduling/filter/sloheadroomtier"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/scheduling/picker"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/scheduling/profile"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/scheduling/scorer/kvcacheutilization"
	latencyscorer "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/scheduling/scorer/latency"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/scheduling/scorer/loraaffinity"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/scheduling/scorer/predictedlatency"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/scheduling/scorer/prefix"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/scheduling/scorer/queuedepth"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/scheduling/scorer/runningrequests"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/scheduling/scorer/tokenload"
	testfilter "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/scheduling/test/filter"

	"github.com/sluice-gw/sluice/lora"
	"github.com/sluice-gw/sluice/outlier"
	"github.com/sluice-gw/sluice/prefixcache"
)

// upstreamInTree lists every plugin type that upstream's v1.5.0 EPP runner
// (cmd/epp/runner.registerInTreePlugins) registers, under upstream's own names,
// so that any upstream EndpointPickerConfig loads unchanged. The list cannot be
// imported (upstream keeps it in an unexported method); a test compares it with
// upstream's source so a version bump cannot drop one silently.
var upstreamInTree = map[string]fwkplugin.FactoryFunc{
	prefix.PrefixCacheScorerPluginType:                         prefix.PrefixCachePluginFactory,
	picker.MaxScorePickerType:                                  picker.MaxScorePickerFactory,
	picker.RandomPickerType:                                    picker.RandomPickerFactory,
	picker.WeightedRandomPickerType:                            picker.WeightedRandomPickerFactory,
	profile.SingleProfileHandlerType:                           profile.SingleProfileHandlerFactory,
	kvcacheutilization.KvCacheUtilizationScorerType:            kvcacheutilization.KvCacheUtilizationScorerFactory,
	queuedepth.QueueScorerType:                                 queuedepth.QueueScorerFactory,
	runningrequests.RunningRequestsSizeScorerType:              runningrequests.RunningRequestsSizeScorerFactory,
	loraaffinity.LoraAffinityScorerType:                        loraaffinity.LoraAffinityScorerFactory,
	tokenload.TokenLoadScorerType:                              tokenload.TokenLoadScorerFactory,
	fairness.GlobalStrictFairnessPolicyType:                    fairness.GlobalStrictFairnessPolicyFactory,
	fairness.RoundRobinFairnessPolicyType:                      fairness.RoundRobinFairnessPolicyFactory,
	ordering.FCFSOrderingPolicyType:                            ordering.FCFSOrderingPolicyFactory,
	ordering.EDFOrderingPolicyType:                             ordering.EDFOrderingPolicyFactory,
	ordering.SLODeadlineOrderingPolicyType:                     ordering.SLODeadlineOrderingPolicyFactory,
	usagelimits.StaticUsageLimitPolicyType:                     usagelimits.StaticPolicyFactory,
	reqdataprodprefix.ApproxPrefixCachePluginType:              reqdataprodprefix.ApproxPrefixCacheFactory,
	predictedlatency.PredictedLatencyPluginType:                predictedlatency.PredictedLatencyFactory,
	latencyproducer.LatencyDataProviderPluginType:              latencyproducer.PredictedLatencyFactory,
	latencyslo.LatencyAdmissionPluginType:                      latencyslo.LatencyAdmissionFactory,
	prefixcacheaffinity.PluginType:                             prefixcacheaffinity.Factory,
	sloheadroomtier.PluginType:                                 sloheadroomtier.Factory,
	latencyscorer.LatencyScorerType:                            latencyscorer.Factory,
	inflightload.InFlightLoadProducerType:                      inflightload.InFlightLoadProducerFactory,
	testfilter.HeaderBasedTestingFilterType:                    testfilter.HeaderBasedTestingFilterFactory,
	testresponsereceived.DestinationEndpointServedVerifierType: testresponsereceived.DestinationEndpointServedVerifierFactory,
	sourcemetrics.MetricsDataSourceType:                        sourcemetrics.MetricsDataSourceFactory,
	extractormetrics.MetricsExtractorType:                      extractormetrics.CoreMetricsExtractorFactory,
	sourcenotifications.NotificationSourceType:                 sourcenotifications.NotificationSourceFactory,
	sourcenotifications.EndpointNotificationSourceType:         sourcenotifications.EndpointSourceFactory,
	requestattributereporter.RequestAttributeReporterType:      requestattributereporter.RequestAttributeReporterPluginFactory,
	openai.OpenAIParserType:                                    openai.OpenAIParserPluginFactory,
	vllmgrpc.VllmGRPCParserType:                                vllmgrpc.VllmGRPCParserPluginFactory,
	passthrough.PassthroughParserType:                          passthrough.PassthroughParserPluginFactory,
	concurrency.ConcurrencyDetectorType:                        concurrency.ConcurrencyDetectorFactory,
	utilization.UtilizationDetectorType:                        utilization.UtilizationDetectorFactory,
}

// sluicePlugins lists Sluice's own plugin types. Every name starts with
// "sluice-" so it can never collide with an upstream type.
var sluicePlugins = map[string]fwkplugin.FactoryFunc{
	LoRAAffinityType:           LoRAAffinityFactory,
	LoRAResidencyExtractorType: LoRAResidencyExtractorFactory,
	PrefixCacheType:            PrefixCacheFactory,
	HeadroomFilterType:         HeadroomFilterFactory,
	ServedModelFilterType:      ServedModelFilterFactory,
	OpenAIParserType:           OpenAIParserFactory,
	InFlightScorerType:         InFlightScorerFactory,
	SaturationScorerType:       SaturationScorerFactory,
	RoundRobinPickerType:       RoundRobinPickerFactory,
	OutlierFilterType:          OutlierFilterFactory,
	MetricsSourceType:          MetricsSourceFactory,
}

// Default returns a Registry holding every upstream in-tree plugin type and
// every Sluice plugin type, without metrics.
func Default() (*Registry, error) { return DefaultWithMetrics(nil) }

// DefaultWithMetrics is Default whose Sluice prefix-cache and LoRA-affinity
// scorers and outlier filter report to reg (sluice_prefixcache_*,
// sluice_lora_*, sluice_outlier_*): the EPP passes
// the registry its /metrics serves. A nil reg means no metrics.
func DefaultWithMetrics(reg prometheus.Registerer) (*Registry, error) {
	sluice := maps.Clone(sluicePlugins)
	if reg != nil {
		loraRec, err := lora.NewPrometheusRecorder(reg)
		if err != nil {
			return nil, fmt.Errorf("registering LoRA affinity metrics: %w", err)
		}
		prefixRec, err := prefixcache.NewPrometheusRecorder(reg)
		if err != nil {
			return nil, fmt.Errorf("registering prefix cache metrics: %w", err)
		}
		outlierRec, err := outlier.NewPrometheusRecorder(reg)
		if err != nil {
			return nil, fmt.Errorf("registering outlier detection metrics: %w", err)
		}
		sluice[LoRAAffinityType] = NewLoRAAffinityFactory(loraRec, clock.RealClock{})
		sluice[OutlierFilterType] = NewOutlierFilterFactory(outlierRec)
		sluice[PrefixCacheType] = NewPrefixCacheFactory(prefixRec, clock.RealClock{})
	}
	r := NewRegistry()
	for _, set := range []map[string]fwkplugin.FactoryFunc{upstreamInTree, sluice} {
		for t, f := range set {
			if err := r.Register(t, f); err != nil {
				return nil, err
			}
		}
	}
	return r, nil
}
