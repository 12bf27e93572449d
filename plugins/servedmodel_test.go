package plugins

import (
	"context"
	"testing"

	"github.com/go-logr/logr"
	k8stypes "k8s.io/apimachinery/pkg/types"

	configapi "sigs.k8s.io/gateway-api-inference-extension/apix/config/v1alpha1"
	eppconfig "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/config"
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

// defaultProfilePool is Sluice's default profile, loaded by upstream's loader, with Sluice admission attached, over a
// pool of model servers.
type defaultProfilePool struct {
	raw        *configapi.EndpointPickerConfig
	plugins    map[string]fwkplugin.Plugin
	scheduler  *scheduling.Scheduler
	fc         *FlowControl
	candidates []fwksched.Endpoint
}

// loadEndpointPickerConfig installs Sluice's plugins in upstream's registry and loads config ("" for upstream's
// default) as the EPP does, with upstream's loader.
func loadEndpointPickerConfig(t testing.TB, config string) (*configapi.EndpointPickerConfig, fwkplugin.Handle, *eppconfig.Config) {
	t.Helper()
	reg, err := Default()
	if err != nil {
		t.Fatal(err)
	}
	reg.InstallMissing()
	raw, _, err := loader.LoadRawConfig([]byte(config), logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	handle := fwkplugin.NewEppHandle(t.Context(), func() []k8stypes.NamespacedName { return nil })
	cfg, err := loader.InstantiateAndConfigure(raw, handle, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	return raw, handle, cfg
}

func newDefaultProfilePool(t testing.TB, servers []modelServer) *defaultProfilePool {
	t.Helper()
	text, err := DefaultEndpointPickerConfig()
	if err != nil {
		t.Fatal(err)
	}
	raw, handle, cfg := loadEndpointPickerConfig(t, text)
	p := &defaultProfilePool{raw: raw, plugins: handle.GetAllPluginsWithNames(), scheduler: scheduling.NewSchedulerWithConfig(cfg.SchedulerConfig)}
	pool := &fakePool{}
	fc, clk := newTestFlowControl(t, nil, pool)
	var poolEndpoints []fwkdl.Endpoint
	for _, s := range servers {
		ep := upstreamEndpoint(s.address, s.waiting, 0.1, clk.Now())
		poolEndpoints = append(poolEndpoints, ep)
		attrs := fwkdl.NewAttributes()
		attrs.Put(LoRAResidencyKey, &LoRAResidency{BaseModels: map[string]struct{}{s.model: {}}, ObservedAt: clk.Now()})
		p.candidates = append(p.candidates, fwksched.NewEndpoint(ep.GetMetadata(), ep.GetMetrics(), attrs))
	}
	pool.set(poolEndpoints...)
	if err := fc.SyncEndpoints(); err != nil {
		t.Fatal(err)
	}
	if fc.Attach(p.plugins) != 1 {
		t.Fatal("the default profile's headroom filter was not attached")
	}
	p.fc = fc
	return p
}

// route admits request id for model through Sluice admission and schedules it with scheduler, all with ctx. It
// returns the endpoint the scheduler picked, or the scheduler's error.
func (p *defaultProfilePool) route(ctx context.Context, t testing.TB, scheduler *scheduling.Scheduler, id, model string) (string, error) {
	t.Helper()
	reqCtx := requestContext(id, "tenant", 100, nil)
	reqCtx.TargetModelName = model
	if err := p.fc.Admit(ctx, reqCtx, 0); err != nil {
		t.Fatalf("admission: %v", err)
	}
	req := &fwksched.LLMRequest{RequestId: id, TargetModel: model, Headers: map[string]string{}, RequestSizeBytes: 100,
		Body: &fwksched.LLMRequestBody{Completions: &fwksched.CompletionsRequest{Prompt: fwksched.Prompt{Raw: "hello"}}}}
	result, err := scheduler.Schedule(ctx, req, p.candidates)
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
			p := newDefaultProfilePool(t, tt.servers)
			got, err := p.route(t.Context(), t, p.scheduler, "req-1", tt.model)
			if err != nil {
				t.Fatalf("scheduling failed: %v", err)
			}
			if got != tt.want {
				t.Errorf("a request for %q went to %s, want %s", tt.model, got, tt.want)
			}
		})
	}
}
