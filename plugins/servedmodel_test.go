package plugins

import (
	"testing"

	"github.com/go-logr/logr"
	k8stypes "k8s.io/apimachinery/pkg/types"

	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/config/loader"
	fwkdl "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/datalayer"
	fwkplugin "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/plugin"
	fwksched "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/scheduling"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/scheduling"
)

// modelServer is one endpoint of a pool whose servers serve different base models.
type modelServer struct {
	address, model string
	waiting        int
}

// scheduleWithDefaultProfile admits a request for model through Sluice admission and schedules it with Sluice's
// default profile, loaded by upstream's loader and run by upstream's scheduler, over servers. It returns the endpoint
// the scheduler picked, or "" with the scheduler's error.
func scheduleWithDefaultProfile(t *testing.T, servers []modelServer, model string) (string, error) {
	t.Helper()
	reg, err := Default()
	if err != nil {
		t.Fatal(err)
	}
	reg.InstallMissing()
	text, err := DefaultEndpointPickerConfig()
	if err != nil {
		t.Fatal(err)
	}
	raw, _, err := loader.LoadRawConfig([]byte(text), logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	handle := fwkplugin.NewEppHandle(t.Context(), func() []k8stypes.NamespacedName { return nil })
	cfg, err := loader.InstantiateAndConfigure(raw, handle, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}

	pool := &fakePool{}
	fc, clk := newTestFlowControl(t, nil, pool)
	var poolEndpoints []fwkdl.Endpoint
	var candidates []fwksched.Endpoint
	for _, s := range servers {
		ep := upstreamEndpoint(s.address, s.waiting, 0.1, clk.Now())
		poolEndpoints = append(poolEndpoints, ep)
		attrs := fwkdl.NewAttributes()
		attrs.Put(LoRAResidencyKey, &LoRAResidency{BaseModels: map[string]struct{}{s.model: {}}, ObservedAt: clk.Now()})
		candidates = append(candidates, fwksched.NewEndpoint(ep.GetMetadata(), ep.GetMetrics(), attrs))
	}
	pool.set(poolEndpoints...)
	if err := fc.SyncEndpoints(); err != nil {
		t.Fatal(err)
	}
	if fc.Attach(handle.GetAllPluginsWithNames()) != 1 {
		t.Fatal("the default profile's headroom filter was not attached")
	}
	const id = "req-1"
	if err := fc.Admit(t.Context(), requestContext(id, "tenant", 100, nil), 0); err != nil {
		t.Fatalf("admission: %v", err)
	}
	req := &fwksched.LLMRequest{RequestId: id, TargetModel: model, Headers: map[string]string{}, RequestSizeBytes: 100,
		Body: &fwksched.LLMRequestBody{Completions: &fwksched.CompletionsRequest{Prompt: fwksched.Prompt{Raw: "hello"}}}}
	result, err := scheduling.NewSchedulerWithConfig(cfg.SchedulerConfig).Schedule(t.Context(), req, candidates)
	if err != nil {
		return "", err
	}
	return EndpointName(result.ProfileResults[result.PrimaryProfileName].TargetEndpoints[0].GetMetadata()), nil
}

// TestDefaultProfileRoutesToServersOfTheRequestedModel: in a pool of two base models, a request goes to a server of
// its model even when only a server of the other model has headroom. Sluice admission dispatches on the pool's
// headroom, whatever the model, so the headroom filter alone would leave only the other model's server, which
// answers 404; the served-model filter must choose among the servers of the model first.
func TestDefaultProfileRoutesToServersOfTheRequestedModel(t *testing.T) {
	tests := []struct {
		name    string
		servers []modelServer
		model   string
		want    string
	}{
		{"only the other model's server has headroom",
			[]modelServer{{"10.0.0.1", "base", 50}, {"10.0.0.2", "other", 0}}, "base", "10.0.0.1:8000"},
		{"the requested model's server has headroom",
			[]modelServer{{"10.0.0.1", "base", 0}, {"10.0.0.2", "other", 50}}, "base", "10.0.0.1:8000"},
		{"among the model's servers, the one with headroom",
			[]modelServer{{"10.0.0.1", "base", 50}, {"10.0.0.2", "other", 0}, {"10.0.0.3", "base", 0}}, "base", "10.0.0.3:8000"},
		{"the other model likewise",
			[]modelServer{{"10.0.0.1", "base", 0}, {"10.0.0.2", "other", 50}}, "other", "10.0.0.2:8000"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := scheduleWithDefaultProfile(t, tt.servers, tt.model)
			if err != nil {
				t.Fatalf("scheduling failed: %v", err)
			}
			if got != tt.want {
				t.Errorf("a request for %q went to %s, want %s", tt.model, got, tt.want)
			}
		})
	}
}
