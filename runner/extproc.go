package runner

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/google/uuid"

	"github.com/sluice-gw/sluice/immediateresponse"
)

// requestIDHeader is the header Envoy and upstream's EPP use to correlate a
// request across its ext_proc messages.
const requestIDHeader = "x-request-id"

// ResponseShaper adjusts an immediate response (a rejection or an error the
// EPP answers itself) before it is sent to the proxy. requestID is the
// request's x-request-id, which admission plugins can use to attach
// per-request details such as a computed Retry-After.
type ResponseShaper interface {
	ShapeImmediateResponse(ctx context.Context, requestID string, resp *extprocv3.ImmediateResponse)
}

// ResponseShaperFunc adapts a function to ResponseShaper.
type ResponseShaperFunc func(ctx context.Context, requestID string, resp *extprocv3.ImmediateResponse)

// ShapeImmediateResponse calls f.
func (f ResponseShaperFunc) ShapeImmediateResponse(ctx context.Context, requestID string, resp *extprocv3.ImmediateResponse) {
	f(ctx, requestID, resp)
}

var _ ResponseShaper = ResponseShaperFunc(nil)

// shapingServer serves ext_proc with upstream's streaming server and passes
// every immediate response through the shapers, in order.
type shapingServer struct {
	extprocv3.UnimplementedExternalProcessorServer
	upstream extprocv3.ExternalProcessorServer
	shapers  []ResponseShaper
}

func (s *shapingServer) Process(stream extprocv3.ExternalProcessor_ProcessServer) error {
	return s.upstream.Process(&shapingStream{ExternalProcessor_ProcessServer: stream, shapers: s.shapers})
}

// shapingStream wraps one ext_proc stream (one HTTP request). Recv learns the
// request ID, adding one when the proxy sent none so that upstream and the
// shapers agree on it; Send shapes immediate responses.
type shapingStream struct {
	extprocv3.ExternalProcessor_ProcessServer
	shapers   []ResponseShaper
	requestID string
}

func (s *shapingStream) Recv() (*extprocv3.ProcessingRequest, error) {
	req, err := s.ExternalProcessor_ProcessServer.Recv()
	if err != nil {
		return req, err
	}
	if h := req.GetRequestHeaders(); h != nil {
		s.requestID = ensureRequestID(h)
	}
	return req, nil
}

func (s *shapingStream) Send(resp *extprocv3.ProcessingResponse) error {
	if ir := resp.GetImmediateResponse(); ir != nil {
		for _, shaper := range s.shapers {
			shaper.ShapeImmediateResponse(s.Context(), s.requestID, ir)
		}
	}
	return s.ExternalProcessor_ProcessServer.Send(resp)
}

// ensureRequestID returns the request's x-request-id, adding a fresh one to
// the headers when there is none (upstream would generate one too, but then
// only upstream would know it).
func ensureRequestID(h *extprocv3.HttpHeaders) string {
	if h.Headers == nil {
		h.Headers = &corev3.HeaderMap{}
	}
	for _, hv := range h.Headers.Headers {
		if strings.EqualFold(hv.Key, requestIDHeader) {
			if v := string(hv.RawValue); v != "" {
				return v
			}
			if hv.Value != "" {
				return hv.Value
			}
		}
	}
	id := uuid.NewString()
	h.Headers.Headers = append(h.Headers.Headers, &corev3.HeaderValue{Key: requestIDHeader, RawValue: []byte(id)})
	return id
}

// OpenAIErrorBody is a ResponseShaper that turns the plain-text body of an
// immediate response into an OpenAI-style JSON error, so HTTP clients and
// SDKs can parse every error the gateway answers itself. It leaves bodies that
// are already JSON alone.
var OpenAIErrorBody ResponseShaper = ResponseShaperFunc(openAIErrorBody)

func openAIErrorBody(_ context.Context, _ string, resp *extprocv3.ImmediateResponse) {
	if json.Valid(resp.Body) && len(resp.Body) > 0 && resp.Body[0] == '{' {
		return
	}
	code := http.StatusInternalServerError
	if resp.Status != nil && resp.Status.Code != 0 {
		code = int(resp.Status.Code)
	}
	message := strings.TrimSpace(string(resp.Body))
	if message == "" {
		message = http.StatusText(code)
	}
	resp.Body = immediateresponse.OpenAIError(code, message, "")
	immediateresponse.SetHeader(resp, "content-type", "application/json")
}
