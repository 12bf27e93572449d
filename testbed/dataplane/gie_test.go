package dataplane

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	errcommon "sigs.k8s.io/gateway-api-inference-extension/pkg/common/error"
	fwkdl "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/datalayer"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/requesthandling/parsers/openai"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/handlers"
)

// gieDirector stands in for the EPP's scheduler behind upstream GIE v1.5.0's
// real ext_proc handler (handlers.StreamingServer), so these tests check the
// proxy against the exact message sequence the upstream EPP produces.
type gieDirector struct {
	dest      string
	fromModel string // rewritten to toModel in the request body
	toModel   string
	reject    error

	mu         sync.Mutex
	servedSeen []any // envoy.lb metadata as the response header hook saw it
}

func (d *gieDirector) HandleRequest(_ context.Context, reqCtx *handlers.RequestContext) (*handlers.RequestContext, error) {
	if d.reject != nil {
		return reqCtx, d.reject
	}
	reqCtx.TargetEndpoint = d.dest
	if d.fromModel != "" {
		reqCtx.IncomingModelName, reqCtx.TargetModelName = d.fromModel, d.toModel
		reqCtx.Request.RawBody = bytes.ReplaceAll(reqCtx.Request.RawBody, []byte(d.fromModel), []byte(d.toModel))
	}
	return reqCtx, nil
}

func (d *gieDirector) HandleResponseHeader(_ context.Context, reqCtx *handlers.RequestContext) *handlers.RequestContext {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.servedSeen = append(d.servedSeen, reqCtx.Request.Metadata["envoy.lb"])
	return reqCtx
}

func (d *gieDirector) HandleResponseBody(_ context.Context, reqCtx *handlers.RequestContext, _ bool) *handlers.RequestContext {
	return reqCtx
}

func (d *gieDirector) GetRandomEndpoint() *fwkdl.EndpointMetadata { return nil }

func startGIEServer(t *testing.T, d *gieDirector) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	extprocv3.RegisterExternalProcessorServer(srv, handlers.NewStreamingServer(nil, d, openai.NewOpenAIParser()))
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(l) }()
	t.Cleanup(func() { srv.Stop(); <-done })
	return l.Addr().String()
}

func TestAgainstUpstreamGIEHandler(t *testing.T) {
	var upstreamBody string
	b := startBackend(t, "b", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		rc := http.NewResponseController(w)
		for _, tok := range []string{"a", "b", "c"} {
			_, _ = io.WriteString(w, `data: {"model":"target-model","choices":[{"text":"`+tok+`"}]}`+"\n\n")
			_ = rc.Flush()
		}
		_, _ = io.WriteString(w, "data: [DONE]\n\n")
	})
	d := &gieDirector{dest: refusedAddr(t) + "," + b.addr(), fromModel: "client-model", toModel: "target-model"}
	proxy, _ := startProxy(t, Config{EPPAddress: startGIEServer(t, d)})

	code, _, body := post(t, proxy.URL+"/v1/completions", `{"model":"client-model","prompt":"hi","stream":true}`)
	if code != http.StatusOK {
		t.Fatalf("status %d body %q", code, body)
	}
	_, bodies, _ := b.received()
	upstreamBody = bodies[0]
	if upstreamBody != `{"model":"target-model","prompt":"hi","stream":true}` {
		t.Errorf("upstream got %q, want the rewritten model", upstreamBody)
	}
	// Upstream GIE rewrites the model name back in streamed responses.
	if strings.Contains(body, "target-model") || strings.Count(body, `"model":"client-model"`) != 3 || !strings.HasSuffix(body, "data: [DONE]\n\n") {
		t.Errorf("client body %q", body)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.servedSeen) != 1 {
		t.Fatalf("response header hook ran %d times", len(d.servedSeen))
	}
	lb, _ := d.servedSeen[0].(map[string]any)
	if lb["x-gateway-destination-endpoint-served"] != b.addr() {
		t.Errorf("upstream EPP saw envoy.lb %v, want served endpoint %s", d.servedSeen[0], b.addr())
	}
}

func TestAgainstUpstreamGIEHandlerNonStreaming(t *testing.T) {
	b := startBackend(t, "b", nil)
	d := &gieDirector{dest: b.addr()}
	proxy, _ := startProxy(t, Config{EPPAddress: startGIEServer(t, d)})
	code, hdr, body := post(t, proxy.URL+"/v1/completions", `{"model":"m","prompt":"hi"}`)
	if code != http.StatusOK || body != `{"backend":"b","model":"m"}` {
		t.Fatalf("status %d body %q", code, body)
	}
	if hdr.Get("X-Went-Into-Resp-Headers") != "true" {
		t.Errorf("upstream EPP's response header mutation missing: %v", hdr)
	}
}

func TestAgainstUpstreamGIEHandlerRejection(t *testing.T) {
	b := startBackend(t, "b", nil)
	d := &gieDirector{reject: errcommon.Error{Code: errcommon.ResourceExhausted, Msg: "sheddable request dropped"}}
	proxy, rec := startProxy(t, Config{EPPAddress: startGIEServer(t, d)})
	code, _, body := post(t, proxy.URL+"/v1/completions", `{"model":"m","prompt":"hi"}`)
	if code != http.StatusTooManyRequests || !strings.Contains(body, "sheddable request dropped") {
		t.Fatalf("status %d body %q, want the EPP's 429", code, body)
	}
	if n, _, _ := b.received(); n != 0 {
		t.Errorf("backend called %d times", n)
	}
	if outcomes, _, _ := rec.snapshot(1); len(outcomes) != 1 || outcomes[0] != OutcomeImmediate {
		t.Errorf("outcomes %v", outcomes)
	}
}
