package runner

import (
	"encoding/json"
	"strings"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	ctrl "sigs.k8s.io/controller-runtime"

	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/metadata"

	"github.com/sluice-gw/sluice/plugins"
	"github.com/sluice-gw/sluice/plugins/decisiontrace"
)

// DecisionTracePath is where the metrics server serves the decision trace (--decision-trace), behind the same
// authentication and authorization as /metrics.
const DecisionTracePath = "/debug/sluice/decisions"

// maxTracedErrorBytes bounds the error message a record keeps of the EPP's own answer.
const maxTracedErrorBytes = 512

// newDecisionRecorder returns the decision trace's recorder, or nil when --decision-trace is off.
func newDecisionRecorder(opts *Options) (*decisiontrace.Recorder, error) {
	if opts.DecisionTrace == 0 {
		return nil, nil
	}
	return decisiontrace.New(decisiontrace.Config{
		Size:   opts.DecisionTrace,
		Header: opts.DecisionTraceHeader,
		Rate:   opts.DecisionTraceRate,
		Logger: ctrl.Log.WithName("decisions"),
	})
}

// commitTrace records the EPP's answer in resp: the immediate response, or the endpoint the request was routed to.
func (s *shapingStream) commitTrace(resp *extprocv3.ProcessingResponse) {
	if ir := resp.GetImmediateResponse(); ir != nil {
		s.trace.Answered(int(ir.GetStatus().GetCode()), immediateHeader(ir, plugins.ShedReasonHeader),
			immediateHeader(ir, "retry-after"), errorMessage(ir.GetBody()))
		return
	}
	routing := resp.GetRequestHeaders().GetResponse().GetHeaderMutation()
	if b := resp.GetRequestBody().GetResponse(); b.GetBodyMutation().GetStreamedResponse() == nil && b.GetHeaderMutation() != nil {
		routing = b.GetHeaderMutation() // the answer to a BUFFERED body (bufferedbody.go)
	}
	for _, h := range routing.GetSetHeaders() {
		if h.GetHeader().GetKey() == metadata.DestinationEndpointKey {
			s.trace.Routed(headerValue(h.GetHeader()))
		}
	}
}

// carries reports whether h has header name (any case) with a value.
func carries(h *extprocv3.HttpHeaders, name string) bool {
	for _, hv := range h.GetHeaders().GetHeaders() {
		if strings.EqualFold(hv.GetKey(), name) && headerValue(hv) != "" {
			return true
		}
	}
	return false
}

// immediateHeader returns the value an immediate response sets for key.
func immediateHeader(ir *extprocv3.ImmediateResponse, key string) string {
	for _, h := range ir.GetHeaders().GetSetHeaders() {
		if strings.EqualFold(h.GetHeader().GetKey(), key) {
			return headerValue(h.GetHeader())
		}
	}
	return ""
}

// errorMessage is the message of an OpenAI-style error body (the shapers make every immediate response one), or
// the body itself, at most maxTracedErrorBytes of it.
func errorMessage(body []byte) string {
	var e struct {
		Error struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	msg := string(body)
	if json.Unmarshal(body, &e) == nil && e.Error.Message != "" {
		msg = e.Error.Message
	}
	if len(msg) > maxTracedErrorBytes {
		msg = msg[:maxTracedErrorBytes]
	}
	return msg
}
