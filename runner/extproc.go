package runner

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/google/uuid"
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
	resp.Body = OpenAIError(code, message, "")
	SetImmediateResponseHeader(resp, "content-type", "application/json")
}

// OpenAIError renders an OpenAI-style error object for an HTTP status. code
// is a short machine-readable code (may be empty).
func OpenAIError(status int, message, code string) []byte {
	type errorObject struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    any     `json:"code"`
	}
	var c any
	if code != "" {
		c = code
	}
	body, _ := json.Marshal(struct {
		Error errorObject `json:"error"`
	}{errorObject{Message: message, Type: openAIErrorType(status), Code: c}})
	return body
}

// openAIErrorType maps an HTTP status to the error type names OpenAI uses.
func openAIErrorType(status int) string {
	switch {
	case status == http.StatusBadRequest:
		return "invalid_request_error"
	case status == http.StatusUnauthorized:
		return "authentication_error"
	case status == http.StatusForbidden:
		return "permission_error"
	case status == http.StatusNotFound:
		return "not_found_error"
	case status == http.StatusTooManyRequests:
		return "rate_limit_error"
	case status == http.StatusServiceUnavailable:
		return "service_unavailable_error"
	case status >= 500:
		return "server_error"
	default:
		return "invalid_request_error"
	}
}

// SetImmediateResponseHeader sets (replaces) a header on an immediate
// response; shapers use it to add headers such as Retry-After.
func SetImmediateResponseHeader(resp *extprocv3.ImmediateResponse, key, value string) {
	if resp.Headers == nil {
		resp.Headers = &extprocv3.HeaderMutation{}
	}
	for _, h := range resp.Headers.SetHeaders {
		if h.Header != nil && strings.EqualFold(h.Header.Key, key) {
			h.Header.RawValue = []byte(value)
			h.Header.Value = ""
			return
		}
	}
	resp.Headers.SetHeaders = append(resp.Headers.SetHeaders, &corev3.HeaderValueOption{
		Header:       &corev3.HeaderValue{Key: key, RawValue: []byte(value)},
		AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
	})
}
