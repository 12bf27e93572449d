package plugins

import (
	"context"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	configapi "sigs.k8s.io/gateway-api-inference-extension/apix/config/v1alpha1"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/config/loader"
	fwkplugin "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/plugin"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/handlers"
	eppmetrics "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/metrics"
	runserver "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/server"

	"github.com/sluice-gw/sluice/flowcontrol"
)

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestLoadFlowControlConfig(t *testing.T) {
	yamlPolicy := writeFile(t, "policy.yaml", `
priorityMapping:
  sheddableMaxPriority: 0
  criticalMinPriority: 10
bands:
  standard:
    maxQueueTime: 3s
tenants:
- name: batch
  maxBand: Sheddable
`)
	cfg, err := LoadFlowControlConfig(yamlPolicy)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.BandFor(0) != flowcontrol.Sheddable || cfg.BandFor(10) != flowcontrol.Critical ||
		cfg.Bands[flowcontrol.Standard].MaxQueueTime != 3*time.Second || cfg.Tenants["batch"].MaxBand != flowcontrol.Sheddable {
		t.Fatalf("YAML policy not applied: %+v", cfg)
	}
	jsonPolicy := writeFile(t, "policy.json", `{"endpoint":{"queueDepthThreshold":9}}`)
	if cfg, err := LoadFlowControlConfig(jsonPolicy); err != nil || cfg.Endpoint.QueueDepth != 9 {
		t.Fatalf("JSON policy: %v %+v", err, cfg)
	}
	if cfg, err := LoadFlowControlConfig(writeFile(t, "empty.yaml", "")); err != nil || cfg.Endpoint.QueueDepth != flowcontrol.DefaultQueueDepthThreshold {
		t.Fatalf("empty policy must mean defaults: %v", err)
	}
	for name, content := range map[string]string{
		"unknown field": "bandz: {}\n",
		"invalid value": "endpoint:\n  queueDepthThreshold: -1\n",
		"not YAML":      "bands: [\n",
	} {
		if _, err := LoadFlowControlConfig(writeFile(t, "bad.yaml", content)); err == nil || !strings.Contains(err.Error(), "--flow-control-config") {
			t.Errorf("%s: err = %v, want an error naming the flag", name, err)
		}
	}
	if _, err := LoadFlowControlConfig(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Error("a missing file was accepted")
	}
}

// TestDefaultEndpointPickerConfig checks Sluice's default profile as upstream's loader reads it: the served-model
// filter, then the headroom filter, schedule first, the scorers carry their documented weights, and the residency
// extractor and the parser that reads cached tokens are wired, so the profile is what its documentation says.
func TestDefaultEndpointPickerConfig(t *testing.T) {
	text, err := DefaultEndpointPickerConfig()
	if err != nil {
		t.Fatal(err)
	}
	raw, _, err := loader.LoadRawConfig([]byte(text), logr.Discard())
	if err != nil {
		t.Fatalf("upstream's loader rejects the default configuration: %v\n%s", err, text)
	}
	if len(raw.SchedulingProfiles) != 1 {
		t.Fatalf("profiles = %+v, want one", raw.SchedulingProfiles)
	}
	prof := raw.SchedulingProfiles[0].Plugins
	if len(prof) < 3 || prof[0].PluginRef != ServedModelFilterType || prof[1].PluginRef != OutlierFilterType ||
		prof[2].PluginRef != HeadroomFilterType {
		t.Errorf("profile = %+v, want %s, %s, then %s (see TestDefaultProfileRoutesToServersOfTheRequestedModel and "+
			"TestDefaultProfileLeavesAFailingServer)", prof, ServedModelFilterType, OutlierFilterType, HeadroomFilterType)
	}
	weights := map[string]float64{}
	for _, p := range prof {
		if p.Weight != nil {
			weights[p.PluginRef] = *p.Weight
		}
	}
	want := map[string]float64{SaturationScorerType: 2, "queue-scorer": 2, "kv-cache-utilization-scorer": 2, PrefixCacheType: 4,
		LoRAAffinityType: 3}
	if !maps.Equal(weights, want) {
		t.Errorf("scorer weights = %v, want %v", weights, want)
	}
	if raw.Parser == nil || raw.Parser.PluginRef != OpenAIParserType {
		t.Errorf("parser = %+v, want %s", raw.Parser, OpenAIParserType)
	}
	if raw.DataLayer == nil || len(raw.DataLayer.Sources) != 1 || !slices.ContainsFunc(raw.DataLayer.Sources[0].Extractors,
		func(e configapi.DataLayerExtractor) bool { return e.PluginRef == LoRAResidencyExtractorType }) {
		t.Errorf("data layer = %+v, want the metrics source with %s", raw.DataLayer, LoRAResidencyExtractorType)
	}
}

func TestFlowControlCommandFlags(t *testing.T) {
	tests := []struct {
		name        string
		args        []string
		configText  string
		wantEnabled bool
		wantDefault bool // DefaultEndpointPickerConfig selected
		wantErr     string
	}{
		{"off by default: upstream behaviour", nil, "", false, false, ""},
		{"--sluice-admission turns it on with the Sluice default profile", []string{"--sluice-admission"}, "", true, true, ""},
		{"a policy file turns it on", []string{"--flow-control-config=POLICY"}, "", true, true, ""},
		{"a given EndpointPickerConfig is kept", []string{"--sluice-admission"}, "kind: EndpointPickerConfig", true, false, ""},
		{"a bad policy fails at startup", []string{"--flow-control-config=BAD"}, "", true, false, "queueDepthThreshold"},
		{"negative output tokens fail", []string{"--sluice-admission", "--flow-control-default-output-tokens=-1"}, "", true, false, "output tokens"},
	}
	policy := writeFile(t, "p.yaml", "bands: {standard: {maxQueueTime: 1s}}\n")
	bad := writeFile(t, "bad.yaml", "endpoint: {queueDepthThreshold: 0}\n")
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := NewFlowControlCommand()
			fs := pflag.NewFlagSet("epp", pflag.ContinueOnError)
			c.AddFlags(fs)
			args := make([]string, len(tt.args))
			for i, a := range tt.args {
				args[i] = strings.NewReplacer("POLICY", policy, "BAD", bad).Replace(a)
			}
			if err := fs.Parse(args); err != nil {
				t.Fatal(err)
			}
			if c.Enabled() != tt.wantEnabled {
				t.Fatalf("Enabled = %v", c.Enabled())
			}
			opts := runserver.NewOptions()
			opts.ConfigText = tt.configText
			err := c.Complete(opts)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Complete = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if gotDefault := strings.Contains(opts.ConfigText, HeadroomFilterType); gotDefault != tt.wantDefault {
				t.Fatalf("ConfigText = %q, want the Sluice default: %v", opts.ConfigText, tt.wantDefault)
			}
		})
	}
}

func TestFlowControlCommandStart(t *testing.T) {
	c := NewFlowControlCommand()
	fs := pflag.NewFlagSet("epp", pflag.ContinueOnError)
	c.AddFlags(fs)
	ir := &extprocv3.ImmediateResponse{}
	c.ShapeImmediateResponse(context.Background(), "id", ir)
	if ir.Headers != nil {
		t.Fatal("the shaper acted before Start")
	}
	if _, err := c.Start(context.Background(), FlowControlEnv{Endpoints: &fakePool{}}); err == nil {
		t.Fatal("Start succeeded with Sluice admission off")
	}
	if err := fs.Parse([]string{"--sluice-admission", "--flow-control-warmup=1ms"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Start(context.Background(), FlowControlEnv{Endpoints: &fakePool{}}); err == nil {
		t.Fatal("Start succeeded before Complete")
	}
	if err := c.Complete(runserver.NewOptions()); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	filter := mustHeadroomFilter(t)
	fc, err := c.Start(ctx, FlowControlEnv{
		Endpoints:       &fakePool{},
		Plugins:         map[string]fwkplugin.Plugin{"h": filter},
		RefreshInterval: 20 * time.Millisecond,
		Registerer:      reg,
	})
	if err != nil {
		t.Fatal(err)
	}
	if filter.source.Load() != fc || fc.opts.SnapshotInterval != 20*time.Millisecond {
		t.Fatal("Start did not attach the filter or take the refresh interval")
	}
	if _, err := c.Start(ctx, FlowControlEnv{Endpoints: &fakePool{}}); err == nil {
		t.Fatal("second Start succeeded")
	}
	// The shaper now delegates: an unknown request is left alone, a rejected one is shaped.
	err = fc.Admit(context.Background(), requestContext("r", "t", 10, nil), 0) // no endpoints: 503
	if err == nil {
		t.Fatal("admitted with no endpoints")
	}
	c.ShapeImmediateResponse(context.Background(), "r", ir)
	if answerOf(ir).headers[ShedReasonHeader] != "no_endpoints" {
		t.Fatalf("shaper did not delegate: %+v", ir)
	}
	families, err := reg.Gather()
	if err != nil || len(families) == 0 {
		t.Fatalf("no flow-control metrics registered: %v", err)
	}
}

// TestFlowControlMetricsBesideUpstream registers Sluice's flow-control metrics on controller-runtime's registry,
// which the EPP's /metrics serves, next to upstream's: no name may collide.
func TestFlowControlMetricsBesideUpstream(t *testing.T) {
	eppmetrics.Register()
	rec, err := flowcontrol.NewPrometheusRecorder(ctrlmetrics.Registry, 4)
	if err != nil {
		t.Fatalf("Sluice's metrics collide with upstream's: %v", err)
	}
	rec.RecordDecision("t", flowcontrol.Decision{Outcome: flowcontrol.Rejected, Reason: flowcontrol.ReasonSaturated, RetryAfter: time.Second})
	families, err := ctrlmetrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sluice, upstream int
	for _, f := range families {
		if strings.HasPrefix(f.GetName(), "sluice_flowcontrol_") {
			sluice++
		} else {
			upstream++
		}
	}
	if sluice == 0 || upstream == 0 {
		t.Fatalf("gathered %d Sluice and %d other families, want both", sluice, upstream)
	}
}

func TestFlowControlCommandApply(t *testing.T) {
	capBatch := func(band flowcontrol.Band, tenantHeader string) *flowcontrol.Config {
		cfg := flowcontrol.DefaultConfig()
		cfg.Tenants = map[string]flowcontrol.TenantPolicy{"batch": {Weight: 1, MaxBand: band}}
		cfg.TenantHeader = tenantHeader
		return cfg
	}
	// tenant is the tenant the running adapter reads from a request carrying both headers.
	tenant := func(fc *FlowControl) string {
		return fc.tenantOf(&handlers.RequestContext{FairnessID: "from-client",
			Request: &handlers.Request{Headers: map[string]string{"x-auth-tenant": "from-gateway", "x-gateway-inference-fairness-id": "from-client"}}})
	}
	invalid := flowcontrol.DefaultConfig()
	invalid.Endpoint.QueueDepth = 0

	off := NewFlowControlCommand()
	if err := off.Apply(flowcontrol.DefaultConfig()); err == nil {
		t.Fatal("Apply succeeded with Sluice admission off")
	}

	c := NewFlowControlCommand()
	fs := pflag.NewFlagSet("epp", pflag.ContinueOnError)
	c.AddFlags(fs)
	if err := fs.Parse([]string{"--sluice-admission"}); err != nil {
		t.Fatal(err)
	}
	if err := c.Complete(runserver.NewOptions()); err != nil {
		t.Fatal(err)
	}
	// Before Start: remembered, and used by Start instead of the policy file's (here default) configuration.
	for _, tc := range []struct {
		name    string
		cfg     *flowcontrol.Config
		wantErr string
	}{
		{"nil", nil, "must not be nil"},
		{"invalid", invalid, "queueDepthThreshold"},
		{"valid", capBatch(flowcontrol.Sheddable, "x-auth-tenant"), ""},
	} {
		err := c.Apply(tc.cfg)
		if (tc.wantErr == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.wantErr)) {
			t.Errorf("Apply(%s) before Start = %v, want error %q", tc.name, err, tc.wantErr)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	fc, err := c.Start(ctx, FlowControlEnv{Endpoints: &fakePool{}})
	if err != nil {
		t.Fatal(err)
	}
	if got := fc.Controller().Config().Tenants["batch"].MaxBand; got != flowcontrol.Sheddable {
		t.Fatalf("Start ran maxBand %v for batch, want the applied Sheddable", got)
	}
	if got := tenant(fc); got != "from-gateway" {
		t.Fatalf("Start reads the tenant %q, want the applied header's", got)
	}
	// After Start: live on the running controller; an invalid one leaves it in force.
	if err := c.Apply(capBatch(flowcontrol.Standard, flowcontrol.DefaultTenantHeader)); err != nil {
		t.Fatal(err)
	}
	if got := fc.Controller().Config().Tenants["batch"].MaxBand; got != flowcontrol.Standard {
		t.Fatalf("running maxBand %v for batch, want the applied Standard", got)
	}
	if got := tenant(fc); got != "from-client" {
		t.Fatalf("running adapter reads the tenant %q, want the applied (default) header's", got)
	}
	if err := c.Apply(invalid); err == nil || !strings.Contains(err.Error(), "queueDepthThreshold") {
		t.Fatalf("Apply(invalid) after Start = %v", err)
	}
	if got := fc.Controller().Config().Tenants["batch"].MaxBand; got != flowcontrol.Standard {
		t.Fatalf("an invalid configuration changed the running one: maxBand %v", got)
	}
}
