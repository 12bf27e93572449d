package virtualbench

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/types"

	"sigs.k8s.io/gateway-api-inference-extension/apix/v1alpha2"
	reqcommon "sigs.k8s.io/gateway-api-inference-extension/pkg/common/request"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/config/loader"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/datalayer"
	fwkdl "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/datalayer"
	fwkfc "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/flowcontrol"
	fwkplugin "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/plugin"
	fwkrc "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/requestcontrol"
	fwkrh "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/requesthandling"
	fwksched "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/scheduling"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/requesthandling/parsers/openai"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/handlers"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/requestcontrol"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/scheduling"

	"github.com/sluice-gw/sluice/testbed/eventclock"
)

// The in-process EPP mirrors the order in which upstream's Director calls plugin hooks. TestDirectorOrder drives
// upstream's real Director and the in-process EPP with the same EndpointPickerConfig, whose one plugin records every
// hook it is called at, and compares the two records: when a new upstream version reorders the Director, it fails.

// hookRecorderType is the plugin type of hookRecorder, registered in upstream's registry by the test.
const hookRecorderType = "virtualbench-test-hook-recorder"

// hookRecorderKey is the data the recorder claims to produce, so that the data-dependency order lists it among the
// PrepareData plugins.
const hookRecorderKey = "virtualbench/hook-recorder"

// hookRecorder is every hook the Director calls for one request, each recording its name: the parser, the saturation
// detector (legacy admission asks it for sheddable requests), PrepareData, AdmitRequest, a scheduling filter,
// PreRequest, ResponseHeader and ResponseBody.
type hookRecorder struct {
	name   string
	parser *openai.OpenAIParser
	mu     sync.Mutex
	hooks  []string
}

var (
	_ fwkrh.Parser             = (*hookRecorder)(nil)
	_ fwkfc.SaturationDetector = (*hookRecorder)(nil)
	_ fwkrc.PrepareDataPlugin  = (*hookRecorder)(nil)
	_ fwkrc.AdmissionPlugin    = (*hookRecorder)(nil)
	_ fwksched.Filter          = (*hookRecorder)(nil)
	_ fwkrc.PreRequest         = (*hookRecorder)(nil)
	_ fwkrc.ResponseHeader     = (*hookRecorder)(nil)
	_ fwkrc.ResponseBody       = (*hookRecorder)(nil)
	_ fwkplugin.ProducerPlugin = (*hookRecorder)(nil)
	_ fwkplugin.ConsumerPlugin = (*hookRecorder)(nil)
)

// registerHookRecorderOnce guards the registration in upstream's global registry.
var registerHookRecorderOnce sync.Once

func (r *hookRecorder) record(hook string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.hooks = append(r.hooks, hook)
}

func (r *hookRecorder) recorded() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.hooks)
}

func (r *hookRecorder) TypedName() fwkplugin.TypedName {
	return fwkplugin.TypedName{Type: hookRecorderType, Name: r.name}
}
func (r *hookRecorder) Produces() map[string]any {
	return map[string]any{hookRecorderKey: 0}
}
func (r *hookRecorder) Consumes() map[string]any { return map[string]any{} }

func (r *hookRecorder) ParseRequest(ctx context.Context, body []byte, headers map[string]string) (*fwksched.LLMRequestBody, error) {
	r.record("ParseRequest")
	return r.parser.ParseRequest(ctx, body, headers)
}

func (r *hookRecorder) ParseResponse(ctx context.Context, body []byte, headers map[string]string, end bool) (*fwkrh.ParsedResponse, error) {
	r.record("ParseResponse")
	return r.parser.ParseResponse(ctx, body, headers, end)
}

func (r *hookRecorder) Saturation(context.Context, []fwkdl.Endpoint) float64 {
	r.record("Saturation")
	return 0
}

func (r *hookRecorder) PrepareRequestData(context.Context, *fwksched.LLMRequest, []fwksched.Endpoint) error {
	r.record("PrepareRequestData")
	return nil
}

func (r *hookRecorder) AdmitRequest(context.Context, *fwksched.LLMRequest, []fwksched.Endpoint) error {
	r.record("AdmitRequest")
	return nil
}

func (r *hookRecorder) Filter(_ context.Context, _ *fwksched.CycleState, _ *fwksched.LLMRequest, eps []fwksched.Endpoint) []fwksched.Endpoint {
	r.record("Filter")
	return eps
}

func (r *hookRecorder) PreRequest(context.Context, *fwksched.LLMRequest, *fwksched.SchedulingResult) {
	r.record("PreRequest")
}

func (r *hookRecorder) ResponseHeader(context.Context, *fwksched.LLMRequest, *fwkrc.Response, *fwkdl.EndpointMetadata) {
	r.record("ResponseHeader")
}

func (r *hookRecorder) ResponseBody(_ context.Context, _ *fwksched.LLMRequest, resp *fwkrc.Response, _ *fwkdl.EndpointMetadata) {
	r.record(fmt.Sprintf("ResponseBody(EndOfStream=%v)", resp.EndOfStream))
}

// hookRecorderConfig routes every hook to the recorder; the max-score picker picks.
const hookRecorderConfig = `apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- name: recorder
  type: ` + hookRecorderType + `
- type: max-score-picker
parser:
  pluginRef: recorder
saturationDetector:
  pluginRef: recorder
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: recorder
  - pluginRef: max-score-picker
`

func registerHookRecorder() {
	registerHookRecorderOnce.Do(func() {
		fwkplugin.Register(hookRecorderType, func(name string, _ json.RawMessage, _ fwkplugin.Handle) (fwkplugin.Plugin, error) {
			return &hookRecorder{name: name, parser: openai.NewOpenAIParser()}, nil
		})
	})
}

// orderDatastore is the Director's datastore for one pool of endpoints and the "sheddable" objective.
type orderDatastore struct{ endpoints []fwkdl.Endpoint }

func (d orderDatastore) PoolGet() (*datalayer.EndpointPool, error) {
	return &datalayer.EndpointPool{}, nil
}
func (d orderDatastore) ObjectiveGet(name string) *v1alpha2.InferenceObjective {
	if name != "sheddable" {
		return nil
	}
	priority := -1
	return &v1alpha2.InferenceObjective{Spec: v1alpha2.InferenceObjectiveSpec{Priority: &priority}}
}
func (d orderDatastore) PodList(pred func(fwkdl.Endpoint) bool) []fwkdl.Endpoint {
	var out []fwkdl.Endpoint
	for _, ep := range d.endpoints {
		if pred(ep) {
			out = append(out, ep)
		}
	}
	return out
}
func (d orderDatastore) ModelRewriteGet(string) (*v1alpha2.InferenceModelRewriteRule, string) {
	return nil, ""
}

// directorHooks runs one sheddable streamed request through upstream's Director, built as upstream's runner builds
// it (requestcontrol.Config from the loaded plugins, PrepareData in data-dependency order, legacy admission), and
// returns the hooks the recorder saw.
func directorHooks(t *testing.T, req eppRequest) []string {
	t.Helper()
	ctx := t.Context()
	var endpoints []fwkdl.Endpoint
	for _, e := range testPool(2) {
		md := &fwkdl.EndpointMetadata{NamespacedName: types.NamespacedName{Namespace: "default", Name: e.Name}, PodName: e.Name,
			Address: e.Address, Port: e.Port}
		endpoints = append(endpoints, fwkdl.NewEndpoint(md, &fwkdl.Metrics{UpdateTime: time.Now()}))
	}
	ds := orderDatastore{endpoints: endpoints}
	handle := fwkplugin.NewEppHandle(ctx, func() []types.NamespacedName { return nil })
	raw, _, err := loader.LoadRawConfig([]byte(hookRecorderConfig), logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := loader.InstantiateAndConfigure(raw, handle, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	rc := requestcontrol.NewConfig()
	rc.AddPlugins(handle.GetAllPlugins()...)
	dag, err := datalayer.ValidateAndOrderDataDependencies(handle.GetAllPlugins())
	if err != nil {
		t.Fatal(err)
	}
	rc.OrderPrepareDataPlugins(dag)
	cands := requestcontrol.NewDatastoreEndpointCandidates(ds)
	director := requestcontrol.NewDirectorWithConfig(ds, scheduling.NewSchedulerWithConfig(cfg.SchedulerConfig),
		requestcontrol.NewLegacyAdmissionController(cfg.SaturationDetector, cands), handlers.NewParser(cfg.ParserConfig), cands, rc)

	headers := map[string]string{reqcommon.RequestIdHeaderKey: req.ID}
	for k, v := range req.Headers {
		headers[k] = v
	}
	reqCtx := &handlers.RequestContext{
		Request:      &handlers.Request{Headers: headers, RawBody: req.Body, Metadata: map[string]any{}},
		Response:     &handlers.Response{Headers: map[string]string{"content-type": "text/event-stream"}},
		ObjectiveKey: req.Headers["x-gateway-inference-objective"],
		RequestSize:  len(req.Body),
	}
	if _, err := director.HandleRequest(ctx, reqCtx); err != nil {
		t.Fatalf("upstream's Director did not route the request: %v", err)
	}
	director.HandleResponseHeader(ctx, reqCtx)
	director.HandleResponseBody(ctx, reqCtx, false)
	director.HandleResponseBody(ctx, reqCtx, true)
	return handle.Plugin("recorder").(*hookRecorder).recorded()
}

// eppHooks runs the same request through the in-process EPP and returns the hooks its recorder saw.
func eppHooks(t *testing.T, req eppRequest) []string {
	t.Helper()
	clk := eventclock.New(ipT0)
	p, err := newInProcessEPP(eppOptions{Config: []byte(hookRecorderConfig), Endpoints: testPool(2), Clock: clk,
		Objectives: map[string]int{"sheddable": -1}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	scrapeAll(t, p, clk, 0, 0)
	got, ok := route(p, req)
	if !ok || got.Endpoint < 0 {
		t.Fatalf("the in-process EPP did not route the request: %+v", got)
	}
	p.ResponseHeader(req.ID, map[string]string{"content-type": "text/event-stream"})
	p.ResponseChunk(req.ID)
	p.ResponseComplete(req.ID, nil)
	for _, pl := range p.preRequest {
		if r, ok := pl.(*hookRecorder); ok {
			return r.recorded()
		}
	}
	t.Fatal("the in-process EPP lost the recorder")
	return nil
}

func TestDirectorOrder(t *testing.T) {
	if err := installPlugins(); err != nil {
		t.Fatal(err)
	}
	registerHookRecorder()
	req := ipChatRequest("order-1", "sheddable", "which hook runs first?")
	want := directorHooks(t, req)
	// The recorder must have seen every hook, or the comparison proves little.
	for _, hook := range []string{"ParseRequest", "Saturation", "PrepareRequestData", "AdmitRequest", "Filter", "PreRequest",
		"ResponseHeader", "ResponseBody(EndOfStream=false)", "ResponseBody(EndOfStream=true)"} {
		if !slices.Contains(want, hook) {
			t.Fatalf("upstream's Director never called %s (it called %v): the recorder does not cover every hook", hook, want)
		}
	}
	if got := eppHooks(t, req); !slices.Equal(got, want) {
		t.Errorf("the in-process EPP calls the hooks in another order than upstream's Director:\n EPP:      %v\n Director: %v", got, want)
	}
}
