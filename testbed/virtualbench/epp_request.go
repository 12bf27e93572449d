package virtualbench

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	errcommon "sigs.k8s.io/gateway-api-inference-extension/pkg/common/error"
	reqcommon "sigs.k8s.io/gateway-api-inference-extension/pkg/common/request"
	fwkdl "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/datalayer"
	fwkrc "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/requestcontrol"
	fwksched "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/scheduling"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/handlers"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/metadata"

	"github.com/sluice-gw/sluice/plugins"
)

// A request's way through the in-process EPP, in the order of upstream's ext_proc handler and Director: Route
// (headers, parse, admission), Resume (what admission decided: schedule, or answer the rejection), then the response
// hooks.

// Route takes a request through the EPP. done is called exactly once with the answer: before Route returns, or,
// when the request waits in admission, from the EPP call (or Resume after a clock callback) that dispatches or
// rejects it. done must not call the EPP.
func (p *inProcessEPP) Route(req eppRequest, done func(eppAnswer)) {
	if _, dup := p.requests[req.ID]; dup || req.ID == "" {
		done(eppAnswer{Endpoint: -1, Status: 400, Message: fmt.Sprintf("request ID %q is empty or already in flight", req.ID)})
		return
	}
	st := &eppState{id: req.ID, done: done}
	p.requests[req.ID] = st
	var err error
	p.call(func(ctx context.Context) { err = p.prepare(ctx, st, req) })
	if err != nil {
		p.fail(st, err)
		return
	}
	p.call(func(ctx context.Context) {
		if p.fc != nil {
			p.fc.Submit(st.rc, st.rc.Priority, func(err error, cancelled bool) {
				p.pending = append(p.pending, admitted{st: st, err: err, cancelled: cancelled})
			})
			return
		}
		err := p.legacy.Admit(ctx, st.rc, st.rc.Priority)
		p.pending = append(p.pending, admitted{st: st, err: err})
	})
	p.Resume()
}

// prepare is the ext_proc handler's header and body handling and the first half of Director.HandleRequest: it
// fills the request context up to the LLMRequest admission sees.
func (p *inProcessEPP) prepare(ctx context.Context, st *eppState, req eppRequest) error {
	headers := make(map[string]string, len(req.Headers)+1)
	for k, v := range req.Headers {
		headers[k] = v
	}
	headers[reqcommon.RequestIdHeaderKey] = req.ID
	rc := &handlers.RequestContext{
		Request:  &handlers.Request{Headers: headers, RawBody: req.Body, Metadata: map[string]any{}},
		Response: &handlers.Response{Headers: map[string]string{}},
	}
	st.rc = rc
	rc.FairnessID = headers[metadata.FlowFairnessIDKey]
	if rc.FairnessID == "" {
		rc.FairnessID = metadata.DefaultFairnessID
	}
	rc.ObjectiveKey = headers[metadata.ObjectiveKey]
	rc.TargetModelName = headers[metadata.ModelNameRewriteKey]
	rc.RequestSize = len(req.Body)

	body, err := p.parser.ParseRequest(ctx, req.Body, headers)
	if err != nil {
		return errcommon.Error{Code: errcommon.BadRequest, Msg: err.Error()}
	}
	switch payload := body.Payload.(type) {
	case fwksched.PayloadMap:
		model, ok := payload["model"].(string)
		if !ok {
			return errcommon.Error{Code: errcommon.BadRequest, Msg: "model not found in request body"}
		}
		rc.IncomingModelName = model
		if rc.TargetModelName == "" {
			rc.TargetModelName = model
		}
		payload["model"] = rc.TargetModelName
	case fwksched.PayloadProto, fwksched.RawPayload:
	default:
		return errcommon.Error{Code: errcommon.BadRequest, Msg: "Unsupported llmRequest parsedBody"}
	}
	rc.Priority = p.objectives[rc.ObjectiveKey]
	rc.SchedulingRequest = &fwksched.LLMRequest{
		RequestId:        req.ID,
		TargetModel:      rc.TargetModelName,
		Body:             body,
		Headers:          headers,
		Objectives:       fwksched.RequestObjectives{Priority: rc.Priority},
		RequestSizeBytes: rc.RequestSize,
	}
	return nil
}

// Resume continues every request whose admission was decided since the last call: it is scheduled and answered, or
// answered with the rejection. The EPP's own methods call it; call it after running the clock's callbacks, which
// may time requests out of the admission queue.
func (p *inProcessEPP) Resume() {
	if p.resuming {
		return
	}
	p.resuming = true
	defer func() { p.resuming = false }()
	for i := 0; i < len(p.pending); i++ {
		a := p.pending[i]
		p.pending[i] = admitted{}
		switch {
		case a.cancelled:
			delete(p.requests, a.st.id)
			a.st.done(eppAnswer{Endpoint: -1, Cancelled: true, Message: "withdrawn while waiting for admission"})
		case a.err != nil:
			p.fail(a.st, a.err)
		default:
			var answer eppAnswer
			var err error
			p.call(func(ctx context.Context) { answer, err = p.schedule(ctx, a.st) })
			if err != nil {
				p.fail(a.st, err)
				continue
			}
			a.st.routed = true
			a.st.done(answer)
		}
	}
	p.pending = p.pending[:0]
}

// schedule is the second half of Director.HandleRequest, after admission: it returns where st goes, or the error
// that is its answer.
func (p *inProcessEPP) schedule(ctx context.Context, st *eppState) (eppAnswer, error) {
	req := st.rc.SchedulingRequest
	cands := p.schedulerCandidates(ctx, st)
	for _, pd := range p.prepareData {
		// Upstream logs a PrepareData failure and schedules anyway.
		if err := pd.PrepareRequestData(ctx, req, cands); err != nil {
			break
		}
	}
	for _, ap := range p.admitPlugins {
		if ap.AdmitRequest(ctx, req, cands) != nil {
			return eppAnswer{}, errcommon.Error{Code: errcommon.Internal, Msg: "request cannot be admitted"}
		}
	}
	result, err := p.scheduler.Schedule(ctx, req, cands)
	if err != nil {
		return eppAnswer{}, errcommon.Error{Code: errcommon.ResourceExhausted, Msg: fmt.Errorf("failed to find target endpoint: %w", err).Error()}
	}
	var primary *fwksched.ProfileRunResult
	if result != nil {
		primary = result.ProfileResults[result.PrimaryProfileName]
	}
	if primary == nil || len(primary.TargetEndpoints) == 0 {
		return eppAnswer{}, errcommon.Error{Code: errcommon.Internal, Msg: "results must be greater than zero"}
	}
	target := primary.TargetEndpoints[0].GetMetadata()
	idx, ok := p.index[target.NamespacedName.Name]
	if !ok {
		return eppAnswer{}, errcommon.Error{Code: errcommon.Internal, Msg: "scheduler chose unknown endpoint " + target.NamespacedName.String()}
	}
	st.rc.TargetPod = target
	st.rc.TargetEndpoint = p.names[idx]
	for _, pr := range p.preRequest {
		pr.PreRequest(ctx, req, result)
	}
	body := st.rc.Request.RawBody
	if m, ok := req.Body.Payload.(fwksched.PayloadMap); ok {
		if body, err = json.Marshal(m); err != nil {
			return eppAnswer{}, errcommon.Error{Code: errcommon.Internal, Msg: "Error marshalling request body"}
		}
		st.rc.Request.RawBody, st.rc.RequestSize = body, len(body)
	}
	return eppAnswer{Endpoint: idx, Body: body}, nil
}

// schedulerCandidates locates st's candidates as the Director does (the runner puts the request's ID in the Locate
// context) and snapshots them for the scheduler, as the Director's toSchedulerEndpoints does, with UpdateTime as
// upstream's staleness checks must see it (see staleness).
func (p *inProcessEPP) schedulerCandidates(ctx context.Context, st *eppState) []fwksched.Endpoint {
	located := p.candidates.Locate(plugins.WithRequestID(ctx, func() string { return st.id }), st.rc.Request.Metadata)
	now := p.clock.Now()
	out := make([]fwksched.Endpoint, len(located))
	for i, ep := range located {
		s := fwksched.NewEndpoint(ep.GetMetadata(), ep.GetMetrics(), ep.GetAttributes())
		if m := s.GetMetrics(); m != nil {
			m.UpdateTime = p.staleness.updateTime(m.UpdateTime, now)
		}
		out[i] = s
	}
	return out
}

// allEndpoints locates every endpoint of the EPP, as upstream's datastore candidates do without a subset hint.
type allEndpoints struct{ p *inProcessEPP }

// Locate implements contracts.EndpointCandidates.
func (c allEndpoints) Locate(context.Context, map[string]any) []fwkdl.Endpoint {
	out := make([]fwkdl.Endpoint, len(c.p.endpoints))
	for i, ep := range c.p.endpoints {
		out[i] = ep
	}
	return out
}

// stalenessCandidates is the legacy admission controller's candidate source: every endpoint, with UpdateTime as its
// saturation detector must see it.
type stalenessCandidates struct{ p *inProcessEPP }

// Locate implements contracts.EndpointCandidates.
func (c stalenessCandidates) Locate(context.Context, map[string]any) []fwkdl.Endpoint {
	now := c.p.clock.Now()
	out := make([]fwkdl.Endpoint, len(c.p.endpoints))
	for i, ep := range c.p.endpoints {
		m := *ep.GetMetrics() // shallow: the detector reads it only
		m.UpdateTime = c.p.staleness.updateTime(m.UpdateTime, now)
		out[i] = fwkdl.NewEndpoint(ep.GetMetadata(), &m)
	}
	return out
}

// endpointList is FlowControl's view of the pool: the EPP's endpoints, with UpdateTime on the EPP's clock (Sluice's
// admission judges staleness on its injected clock).
type endpointList []*fwkdl.ModelServer

// PodList implements plugins.EndpointLister.
func (l endpointList) PodList(predicate func(fwkdl.Endpoint) bool) []fwkdl.Endpoint {
	out := make([]fwkdl.Endpoint, 0, len(l))
	for _, ep := range l {
		if predicate(ep) {
			out = append(out, ep)
		}
	}
	return out
}

// fail answers st as the EPP answers an error: upstream's immediate response for the error's code, shaped by Sluice
// admission (Retry-After, shed reason, OpenAI body) when it is on.
func (p *inProcessEPP) fail(st *eppState, err error) {
	delete(p.requests, st.id)
	resp, berr := errcommon.BuildErrResponse(err)
	if berr != nil {
		st.done(eppAnswer{Endpoint: -1, Status: 500, Message: berr.Error()})
		return
	}
	imm := resp.GetImmediateResponse()
	if p.fc != nil {
		p.call(func(ctx context.Context) { p.fc.ShapeImmediateResponse(ctx, st.id, imm) })
	}
	r := eppAnswer{Endpoint: -1, Status: int(imm.GetStatus().GetCode()), Message: string(imm.GetBody())}
	for _, h := range imm.GetHeaders().GetSetHeaders() {
		if hv := h.GetHeader(); hv != nil && strings.EqualFold(hv.GetKey(), "retry-after") {
			v := string(hv.GetRawValue())
			if v == "" {
				v = hv.GetValue()
			}
			if secs, err := strconv.ParseInt(v, 10, 64); err == nil && secs >= 0 {
				r.RetryAfter, r.RetryAfterSet = time.Duration(secs)*time.Second, true
			}
		}
	}
	st.done(r)
}

// ResponseHeader runs the ResponseHeader plugins for a routed request whose response headers arrived (lower-case
// keys; content-type tells the parser whether the body streams).
func (p *inProcessEPP) ResponseHeader(id string, headers map[string]string) {
	st := p.requests[id]
	if st == nil || !st.routed {
		return
	}
	for k, v := range headers {
		st.rc.Response.Headers[k] = v
	}
	resp := &fwkrc.Response{RequestId: id, Headers: st.rc.Response.Headers, ReqMetadata: st.rc.Request.Metadata}
	p.call(func(ctx context.Context) {
		for _, h := range p.respHeader {
			h.ResponseHeader(ctx, st.rc.SchedulingRequest, resp, st.rc.TargetPod)
		}
	})
}

// ResponseChunk runs the ResponseBody plugins for a non-final chunk of a routed request's streamed response, as
// upstream does for every chunk. Callers may report only the first chunk: no plugin acts on later ones (Sluice
// admission counts a streamed request as pending on its endpoint until its first chunk).
func (p *inProcessEPP) ResponseChunk(id string) {
	st := p.requests[id]
	if st == nil || !st.routed {
		return
	}
	resp := &fwkrc.Response{RequestId: id, Headers: st.rc.Response.Headers, Usage: st.rc.Usage}
	p.responseBody(st, resp)
}

// ResponseComplete ends a routed request: the configured parser reads the usage from the last body chunk (for a
// stream, the usage event and [DONE]; nil when the client went away), and the ResponseBody plugins run once with
// EndOfStream, as upstream runs them at the end of every response, after errors and disconnects too. Sluice
// admission releases the request's reservation here, which may dispatch waiting requests.
func (p *inProcessEPP) ResponseComplete(id string, lastChunk []byte) {
	st := p.requests[id]
	if st == nil || !st.routed {
		return
	}
	delete(p.requests, id)
	if len(lastChunk) > 0 {
		p.call(func(ctx context.Context) {
			parsed, err := p.parser.ParseResponse(ctx, lastChunk, st.rc.Response.Headers, true)
			if err == nil && parsed != nil && parsed.Usage != nil {
				st.rc.Usage = *parsed.Usage
			}
		})
	}
	resp := &fwkrc.Response{RequestId: id, Headers: st.rc.Response.Headers, EndOfStream: true, Usage: st.rc.Usage}
	p.responseBody(st, resp)
}

// responseBody runs the ResponseBody plugins on resp, then continues what they decided in admission.
func (p *inProcessEPP) responseBody(st *eppState, resp *fwkrc.Response) {
	p.call(func(ctx context.Context) {
		for _, h := range p.respBody {
			h.ResponseBody(ctx, st.rc.SchedulingRequest, resp, st.rc.TargetPod)
		}
	})
	p.Resume()
}

// Cancel is the client going away: a request waiting in admission is withdrawn (its done gets Cancelled), a routed
// one ends as ResponseComplete without a body. Unknown IDs are ignored.
func (p *inProcessEPP) Cancel(id string) {
	st := p.requests[id]
	switch {
	case st == nil:
	case st.routed:
		p.ResponseComplete(id, nil)
	case p.fc != nil && p.fc.Controller().Cancel(id):
		p.Resume()
	}
}
