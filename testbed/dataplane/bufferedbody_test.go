package dataplane

import (
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	envoytypev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
)

// bufferedBodyAnswer answers a BUFFERED request body: a header mutation routing to dest (header and envoy.lb
// metadata), plus setHeaders, and mutation as the body mutation (nil: none).
func bufferedBodyAnswer(dest string, mutation *extprocv3.BodyMutation, kv ...string) func(*seenExchange) []*extprocv3.ProcessingResponse {
	return func(*seenExchange) []*extprocv3.ProcessingResponse {
		return []*extprocv3.ProcessingResponse{{
			Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{
				HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: setHeaders(append([]string{"x-gateway-destination-endpoint", dest}, kv...)...)},
				BodyMutation:   mutation,
			}}},
			DynamicMetadata: lbMetadata(dest),
		}}
	}
}

func replaceBody(b string) *extprocv3.BodyMutation {
	return &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_Body{Body: []byte(b)}}
}

// TestBufferedRequestBody: with RequestBodyMode BodyBuffered the proxy behaves as Envoy with request_body_mode
// BUFFERED and request headers SEND: it announces the mode, sends the body whole and only once the headers are
// answered, applies a header mutation from the body's answer, forwards its own body unless the answer replaces it,
// and holds the EPP to a content-length that matches the body forwarded.
func TestBufferedRequestBody(t *testing.T) {
	const client = `{"model":"orig","prompt":"hi"}`
	const rewritten = `{"model":"rewritten","prompt":"hi"}`
	tests := []struct {
		name   string
		epp    eppBehaviour
		status int
		// upstream is the body the backend must get ("" when it must get no request), upstreamHeader a header it must have.
		upstream       string
		upstreamHeader string
		// eppBody is how many body messages the EPP must have seen.
		eppBody int
	}{
		{
			name:     "no body mutation: the client's body, routed by the body's answer",
			epp:      eppBehaviour{},
			status:   http.StatusOK,
			upstream: client, upstreamHeader: "X-Added", eppBody: 1,
		},
		{
			name:     "body replaced with its content-length",
			epp:      eppBehaviour{decide: bufferedBodyAnswer("", replaceBody(rewritten), "x-added", "yes", "content-length", strconv.Itoa(len(rewritten)))},
			status:   http.StatusOK,
			upstream: rewritten, upstreamHeader: "X-Added", eppBody: 1,
		},
		{
			name:    "body replaced, content-length left as the client's: rejected as Envoy does",
			epp:     eppBehaviour{decide: bufferedBodyAnswer("", replaceBody(rewritten), "x-added", "yes")},
			status:  http.StatusInternalServerError,
			eppBody: 1,
		},
		{
			name:    "content-length changed without a body mutation: rejected",
			epp:     eppBehaviour{decide: bufferedBodyAnswer("", nil, "content-length", "99")},
			status:  http.StatusInternalServerError,
			eppBody: 1,
		},
		{
			name: "a streamed_response answers a buffered body: a protocol error",
			epp: eppBehaviour{decide: bufferedBodyAnswer("", &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_StreamedResponse{
				StreamedResponse: &extprocv3.StreamedBodyResponse{Body: []byte(client), EndOfStream: true}}})},
			status:  http.StatusInternalServerError,
			eppBody: 1,
		},
		{
			name:    "immediate response to the headers: the body is never sent",
			epp:     eppBehaviour{headersAnswer: immediate(envoytypev3.StatusCode_TooManyRequests, `{"error":{}}`)},
			status:  http.StatusTooManyRequests,
			eppBody: 0,
		},
		{
			name: "immediate response to the body",
			epp: eppBehaviour{decide: func(*seenExchange) []*extprocv3.ProcessingResponse {
				return []*extprocv3.ProcessingResponse{immediate(envoytypev3.StatusCode_TooManyRequests, `{"error":{}}`)}
			}},
			status:  http.StatusTooManyRequests,
			eppBody: 1,
		},
		{
			name:    "headers never answered: the body waits, and the request times out",
			epp:     eppBehaviour{stallHeaders: true},
			status:  http.StatusGatewayTimeout,
			eppBody: 0,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			backend := startBackend(t, "b", nil)
			if tt.epp.decide == nil {
				tt.epp.decide = bufferedBodyAnswer(backend.addr(), nil, "x-added", "yes")
			} else {
				decide := tt.epp.decide
				tt.epp.decide = func(s *seenExchange) []*extprocv3.ProcessingResponse {
					answers := decide(s)
					if hm := answers[0].GetRequestBody().GetResponse().GetHeaderMutation(); hm != nil {
						hm.SetHeaders[0].Header.RawValue = []byte(backend.addr())
						answers[0].DynamicMetadata = lbMetadata(backend.addr())
					}
					return answers
				}
			}
			epp := startFakeEPP(t, tt.epp)
			proxy, rec := startProxy(t, Config{EPPAddress: epp.addr, RequestBodyMode: BodyBuffered, MessageTimeout: 2 * time.Second})
			code, _, body := post(t, proxy.URL+"/v1/completions", client)
			if code != tt.status {
				t.Fatalf("status %d (%s), want %d", code, body, tt.status)
			}
			rec.snapshot(1) // the exchange is over
			n, bodies, headers := backend.received()
			switch {
			case tt.upstream == "" && n != 0:
				t.Errorf("the backend got %d requests (%q), want none", n, bodies)
			case tt.upstream != "" && (n != 1 || bodies[0] != tt.upstream):
				t.Errorf("the backend got %d requests, bodies %q, want %q", n, bodies, tt.upstream)
			case tt.upstreamHeader != "" && headers[0].Get(tt.upstreamHeader) == "":
				t.Errorf("the backend's request lacks %s: %v", tt.upstreamHeader, headers[0])
			}
			ex := epp.exchanges()
			if len(ex) != 1 {
				t.Fatalf("the EPP saw %d streams, want 1", len(ex))
			}
			s := ex[0]
			if s.protocolConfig.GetRequestBodyMode() != filterv3.ProcessingMode_BUFFERED ||
				s.protocolConfig.GetResponseBodyMode() != filterv3.ProcessingMode_FULL_DUPLEX_STREAMED || s.headersEOS {
				t.Errorf("protocol config %v, headers end of stream %v; want BUFFERED requests, FULL_DUPLEX_STREAMED responses, a body to follow",
					s.protocolConfig, s.headersEOS)
			}
			if s.bodyMessages != tt.eppBody || tt.eppBody > 0 && string(s.requestBody) != client {
				t.Errorf("the EPP got %d body messages, %q; want %d, the whole body", s.bodyMessages, s.requestBody, tt.eppBody)
			}
		})
	}
}

// TestBufferedRequestBodyLongPrompt: a body longer than the streamed mode's 32 KiB chunks goes to the EPP in one
// message, and reaches the backend byte for byte when the EPP does not replace it.
func TestBufferedRequestBodyLongPrompt(t *testing.T) {
	backend := startBackend(t, "b", nil)
	epp := startFakeEPP(t, eppBehaviour{decide: bufferedBodyAnswer(backend.addr(), nil)})
	proxy, _ := startProxy(t, Config{EPPAddress: epp.addr, RequestBodyMode: BodyBuffered})
	client := `{"model":"m","prompt":"` + strings.Repeat("tell me more ", 20000) + `"}`
	if code, _, body := post(t, proxy.URL+"/v1/completions", client); code != http.StatusOK {
		t.Fatalf("status %d (%s)", code, body)
	}
	if n, bodies, _ := backend.received(); n != 1 || bodies[0] != client {
		t.Fatalf("the backend got %d requests, want the client's %d-byte body", n, len(client))
	}
	if s := epp.exchanges()[0]; s.bodyMessages != 1 || len(s.requestBody) != len(client) {
		t.Errorf("the EPP got %d body messages of %d bytes, want one of %d", s.bodyMessages, len(s.requestBody), len(client))
	}
}
