package runner

import (
	"context"
	"testing"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"

	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/datastore"
	fwkdl "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/datalayer"
	fwksched "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/scheduling"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/scheduling"
)

// FuzzEndpointPickerConfig feeds arbitrary --config-text through what the EPP does with it at startup, with Sluice's
// plugins registered: parse, feature gates, plugin instantiation (each plugin's parameters), data dependencies, the
// data layer and the scheduler. A configuration is either rejected with an error or yields a scheduler that, given a
// request parsed by the configured parser, picks among the candidate endpoints only. Seeds, in
// testdata/fuzz/FuzzEndpointPickerConfig, include Sluice's default profile and the benchmark configurations.
func FuzzEndpointPickerConfig(f *testing.F) {
	ctrl.SetLogger(logr.Discard())
	if err := installPlugins(); err != nil {
		f.Fatal(err)
	}
	ctx := ctrl.LoggerInto(context.Background(), logr.Discard())
	dl, err := newDataLayer(NewOptions(), map[string]bool{})
	if err != nil {
		f.Fatal(err)
	}
	ds := datastore.NewDatastore(ctx, dl.endpoints, 0) // configurations read its pod list only
	candidates := []fwksched.Endpoint{fuzzEndpoint("10.0.0.1"), fuzzEndpoint("10.0.0.2")}
	body := []byte(`{"model":"base","messages":[{"role":"user","content":"a prompt long enough to fill a block of tokens"}],"stream":true}`)
	f.Fuzz(func(t *testing.T, text []byte) {
		opts := NewOptions()
		opts.ConfigText = string(text)
		raw, gates, err := loadRawConfig(ctx, opts)
		if err != nil {
			return
		}
		dl, err := newDataLayer(opts, gates)
		if err != nil {
			return
		}
		cfg, _, parser, _, err := instantiateConfig(ctx, raw, ds)
		if err != nil {
			return
		}
		if err := dl.runtime.Configure(cfg.DataConfig, dl.newMetrics, disallowedExtractor(dl.newMetrics), logr.Discard()); err != nil {
			return
		}
		if cfg.SchedulerConfig == nil {
			return // setup refuses it
		}
		scheduler := scheduling.NewSchedulerWithConfig(cfg.SchedulerConfig)
		headers := map[string]string{":path": "/v1/chat/completions", "x-request-id": "fuzz", "content-type": "application/json"}
		parsed, err := parser.ParseRequest(ctx, body, headers)
		if err != nil {
			return
		}
		result, err := scheduler.Schedule(ctx, &fwksched.LLMRequest{RequestId: "fuzz", TargetModel: "base", Body: parsed, Headers: headers}, candidates)
		if err != nil {
			return
		}
		for name, profile := range result.ProfileResults {
			for _, ep := range profile.TargetEndpoints {
				if addr := ep.GetMetadata().GetIPAddress(); addr != "10.0.0.1" && addr != "10.0.0.2" {
					t.Fatalf("profile %q picked %q, not a candidate", name, addr)
				}
			}
		}
	})
}

func fuzzEndpoint(address string) fwksched.Endpoint {
	m := fwkdl.NewMetrics()
	m.WaitingQueueSize, m.KVCacheUsagePercent = 1, 0.2
	md := &fwkdl.EndpointMetadata{NamespacedName: types.NamespacedName{Namespace: "default", Name: address}, PodName: address,
		Address: address, Port: "8000"}
	return fwksched.NewEndpoint(md, m, fwkdl.NewAttributes())
}
