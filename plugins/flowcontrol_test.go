package plugins

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	errcommon "sigs.k8s.io/gateway-api-inference-extension/pkg/common/error"
	fwkdl "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/datalayer"
	fwkplugin "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/plugin"
	fwkrc "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/requestcontrol"
	fwksched "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/scheduling"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/handlers"

	"github.com/sluice-gw/sluice/flowcontrol"
)

var fcT0 = time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)

// fakePool is an EndpointLister over fixed upstream endpoints; set replaces them.
type fakePool struct {
	mu  sync.Mutex
	eps []fwkdl.Endpoint
}

func (p *fakePool) PodList(pred func(fwkdl.Endpoint) bool) []fwkdl.Endpoint {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []fwkdl.Endpoint
	for _, ep := range p.eps {
		if pred(ep) {
			out = append(out, ep)
		}
	}
	return out
}

func (p *fakePool) set(eps ...fwkdl.Endpoint) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.eps = eps
}

// upstreamEndpoint builds an upstream endpoint at address:8000 with the given metrics.
func upstreamEndpoint(address string, waiting int, kv float64, scraped time.Time) fwkdl.Endpoint {
	m := fwkdl.NewMetrics()
	m.WaitingQueueSize, m.KVCacheUsagePercent, m.UpdateTime = waiting, kv, scraped
	return fwkdl.NewEndpoint(&fwkdl.EndpointMetadata{Address: address, Port: "8000", PodName: address}, m)
}

// newTestFlowControl returns an adapter on a fake clock with jitter off, over pool.
func newTestFlowControl(t testing.TB, cfg *flowcontrol.Config, pool *fakePool) (*FlowControl, *clocktesting.FakeClock) {
	t.Helper()
	if cfg == nil {
		cfg = flowcontrol.DefaultConfig()
	}
	cfg.RetryAfterJitter = 0
	clk := clocktesting.NewFakeClock(fcT0)
	fc, err := NewFlowControl(cfg, FlowControlOptions{}, FlowControlDeps{Endpoints: pool, Clock: clk, Rand: rand.New(rand.NewPCG(1, 2))})
	if err != nil {
		t.Fatal(err)
	}
	return fc, clk
}

// requestContext is what upstream's Director hands admission for one request.
func requestContext(id, tenant string, size int, payload fwksched.PayloadMap) *handlers.RequestContext {
	return &handlers.RequestContext{
		FairnessID:  tenant,
		RequestSize: size,
		Request:     &handlers.Request{Headers: map[string]string{"x-request-id": id}, Metadata: map[string]any{}},
		SchedulingRequest: &fwksched.LLMRequest{RequestId: id, Headers: map[string]string{"x-request-id": id},
			Body: &fwksched.LLMRequestBody{Payload: payload}, RequestSizeBytes: size},
	}
}

// answer is the immediate response the client gets for err, as upstream builds it and the runner's shapers (here the
// adapter's) shape it.
type answer struct {
	status  int
	headers map[string]string
	body    string
}

func immediateAnswer(t *testing.T, fc *FlowControl, id string, err error) answer {
	t.Helper()
	resp, buildErr := errcommon.BuildErrResponse(err)
	if buildErr != nil {
		t.Fatalf("upstream builds no immediate response for %v: %v", err, buildErr)
	}
	ir := resp.GetImmediateResponse()
	fc.ShapeImmediateResponse(context.Background(), id, ir)
	return answerOf(ir)
}

func answerOf(ir *extprocv3.ImmediateResponse) answer {
	a := answer{status: int(ir.GetStatus().GetCode()), headers: map[string]string{}, body: string(ir.Body)}
	for _, h := range ir.GetHeaders().GetSetHeaders() {
		a.headers[strings.ToLower(h.Header.Key)] = string(h.Header.RawValue) + h.Header.Value
	}
	return a
}

type openAIErrorBody struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
	} `json:"error"`
}

func TestFlowControlAdmitMapsOutcomesToAnswers(t *testing.T) {
	tests := []struct {
		name string
		// setup prepares the pool and controller; it returns the request's priority and body size.
		setup      func(t *testing.T, fc *FlowControl, pool *fakePool, clk *clocktesting.FakeClock) (priority, size int)
		code       string // errcommon code Admit returns
		status     int
		reason     string
		retryAfter bool
		errType    string
	}{
		{
			name: "sheddable on a saturated pool is shed with 429 saturated",
			setup: func(t *testing.T, fc *FlowControl, pool *fakePool, clk *clocktesting.FakeClock) (int, int) {
				pool.set(upstreamEndpoint("10.0.0.1", 10, 0.2, clk.Now()))
				return -1, 400
			},
			code: errcommon.ResourceExhausted, status: 429, reason: "saturated", retryAfter: true, errType: "rate_limit_error",
		},
		{
			name: "no endpoint with fresh metrics is 503 no_endpoints",
			setup: func(t *testing.T, fc *FlowControl, pool *fakePool, clk *clocktesting.FakeClock) (int, int) {
				pool.set(upstreamEndpoint("10.0.0.1", 0, 0, clk.Now().Add(-time.Hour)))
				return 0, 400
			},
			code: errcommon.ServiceUnavailable, status: 503, reason: "no_endpoints", retryAfter: true, errType: "service_unavailable_error",
		},
		{
			name: "shutting down is 503 shutting_down",
			setup: func(t *testing.T, fc *FlowControl, pool *fakePool, clk *clocktesting.FakeClock) (int, int) {
				pool.set(upstreamEndpoint("10.0.0.1", 0, 0, clk.Now()))
				fc.ctrl.Shutdown(0)
				return 1, 400
			},
			code: errcommon.ServiceUnavailable, status: 503, reason: "shutting_down", retryAfter: true, errType: "service_unavailable_error",
		},
		{
			name: "a malformed request is 400 invalid_request without Retry-After",
			setup: func(t *testing.T, fc *FlowControl, pool *fakePool, clk *clocktesting.FakeClock) (int, int) {
				pool.set(upstreamEndpoint("10.0.0.1", 0, 0, clk.Now()))
				return 0, -1 // a negative body size cannot be queued
			},
			code: errcommon.BadRequest, status: 400, reason: "invalid_request", errType: "invalid_request_error",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pool := &fakePool{}
			fc, clk := newTestFlowControl(t, nil, pool)
			priority, size := tt.setup(t, fc, pool, clk)
			if err := fc.SyncEndpoints(); err != nil {
				t.Fatal(err)
			}
			const id = "req-1"
			err := fc.Admit(context.Background(), requestContext(id, "tenant-a", size, nil), priority)
			var ee errcommon.Error
			if !errors.As(err, &ee) || ee.Code != tt.code {
				t.Fatalf("Admit = %v, want errcommon code %s", err, tt.code)
			}
			if errcommon.CanonicalCode(err) != tt.code {
				t.Fatalf("upstream reads code %q, want %q (the error must not be wrapped)", errcommon.CanonicalCode(err), tt.code)
			}
			a := immediateAnswer(t, fc, id, err)
			checkShedAnswer(t, a, tt.status, tt.reason, tt.retryAfter, tt.errType)
			if n := fc.shed.len(); n != 0 {
				t.Fatalf("%d decisions left in the store after the answer", n)
			}
		})
	}
}

func checkShedAnswer(t *testing.T, a answer, status int, reason string, retryAfter bool, errType string) {
	t.Helper()
	if a.status != status {
		t.Errorf("status = %d, want %d", a.status, status)
	}
	ra, has := a.headers["retry-after"]
	if has != retryAfter {
		t.Errorf("Retry-After present = %v (%q), want %v", has, ra, retryAfter)
	}
	if has {
		if s, err := strconv.Atoi(ra); err != nil || s < 1 {
			t.Errorf("Retry-After = %q, want whole seconds >= 1", ra)
		}
	}
	if got := a.headers[ShedReasonHeader]; got != reason {
		t.Errorf("%s = %q, want %q", ShedReasonHeader, got, reason)
	}
	if got := a.headers["content-type"]; got != "application/json" {
		t.Errorf("content-type = %q", got)
	}
	var body openAIErrorBody
	if err := json.Unmarshal([]byte(a.body), &body); err != nil {
		t.Fatalf("body %q is not JSON: %v", a.body, err)
	}
	if body.Error.Type != errType || body.Error.Code == nil || *body.Error.Code != reason || body.Error.Message == "" || body.Error.Param != nil {
		t.Errorf("body = %s, want type %q and code %q with a message", a.body, errType, reason)
	}
}

// TestFlowControlTenantIdentity: the tenant whose cap applies is the value of the policy's tenant header. With the
// default (GIE's fairness header, which clients send) it is upstream's FairnessID; with a header the gateway sets, a
// client-sent fairness ID is ignored and a request without the header is upstream's default tenant. A request above
// its tenant's cap is answered 403 band_not_allowed with an OpenAI-style error that says what to send instead.
func TestFlowControlTenantIdentity(t *testing.T) {
	policy := func(tenantHeader string) *flowcontrol.Config {
		cfg, err := flowcontrol.NewConfig(&flowcontrol.APIConfig{
			TenantHeader:  ptr.To(tenantHeader),
			AboveMaxBand:  ptr.To("Reject"),
			Tenants:       []flowcontrol.APITenantPolicy{{Name: "gold"}},
			DefaultTenant: &flowcontrol.APITenantPolicy{MaxBand: ptr.To("Standard")},
		})
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	const critical = 10
	for _, tc := range []struct {
		name         string
		tenantHeader string
		fairnessID   string            // what upstream read from x-gateway-inference-fairness-id
		headers      map[string]string // the request's other headers
		admitted     bool
		tenant       string // named in the 403's message
	}{
		{"default header: the client's fairness ID", "x-gateway-inference-fairness-id", "gold", nil, true, ""},
		{"default header: another client's", "x-gateway-inference-fairness-id", "free", nil, false, "free"},
		{"gateway header names the tenant", "x-auth-tenant", "free", map[string]string{"x-auth-tenant": "gold"}, true, ""},
		{"gateway header: a client-sent fairness ID is ignored", "x-auth-tenant", "gold",
			map[string]string{"x-gateway-inference-fairness-id": "gold"}, false, "default-flow"},
		{"gateway header with another tenant", "x-auth-tenant", "gold", map[string]string{"x-auth-tenant": "free"}, false, "free"},
		{"configured in any case", "X-Auth-Tenant", "", map[string]string{"x-auth-tenant": "gold"}, true, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pool := &fakePool{}
			fc, clk := newTestFlowControl(t, policy(tc.tenantHeader), pool)
			pool.set(upstreamEndpoint("10.0.0.1", 0, 0, clk.Now()))
			if err := fc.SyncEndpoints(); err != nil {
				t.Fatal(err)
			}
			rc := requestContext("req-1", tc.fairnessID, 100, nil)
			maps.Copy(rc.Request.Headers, tc.headers)
			err := fc.Admit(context.Background(), rc, critical)
			if tc.admitted {
				if err != nil {
					t.Fatalf("Admit = %v, want the request admitted", err)
				}
				return
			}
			if errcommon.CanonicalCode(err) != errcommon.Forbidden {
				t.Fatalf("Admit = %v, want errcommon code %s", err, errcommon.Forbidden)
			}
			a := immediateAnswer(t, fc, "req-1", err)
			checkShedAnswer(t, a, 403, "band_not_allowed", false, "permission_error")
			var body openAIErrorBody
			_ = json.Unmarshal([]byte(a.body), &body)
			for _, want := range []string{`tenant "` + tc.tenant + `"`, "Critical band", "x-gateway-inference-objective", "Standard band or lower"} {
				if !strings.Contains(body.Error.Message, want) {
					t.Errorf("message %q does not say %q", body.Error.Message, want)
				}
			}
		})
	}

	t.Run("a new policy's header applies from the next request", func(t *testing.T) {
		pool := &fakePool{}
		fc, clk := newTestFlowControl(t, policy("x-gateway-inference-fairness-id"), pool)
		pool.set(upstreamEndpoint("10.0.0.1", 0, 0, clk.Now()))
		if err := fc.SyncEndpoints(); err != nil {
			t.Fatal(err)
		}
		if err := fc.SetConfig(policy("x-auth-tenant")); err != nil {
			t.Fatal(err)
		}
		rc := requestContext("req-1", "gold", 100, nil)
		if err := fc.Admit(context.Background(), rc, critical); errcommon.CanonicalCode(err) != errcommon.Forbidden {
			t.Fatalf("Admit = %v: the client's fairness ID still names the tenant", err)
		}
		fc.ShapeImmediateResponse(context.Background(), "req-1", &extprocv3.ImmediateResponse{})
	})
}

// TestFlowControlDuplicateRequestIDLeavesTheOtherRequestAlone: a request that reuses the x-request-id of one in
// flight (a client that picks its own ID, passed on by the gateway) is refused 400, and answering it does not
// release the other request's reservation nor drop its headroom decision.
func TestFlowControlDuplicateRequestIDLeavesTheOtherRequestAlone(t *testing.T) {
	pool := &fakePool{}
	fc, clk := newTestFlowControl(t, nil, pool)
	pool.set(upstreamEndpoint("10.0.0.1", 0, 0, clk.Now()))
	if err := fc.SyncEndpoints(); err != nil {
		t.Fatal(err)
	}
	fc.Attach(map[string]fwkplugin.Plugin{"headroom": mustHeadroomFilter(t)})
	const id = "victim"
	if err := fc.Admit(context.Background(), requestContext(id, "a", 100, nil), 0); err != nil {
		t.Fatal(err)
	}
	err := fc.Admit(context.Background(), requestContext(id, "b", 100, nil), 0)
	if errcommon.CanonicalCode(err) != errcommon.BadRequest {
		t.Fatalf("the duplicate: %v, want 400", err)
	}
	checkShedAnswer(t, immediateAnswer(t, fc, id, err), 400, "invalid_request", false, "invalid_request_error")
	if s := fc.ctrl.Stats(); s.Reserved != 1 {
		t.Errorf("answering the duplicate released the first request's reservation: %d left", s.Reserved)
	}
	if _, ok := fc.headroom.get(id); !ok {
		t.Errorf("answering the duplicate dropped the first request's headroom decision")
	}
}

// TestFlowControlQueuedOutcomes covers the answers of requests that waited: a request displaced by a higher band
// and a queue timeout are 429 with Retry-After, and a client that goes away gets its context's error (no answer is
// shaped for it, and nothing is left in the store).
func TestFlowControlQueuedOutcomes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := flowcontrol.DefaultConfig()
		cfg.Bands[flowcontrol.Standard].MaxQueueTime = 2 * time.Second
		cfg.MaxQueuedRequests = 2
		pool := &fakePool{}
		fc, clk := newTestFlowControl(t, cfg, pool)
		pool.set(upstreamEndpoint("10.0.0.1", 40, 0.2, clk.Now().Add(time.Hour))) // saturated in both tiers, fresh for an hour
		if err := fc.SyncEndpoints(); err != nil {
			t.Fatal(err)
		}
		var mu sync.Mutex
		errs := make(map[string]error)
		admit := func(ctx context.Context, id string, priority int) {
			go func() {
				err := fc.Admit(ctx, requestContext(id, "tenant-"+id, 100, nil), priority)
				mu.Lock()
				errs[id] = err
				mu.Unlock()
			}()
			synctest.Wait()
		}
		admit(context.Background(), "timeout", 0)
		admit(context.Background(), "displaced", 0)
		cancelCtx, cancel := context.WithCancel(context.Background())
		admit(cancelCtx, "cancelled", 1) // Critical, and the controller is full: evicts the newest Standard request
		if s := fc.ctrl.Stats(); s.Queued != [flowcontrol.NumBands]int{1, 1, 0} {
			t.Fatalf("queued = %v, want one Critical and one Standard", s.Queued)
		}
		cancel()
		synctest.Wait()
		clk.Step(2 * time.Second)
		synctest.Wait()

		mu.Lock()
		defer mu.Unlock()
		if len(errs) != 3 {
			t.Fatalf("answered %v, want all three", errs)
		}
		if err := errs["cancelled"]; !errors.Is(err, context.Canceled) {
			t.Errorf("cancelled request: %v, want context.Canceled", err)
		}
		if n := fc.shed.len(); n != 2 { // "timeout" and "displaced" wait for their answers
			t.Errorf("store holds %d decisions, want 2", n)
		}
		checkShedAnswer(t, immediateAnswer(t, fc, "displaced", errs["displaced"]), 429, "displaced", true, "rate_limit_error")
		checkShedAnswer(t, immediateAnswer(t, fc, "timeout", errs["timeout"]), 429, "queue_timeout", true, "rate_limit_error")
		if n := fc.shed.len(); n != 0 {
			t.Errorf("store holds %d decisions after the answers, want 0", n)
		}
	})
}

func TestFlowControlShaperLeavesOtherResponsesAlone(t *testing.T) {
	pool := &fakePool{}
	fc, _ := newTestFlowControl(t, nil, pool)
	ir := &extprocv3.ImmediateResponse{Body: []byte(`{"error":{"message":"upstream"}}`)}
	fc.ShapeImmediateResponse(context.Background(), "not-ours", ir)
	if ir.Headers != nil || string(ir.Body) != `{"error":{"message":"upstream"}}` {
		t.Fatalf("shaper changed a response it did not produce: %+v", ir)
	}
}

func TestFlowControlEstimatedCost(t *testing.T) {
	tests := []struct {
		name    string
		bytes   int
		payload fwksched.PayloadMap
		want    uint64
	}{
		{"no body uses the default output", 400, nil, 100 + 256},
		{"bytes round up", 401, nil, 101 + 256},
		{"max_tokens", 400, fwksched.PayloadMap{"max_tokens": float64(50)}, 150},
		{"max_completion_tokens wins over max_tokens", 400, fwksched.PayloadMap{"max_completion_tokens": float64(10), "max_tokens": float64(50)}, 110},
		{"responses API max_output_tokens", 400, fwksched.PayloadMap{"max_output_tokens": json.Number("20")}, 120},
		{"max_tokens as GIE's parser leaves it (raw JSON)", 400, fwksched.PayloadMap{"max_tokens": json.RawMessage("128")}, 228},
		{"raw JSON that is not a number falls back to the default", 400, fwksched.PayloadMap{"max_tokens": json.RawMessage(`"x"`)}, 356},
		{"zero or negative falls back to the default", 400, fwksched.PayloadMap{"max_tokens": float64(0)}, 356},
		{"not a number falls back to the default", 400, fwksched.PayloadMap{"max_tokens": "lots"}, 356},
		{"absurd values are capped", 0, fwksched.PayloadMap{"max_tokens": 1e300}, maxEstimatedOutputTokens},
		{"negative size counts as empty", -5, nil, 256},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var body *fwksched.LLMRequestBody
			if tt.payload != nil {
				body = &fwksched.LLMRequestBody{Payload: tt.payload}
			}
			if got := EstimatedCost(tt.bytes, body, DefaultOutputTokens); got != tt.want {
				t.Fatalf("EstimatedCost = %d, want %d", got, tt.want)
			}
		})
	}
}

// TestFlowControlReturnKey: a client's retry (the same tenant and body, another request ID) carries the key its first
// attempt was promised a return under; other content, another tenant, or no body does not.
func TestFlowControlReturnKey(t *testing.T) {
	fc, _ := newTestFlowControl(t, nil, &fakePool{})
	keyOf := func(id, tenant, body string) uint64 {
		rc := requestContext(id, tenant, len(body), nil)
		rc.Request.RawBody = []byte(body)
		return fc.requestOf(rc, -1).ReturnKey
	}
	first := keyOf("a", "t", `{"prompt":"x"}`)
	if first == 0 || keyOf("b", "t", `{"prompt":"x"}`) != first {
		t.Fatalf("a retry's key differs from its first attempt's (%d)", first)
	}
	for _, other := range []uint64{keyOf("c", "t", `{"prompt":"y"}`), keyOf("d", "u", `{"prompt":"x"}`)} {
		if other == first {
			t.Fatal("other content or another tenant claims the first attempt's key")
		}
	}
	if k := keyOf("e", "t", ""); k != 0 {
		t.Fatalf("no body: key %d, want 0", k)
	}
}

func TestFlowControlEndpointSnapshot(t *testing.T) {
	scraped := fcT0.Add(-time.Second)
	m := fwkdl.NewMetrics()
	m.WaitingQueueSize, m.RunningRequestsSize, m.KVCacheUsagePercent, m.UpdateTime = 3, 7, 0.42, scraped
	ep := fwkdl.NewEndpoint(&fwkdl.EndpointMetadata{Address: "10.1.2.3", Port: "8000"}, m)
	want := flowcontrol.Endpoint{Name: "10.1.2.3:8000", WaitingQueue: 3, Running: 7, KVCacheUsage: 0.42, ScrapedAt: scraped}
	if got := EndpointSnapshot(ep); got != want {
		t.Fatalf("EndpointSnapshot = %+v, want %+v", got, want)
	}

	odd := fwkdl.NewMetrics()
	odd.WaitingQueueSize, odd.RunningRequestsSize, odd.KVCacheUsagePercent = -1, -2, 85 // a server reporting percent
	got := EndpointSnapshot(fwkdl.NewEndpoint(&fwkdl.EndpointMetadata{Address: "fd00::1", Port: "9000"}, odd))
	if got.Name != "[fd00::1]:9000" || got.WaitingQueue != 0 || got.Running != 0 || got.KVCacheUsage != 1 || !got.ScrapedAt.IsZero() {
		t.Fatalf("odd metrics: %+v", got)
	}

	// The controller accepts every converted endpoint, and only fresh ones have headroom.
	pool := &fakePool{}
	fc, clk := newTestFlowControl(t, nil, pool)
	pool.set(upstreamEndpoint("10.0.0.1", 0, 0.1, clk.Now()), fwkdl.NewEndpoint(&fwkdl.EndpointMetadata{Address: "10.0.0.2", Port: "8000"}, odd),
		upstreamEndpoint("10.0.0.3", 0, 0.1, time.Time{}))
	if err := fc.SyncEndpoints(); err != nil {
		t.Fatalf("SyncEndpoints: %v", err)
	}
	fc.Attach(map[string]fwkplugin.Plugin{"f": mustHeadroomFilter(t)})
	if err := fc.Admit(context.Background(), requestContext("r", "t", 10, nil), 1); err != nil {
		t.Fatal(err)
	}
	sd, ok := fc.headroom.get("r")
	if !ok || len(sd.decision.Endpoints) != 1 || sd.decision.Endpoints[0] != "10.0.0.1:8000" {
		t.Fatalf("endpoints with headroom = %+v (%v), want only the fresh idle one", sd.decision.Endpoints, ok)
	}
}

// TestFlowControlBindRelease follows a request through PreRequest and the end of its response: the reservation
// moves to the endpoint the scheduler chose and is released at EndOfStream, and each step is visible in which
// endpoints the next request may use.
func TestFlowControlBindRelease(t *testing.T) {
	cfg := flowcontrol.DefaultConfig()
	cfg.Endpoint.QueueDepth = 1 // one reservation saturates an endpoint
	pool := &fakePool{}
	fc, clk := newTestFlowControl(t, cfg, pool)
	pool.set(upstreamEndpoint("10.0.0.1", 0, 0, clk.Now()), upstreamEndpoint("10.0.0.2", 0, 0, clk.Now()))
	if err := fc.SyncEndpoints(); err != nil {
		t.Fatal(err)
	}
	filter := mustHeadroomFilter(t)
	if n := fc.Attach(map[string]fwkplugin.Plugin{"headroom": filter, "other": fc}); n != 1 {
		t.Fatalf("Attach found %d filters, want 1", n)
	}
	admit := func(id string) []string {
		t.Helper()
		if err := fc.Admit(context.Background(), requestContext(id, "t", 10, nil), 0); err != nil {
			t.Fatalf("%s: %v", id, err)
		}
		sd, _ := fc.headroom.get(id)
		return sd.decision.Endpoints
	}
	target := func(addr string) *fwksched.SchedulingResult {
		ep := fwksched.NewEndpoint(&fwkdl.EndpointMetadata{Address: addr, Port: "8000"}, fwkdl.NewMetrics(), nil)
		return &fwksched.SchedulingResult{PrimaryProfileName: "default",
			ProfileResults: map[string]*fwksched.ProfileRunResult{"default": {TargetEndpoints: []fwksched.Endpoint{ep}}}}
	}
	llm := func(id string) *fwksched.LLMRequest { return &fwksched.LLMRequest{RequestId: id} }

	if got := admit("r1"); len(got) != 2 {
		t.Fatalf("r1 may use %v, want both idle endpoints", got)
	}
	// The controller reserved its pick for r1; the scheduler chose 10.0.0.2.
	fc.PreRequest(context.Background(), llm("r1"), target("10.0.0.2"))
	if _, ok := fc.headroom.get("r1"); ok {
		t.Fatal("PreRequest must drop r1's stored decision")
	}
	if got := admit("r2"); len(got) != 1 || got[0] != "10.0.0.1:8000" {
		t.Fatalf("r2 may use %v, want only 10.0.0.1:8000 (r1 is bound to 10.0.0.2)", got)
	}
	fc.PreRequest(context.Background(), llm("r2"), target("10.0.0.1"))

	fc.ResponseBody(context.Background(), llm("r1"), &fwkrc.Response{RequestId: "r1", EndOfStream: false}, nil)
	if s := fc.ctrl.Stats(); s.Reserved != 2 {
		t.Fatalf("a chunk before EndOfStream released a reservation: %d left", s.Reserved)
	}
	fc.ResponseBody(context.Background(), llm("r1"), &fwkrc.Response{RequestId: "r1", EndOfStream: true}, nil)
	if s := fc.ctrl.Stats(); s.Reserved != 1 {
		t.Fatalf("reservations after r1 ended = %d, want 1", s.Reserved)
	}
	if got := admit("r3"); len(got) != 1 || got[0] != "10.0.0.2:8000" {
		t.Fatalf("r3 may use %v, want only 10.0.0.2:8000 (released by r1)", got)
	}
	// r3 fails after admission (say, scheduling found nothing): its immediate response releases it.
	fc.ShapeImmediateResponse(context.Background(), "r3", &extprocv3.ImmediateResponse{})
	if s := fc.ctrl.Stats(); s.Reserved != 1 {
		t.Fatalf("reservations after r3's immediate response = %d, want 1 (r2)", s.Reserved)
	}
	if n := fc.headroom.len(); n != 0 {
		t.Fatalf("%d dispatched decisions left in the store", n)
	}
}

// TestFlowControlFirstChunk: once the gateway has shown that it sends streamed response bodies to the EPP (a first
// non-final chunk), streamed requests count against their endpoint until their own first chunk (the controller's
// Critical reserve); before that, and for non-streamed requests, they count as without streaming.
func TestFlowControlFirstChunk(t *testing.T) {
	ctx := context.Background()
	pool := &fakePool{}
	cfg := flowcontrol.DefaultConfig()
	cfg.Endpoint.Pending, cfg.Endpoint.PendingTime = 2, 0 // the count: what is pending does not depend on timing
	fc, clk := newTestFlowControl(t, cfg, pool)
	scrape := func() {
		t.Helper()
		clk.Step(10 * time.Millisecond)
		pool.set(upstreamEndpoint("10.0.0.1", 0, 0, clk.Now()))
		if err := fc.SyncEndpoints(); err != nil {
			t.Fatal(err)
		}
	}
	scrape()
	admit := func(id string, stream bool) {
		t.Helper()
		rc := requestContext(id, "t", 10, nil)
		rc.SchedulingRequest.Body.Stream = stream
		if err := fc.Admit(ctx, rc, 1); err != nil {
			t.Fatalf("%s: %v", id, err)
		}
	}
	chunk := func(id string, end bool) {
		fc.ResponseBody(ctx, &fwksched.LLMRequest{RequestId: id}, &fwkrc.Response{RequestId: id, EndOfStream: end}, nil)
	}
	reserved := func(want int, why string) {
		t.Helper()
		if got := fc.ctrl.Stats().Reserved; got != want {
			t.Fatalf("%s: %d reservations, want %d", why, got, want)
		}
	}

	admit("s0", true)
	scrape()
	reserved(0, "a streamed request before any chunk was seen, after a covering scrape")
	chunk("s0", false)
	chunk("s0", true)

	admit("s1", true)
	admit("plain", false)
	scrape()
	admit("s2", true)
	scrape()
	reserved(2, "two streamed requests without a first chunk, after a covering scrape")
	chunk("s1", false)
	chunk("s1", false)
	reserved(1, "after s1's chunks")
	chunk("s2", true) // ended before any chunk: the client went away
	reserved(0, "after s2 ended")
	chunk("plain", true)
	// A streamed request that fails before reaching its endpoint (its immediate response) leaves nothing behind.
	admit("s3", true)
	fc.ShapeImmediateResponse(ctx, "s3", &extprocv3.ImmediateResponse{})
	reserved(0, "after s3's immediate response")
	if n := fc.headroom.len() + fc.shed.len(); n != 0 {
		t.Fatalf("%d decisions left in the stores", n)
	}
	fc.awaitingFirstChunk.Range(func(id, _ any) bool {
		t.Errorf("%v still awaits its first chunk", id)
		return true
	})
}

// TestFlowControlRunSnapshotsAndShutdown drives Run on a fake clock: snapshots follow the ticker, and cancelling its
// context answers new and waiting requests 503 shutting_down (the waiting ones after the grace period).
func TestFlowControlRunSnapshotsAndShutdown(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		pool := &fakePool{}
		clk := clocktesting.NewFakeClock(fcT0)
		cfg := flowcontrol.DefaultConfig()
		fc, err := NewFlowControl(cfg, FlowControlOptions{SnapshotInterval: 100 * time.Millisecond, ShutdownGrace: 5 * time.Second},
			FlowControlDeps{Endpoints: pool, Clock: clk})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		ran := make(chan struct{})
		go func() { fc.Run(ctx); close(ran) }()
		synctest.Wait()
		waitErr := make(chan error, 2)
		go func() { waitErr <- fc.Admit(context.Background(), requestContext("early", "t", 10, nil), 0) }()
		synctest.Wait()
		if len(waitErr) != 0 {
			t.Fatalf("answered before any endpoint was scraped: %v", <-waitErr)
		}

		pool.set(upstreamEndpoint("10.0.0.1", 40, 0.1, clk.Now().Add(100*time.Millisecond))) // saturated in both tiers
		clk.Step(100 * time.Millisecond)
		synctest.Wait()
		go func() { waitErr <- fc.Admit(context.Background(), requestContext("waiting", "t", 10, nil), 0) }()
		synctest.Wait()
		if s := fc.ctrl.Stats(); s.Queued[flowcontrol.Standard] != 2 {
			t.Fatalf("the snapshot did not reach the controller: queued %v, want the early and the waiting request", s.Queued)
		}

		cancel()
		synctest.Wait()
		err = fc.Admit(context.Background(), requestContext("late", "t", 10, nil), 1)
		checkShedAnswer(t, immediateAnswer(t, fc, "late", err), 503, "shutting_down", true, "service_unavailable_error")
		select {
		case <-ran:
			t.Fatal("Run returned while a request still waits")
		default:
		}
		clk.Step(5 * time.Second)
		synctest.Wait()
		for range 2 {
			err := <-waitErr
			var id string
			switch {
			case fc.Shed("early"):
				id = "early"
			case fc.Shed("waiting"):
				id = "waiting"
			default:
				t.Fatalf("an answer without a stored decision: %v", err)
			}
			checkShedAnswer(t, immediateAnswer(t, fc, id, err), 503, "shutting_down", true, "service_unavailable_error")
		}
		<-ran
	})
}

// TestFlowControlWarmUp covers the EPP's first moments: requests that arrive before any endpoint was scraped wait for
// the first scrape and are then decided on it; if none comes within the warm-up, they are answered 503 no_endpoints
// then; a client that leaves meanwhile gets its context's error; once warm, arrivals are decided at once.
func TestFlowControlWarmUp(t *testing.T) {
	tests := []struct {
		name string
		// then acts after the request arrived and waits; the request is then answered.
		then       func(fc *FlowControl, pool *fakePool, clk *clocktesting.FakeClock, cancel context.CancelFunc)
		wantStatus int // 0: dispatched; -1: the context's error
	}{
		{"the first scrape dispatches it", func(fc *FlowControl, pool *fakePool, clk *clocktesting.FakeClock, _ context.CancelFunc) {
			clk.Step(time.Second)
			pool.set(upstreamEndpoint("10.0.0.1", 0, 0.1, clk.Now()))
			_ = fc.SyncEndpoints()
		}, 0},
		{"no scrape within the warm-up is 503", func(_ *FlowControl, _ *fakePool, clk *clocktesting.FakeClock, _ context.CancelFunc) {
			clk.Step(3 * time.Second)
		}, 503},
		{"a scrape of an unreachable pool ends it too", func(fc *FlowControl, pool *fakePool, clk *clocktesting.FakeClock, _ context.CancelFunc) {
			pool.set(upstreamEndpoint("10.0.0.1", 0, 0.1, clk.Now().Add(-time.Hour)))
			_ = fc.SyncEndpoints()
		}, 503},
		{"a client that leaves gets its error", func(_ *FlowControl, _ *fakePool, _ *clocktesting.FakeClock, cancel context.CancelFunc) {
			cancel()
		}, -1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				pool := &fakePool{}
				clk := clocktesting.NewFakeClock(fcT0)
				fc, err := NewFlowControl(nil, FlowControlOptions{WarmUp: 3 * time.Second}, FlowControlDeps{Endpoints: pool, Clock: clk})
				if err != nil {
					t.Fatal(err)
				}
				pool.set(upstreamEndpoint("10.0.0.1", 0, 0, time.Time{})) // known, never scraped
				if err := fc.SyncEndpoints(); err != nil {
					t.Fatal(err)
				}
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				answered := make(chan error, 1)
				go func() { answered <- fc.Admit(ctx, requestContext("r", "t", 10, nil), 0) }()
				synctest.Wait()
				if len(answered) != 0 {
					t.Fatalf("answered before the first scrape or the end of the warm-up: %v", <-answered)
				}
				tt.then(fc, pool, clk, cancel)
				synctest.Wait()
				err = <-answered
				switch tt.wantStatus {
				case 0:
					if err != nil {
						t.Fatalf("Admit = %v, want dispatched", err)
					}
				case -1:
					if !errors.Is(err, context.Canceled) {
						t.Fatalf("Admit = %v, want the context's error", err)
					}
				default:
					checkShedAnswer(t, immediateAnswer(t, fc, "r", err), tt.wantStatus, "no_endpoints", true, "service_unavailable_error")
				}
				if tt.wantStatus == -1 {
					return
				}
				// Warm from now on: an arrival is decided at once, on the same metrics.
				later := fc.Admit(context.Background(), requestContext("later", "t", 10, nil), 0)
				if (later == nil) != (tt.wantStatus == 0) {
					t.Fatalf("after the warm-up: %v, want what the first request got", later)
				}
			})
		})
	}
}

func TestFlowControlDecisionStoreIsBoundedAndExpires(t *testing.T) {
	clk := clocktesting.NewFakeClock(fcT0)
	s := newDecisionStore(clk, time.Minute, 3)
	d := flowcontrol.Decision{Outcome: flowcontrol.Rejected, Reason: flowcontrol.ReasonSaturated}
	for i := range 5 {
		s.put(fmt.Sprint(i), storedDecision{decision: d})
	}
	if s.len() != 3 || s.dropped != 2 {
		t.Fatalf("len %d dropped %d, want the bound 3 and the 2 oldest dropped", s.len(), s.dropped)
	}
	if _, ok := s.get("0"); ok {
		t.Fatal("the oldest entry survived the bound")
	}
	if _, ok := s.get("4"); !ok {
		t.Fatal("get lost the newest entry")
	}
	if _, ok := s.take("4"); !ok {
		t.Fatal("take lost the newest entry")
	}
	if _, ok := s.take("4"); ok || s.len() != 2 {
		t.Fatalf("take must delete: len %d", s.len())
	}
	s.put("2", storedDecision{decision: d, message: "again"}) // replacing keeps one entry per ID
	if s.len() != 2 {
		t.Fatalf("len %d after replacing, want 2", s.len())
	}

	clk.Step(time.Minute)
	if _, ok := s.get("3"); ok {
		t.Fatal("an expired entry is still served")
	}
	s.put("new", storedDecision{decision: d})
	if s.len() != 1 {
		t.Fatalf("expired entries were not removed on put: len %d", s.len())
	}
	s.delete("new")
	if s.len() != 0 {
		t.Fatalf("delete left %d", s.len())
	}
}

func TestFlowControlOptionsValidate(t *testing.T) {
	_, err := NewFlowControl(nil, FlowControlOptions{DefaultOutputTokens: -1, SnapshotInterval: -time.Second}, FlowControlDeps{Endpoints: &fakePool{}})
	if err == nil || !strings.Contains(err.Error(), "default output tokens") || !strings.Contains(err.Error(), "snapshot interval") {
		t.Fatalf("err = %v, want both problems reported", err)
	}
	if _, err := NewFlowControl(nil, FlowControlOptions{}, FlowControlDeps{}); err == nil {
		t.Fatal("a FlowControl without an endpoint lister was built")
	}
}
