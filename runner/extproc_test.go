package runner

import (
	"context"
	"encoding/json"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"

	"github.com/sluice-gw/sluice/plugins"
)

// fakeStream replays requests and records responses.
type fakeStream struct {
	grpc.ServerStream
	ctx context.Context // nil means context.Background()
	in  []*extprocv3.ProcessingRequest
	out []*extprocv3.ProcessingResponse
}

func (f *fakeStream) Context() context.Context {
	if f.ctx == nil {
		return context.Background()
	}
	return f.ctx
}

func (f *fakeStream) Recv() (*extprocv3.ProcessingRequest, error) {
	r := f.in[0]
	f.in = f.in[1:]
	return r, nil
}

func (f *fakeStream) Send(r *extprocv3.ProcessingResponse) error {
	f.out = append(f.out, r)
	return nil
}

func headers(kv ...string) *extprocv3.ProcessingRequest {
	hm := &corev3.HeaderMap{}
	for i := 0; i < len(kv); i += 2 {
		hm.Headers = append(hm.Headers, &corev3.HeaderValue{Key: kv[i], RawValue: []byte(kv[i+1])})
	}
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: hm}}}
}

func immediate(code typev3.StatusCode, body string) *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{
		ImmediateResponse: &extprocv3.ImmediateResponse{Status: &typev3.HttpStatus{Code: code}, Body: []byte(body)},
	}}
}

func TestShapingStreamPassesRequestIDToShapers(t *testing.T) {
	tests := []struct {
		name   string
		req    *extprocv3.ProcessingRequest
		wantID string // "" means a generated one
	}{
		{"proxy-supplied id", headers("x-request-id", "abc"), "abc"},
		{"missing id is generated and added", headers(":path", "/v1/completions"), ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var gotID string
			s := &shapingStream{
				ExternalProcessor_ProcessServer: &fakeStream{in: []*extprocv3.ProcessingRequest{tt.req}},
				ctx:                             context.Background(),
				shapers: []ResponseShaper{ResponseShaperFunc(func(_ context.Context, id string, r *extprocv3.ImmediateResponse) {
					gotID = id
					plugins.SetImmediateHeader(r, "retry-after", "3")
				})},
			}
			req, err := s.Recv()
			if err != nil {
				t.Fatal(err)
			}
			seenInRequest := ""
			for _, h := range req.GetRequestHeaders().Headers.Headers {
				if h.Key == requestIDHeader {
					seenInRequest = string(h.RawValue)
				}
			}
			if err := s.Send(immediate(typev3.StatusCode_TooManyRequests, "busy")); err != nil {
				t.Fatal(err)
			}
			if gotID == "" || gotID != seenInRequest || (tt.wantID != "" && gotID != tt.wantID) {
				t.Fatalf("shaper saw id %q, request carries %q, want %q", gotID, seenInRequest, tt.wantID)
			}
			sent := s.ExternalProcessor_ProcessServer.(*fakeStream).out[0].GetImmediateResponse()
			if h := sent.Headers.SetHeaders[0].Header; h.Key != "retry-after" || string(h.RawValue) != "3" {
				t.Fatalf("shaped header missing: %+v", sent.Headers)
			}
		})
	}
}

// TestShapingStreamMakesHeaderValuesUTF8: header values that are not UTF-8 reach upstream with U+FFFD in place of the
// bad bytes (as Prometheus label values they would panic the EPP); valid values are untouched.
func TestShapingStreamMakesHeaderValuesUTF8(t *testing.T) {
	hm := func(kv ...string) *corev3.HeaderMap { return headers(kv...).GetRequestHeaders().Headers }
	tests := []struct {
		name string
		req  *extprocv3.ProcessingRequest
		get  func(*extprocv3.ProcessingRequest) *corev3.HeaderMap
	}{
		{"request headers", headers("x-request-id", "id", "x-gateway-model-name-rewrite", "\xc3base", "x-tenant", "gold\xff\xfe", "x-ok", "café"),
			func(r *extprocv3.ProcessingRequest) *corev3.HeaderMap { return r.GetRequestHeaders().GetHeaders() }},
		{"response headers", &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
			Headers: hm("x-gateway-model-name-rewrite", "\xc3base", "x-tenant", "gold\xff\xfe", "x-ok", "café")}}},
			func(r *extprocv3.ProcessingRequest) *corev3.HeaderMap { return r.GetResponseHeaders().GetHeaders() }},
		{"request trailers", &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestTrailers{RequestTrailers: &extprocv3.HttpTrailers{
			Trailers: hm("x-gateway-model-name-rewrite", "\xc3base", "x-tenant", "gold\xff\xfe", "x-ok", "café")}}},
			func(r *extprocv3.ProcessingRequest) *corev3.HeaderMap { return r.GetRequestTrailers().GetTrailers() }},
		{"response trailers", &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseTrailers{ResponseTrailers: &extprocv3.HttpTrailers{
			Trailers: hm("x-gateway-model-name-rewrite", "\xc3base", "x-tenant", "gold\xff\xfe", "x-ok", "café")}}},
			func(r *extprocv3.ProcessingRequest) *corev3.HeaderMap { return r.GetResponseTrailers().GetTrailers() }},
	}
	want := map[string]string{"x-gateway-model-name-rewrite": "\uFFFDbase", "x-tenant": "gold\uFFFD", "x-ok": "café"}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := &shapingStream{ExternalProcessor_ProcessServer: &fakeStream{in: []*extprocv3.ProcessingRequest{tt.req}}}
			req, err := s.Recv()
			if err != nil {
				t.Fatal(err)
			}
			for _, h := range tt.get(req).GetHeaders() {
				if w, ok := want[h.Key]; ok && string(h.RawValue) != w {
					t.Errorf("%s = %q, want %q", h.Key, h.RawValue, w)
				}
			}
		})
	}
}

func TestOpenAIErrorBody(t *testing.T) {
	tests := []struct {
		name     string
		code     typev3.StatusCode
		body     string
		wantType string
		wantMsg  string
	}{
		{"bad request", typev3.StatusCode_BadRequest, "model not found in request body", "invalid_request_error", "model not found in request body"},
		{"overload", typev3.StatusCode_TooManyRequests, "system saturated, sheddable request dropped", "rate_limit_error", "system saturated, sheddable request dropped"},
		{"unavailable empty body", typev3.StatusCode_ServiceUnavailable, "", "service_unavailable_error", "Service Unavailable"},
		{"internal", typev3.StatusCode_InternalServerError, "boom", "server_error", "boom"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := immediate(tt.code, tt.body).GetImmediateResponse()
			OpenAIErrorBody.ShapeImmediateResponse(context.Background(), "id", r)
			var got struct {
				Error struct {
					Message string  `json:"message"`
					Type    string  `json:"type"`
					Param   *string `json:"param"`
					Code    any     `json:"code"`
				} `json:"error"`
			}
			if err := json.Unmarshal(r.Body, &got); err != nil {
				t.Fatalf("body %q: %v", r.Body, err)
			}
			if got.Error.Type != tt.wantType || got.Error.Message != tt.wantMsg {
				t.Fatalf("got %+v", got.Error)
			}
			if r.Status.Code != tt.code {
				t.Fatalf("status changed to %v", r.Status.Code)
			}
		})
	}
	t.Run("JSON body is left alone", func(t *testing.T) {
		body := `{"error":{"message":"x","type":"rate_limit_error","param":null,"code":"queue_full"}}`
		r := immediate(typev3.StatusCode_TooManyRequests, body).GetImmediateResponse()
		OpenAIErrorBody.ShapeImmediateResponse(context.Background(), "id", r)
		if string(r.Body) != body || r.Headers != nil {
			t.Fatalf("body rewritten to %q", r.Body)
		}
	})
}
