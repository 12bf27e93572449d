package runner

import (
	"bytes"
	"context"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/common/envoy"
	errcommon "sigs.k8s.io/gateway-api-inference-extension/pkg/common/error"
	logutil "sigs.k8s.io/gateway-api-inference-extension/pkg/common/observability/logging"
	reqcommon "sigs.k8s.io/gateway-api-inference-extension/pkg/common/request"
	fwkdl "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/datalayer"
	fwkplugin "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/plugin"
	fwkrc "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/requestcontrol"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/requestcontrol/requestdataproducer/inflightload"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/handlers"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/requestcontrol"

	"github.com/sluice-gw/sluice/plugins"
)

// Sluice's hot path (WithHotPath): what upstream's handler and Director do for every streamed response chunk, less
// the work whose result nothing reads, and the request body is forwarded without the Director's second encoding of
// its long members (HandleRequest). Every chunk crosses the EPP. Upstream's Director runs every response-body
// plugin on each one (deriving a logger and timing each plugin per chunk) whether any plugin acts on it or not, and
// upstream's handler converts each message's filter metadata into generic maps, which it reads only on the request
// and the response headers. On the hot path the Director hears only the chunks its plugins act on, and response
// body messages reach upstream's handler without their metadata. What every plugin observes is unchanged; what
// changes is upstream's per-plugin latency histogram for the response-body extension point, which no longer counts
// the plugin runs that were skipped. With Sluice's parser the stream goes further (answerChunk): once upstream's
// handler has streamed a response's first chunk, the stream answers each later chunk in which the parser can find no
// usage itself, doing what upstream's handler would do for it, and upstream's handler sees the rest (the last chunk,
// a usage, and every chunk when it logs them at -v=4 and up).

// WithHotPath turns Sluice's hot path on when enabled, asked once the options are complete, reports true. Without
// it, or when enabled reports false, every request takes upstream's path unchanged.
func (r *Runner) WithHotPath(enabled func(opts *Options) bool) *Runner {
	r.hotPath = enabled
	return r
}

// chunkCount is how many non-final response chunks of one ext_proc stream reached the hot Director, and the request
// ID the chunk observers are given (read from the request's headers once, not on every chunk). It travels in the
// stream's context, from which every context upstream's handler passes to the Director derives.
type chunkCount struct {
	n         int
	requestID string

	// The stream's own answers to response chunks (answerChunk). The hot Director sets dir, req, ctx and eventStream
	// on a non-final chunk upstream's handler handed it, when the chunks after it may be answered without that
	// handler; the stream arms the shortcut when upstream's handler then answers that chunk as a streamed one, which
	// shows that the handler streams the response (its own flag for it is unexported) and has sent the response
	// headers' answer.
	dir         *hotDirector
	req         *handlers.RequestContext
	ctx         context.Context // the handler's context for the chunks (its logger, the stream's values)
	eventStream bool            // the parser takes the response for server-sent events
	armed       bool
	// resp is what the chunk observers are handed for the chunks the hot Director skips.
	resp fwkrc.Response
	// target and targetName: the endpoint the chunks the hot Director skips came from and its name, as chunkObserver
	// takes it, named once per stream instead of once per chunk.
	target     *fwkdl.EndpointMetadata
	targetName string
	// proxyHoldsBody: the proxy sends the request body BUFFERED and holds the very body upstream's handler gets (the
	// model selector did not replace it), which it forwards unless the EPP's answer replaces it (bufferedbody.go).
	proxyHoldsBody bool
	// forwardsClientModel: the hot Director forwards the request with the model the client asked for, so the body it
	// forwards is the client's, re-encoded (upstream's Director changes no other member).
	forwardsClientModel bool
}

type chunkCountKey struct{}

func withChunkCount(ctx context.Context) (context.Context, *chunkCount) {
	c := &chunkCount{}
	return context.WithValue(ctx, chunkCountKey{}, c), c
}

// chunkCountOf returns the stream's count, or nil outside a hot-path stream (upstream's clean-up call after a stream
// ended runs on a fresh context, but always for the end of the response).
func chunkCountOf(ctx context.Context) *chunkCount {
	c, _ := ctx.Value(chunkCountKey{}).(*chunkCount)
	return c
}

// chunkInterest says which non-final response chunks the response-body plugins act on. The final one (EndOfStream)
// always reaches them.
type chunkInterest int

const (
	// chunksNone: no plugin acts before the end of the response.
	chunksNone chunkInterest = iota
	// chunksFirst: plugins act on a response's first chunk only (Sluice admission learns there that a streamed
	// request has started answering).
	chunksFirst
	// chunksEvery: some plugin may act on any chunk; upstream's behaviour.
	chunksEvery
)

// responseChunkInterest is, by plugin type, what the response-body plugins known to Sluice act on (each one's
// ResponseBody returns at once for other chunks). Any other type is assumed to act on every chunk, as upstream's
// Director lets it.
var responseChunkInterest = map[string]chunkInterest{
	plugins.FlowControlType:               chunksFirst, // Started on the first chunk, Release at the end
	plugins.PrefixCacheType:               chunksNone,  // calibrates with the final usage
	plugins.InFlightScorerType:            chunksNone,  // stops counting at the end
	inflightload.InFlightLoadProducerType: chunksNone,  // cleans up at the end
}

// chunkObserverTypes are the response-body plugins known to Sluice that act on every chunk but need nothing of the
// Director's per-chunk work (the outlier filter times each chunk of a stream to judge its endpoint's pace): on the
// chunks the others skip, the hot Director hands them the chunk itself, so they do not put every plugin back on every
// chunk.
var chunkObserverTypes = map[string]bool{
	plugins.OutlierFilterType: true,
}

// chunkInterestOf is what the response-body plugins among ps act on, together, and the chunk observers among them
// (chunkObserverTypes), which see every chunk whatever the interest.
func chunkInterestOf(ps []fwkplugin.Plugin) (chunkInterest, []fwkrc.ResponseBody) {
	interest := chunksNone
	var observers []fwkrc.ResponseBody
	for _, p := range ps {
		rb, ok := p.(fwkrc.ResponseBody)
		if !ok {
			continue
		}
		typ := p.TypedName().Type
		if chunkObserverTypes[typ] {
			observers = append(observers, rb)
			continue
		}
		i, known := responseChunkInterest[typ]
		if !known {
			return chunksEvery, nil
		}
		interest = max(interest, i)
	}
	return interest, observers
}

// hotDirector is upstream's Director on the hot path: it runs the response-body plugins only on the chunks they act
// on. On a chunk it skips, the request context ends as upstream's Director leaves it when no plugin sets dynamic
// metadata (the known plugins never do).
type hotDirector struct {
	*requestcontrol.Director
	chunks chunkInterest
	// observers see the chunks the Director skips (chunkObserverTypes); the Director runs them on the others.
	observers []fwkrc.ResponseBody
	// screen is the handler's parser when it can tell the chunks it finds no usage in without decoding them (Sluice's
	// parser), else nil: the stream then answers those chunks itself (answerChunk).
	screen usageScreen
}

// chunkObserver is a chunk observer (chunkObserverTypes) that takes a chunk of request id's streamed response by its
// endpoint's name (plugins.EndpointName): what its ResponseBody does for a non-final chunk from a known endpoint.
type chunkObserver interface {
	ObserveChunk(ctx context.Context, id, endpoint string)
}

var _ chunkObserver = (*plugins.OutlierFilter)(nil)

// usageScreen is a response parser that tells, without decoding them, the streamed chunks its ParseResponse answers
// with no usage and nothing else (plugins.OpenAIParser).
type usageScreen interface {
	EventStream(headers map[string]string) bool
	NamesNoUsage(body []byte) bool
}

var _ handlers.Director = (*hotDirector)(nil)

// HandleRequest implements handlers.Director: upstream's Director, which encodes the payload map again to forward
// the body, with the long members of the body left out of that map and encoded here without encoding/json's scanner
// (plugins.ForwardedBody), byte for byte the body upstream's Director forwards.
func (d *hotDirector) HandleRequest(ctx context.Context, reqCtx *handlers.RequestContext) (*handlers.RequestContext, error) {
	received := reqCtx.Request.RawBody
	ctx, forwarded := plugins.WithForwardedBody(ctx)
	reqCtx, err := d.Director.HandleRequest(ctx, reqCtx)
	if err != nil {
		return reqCtx, err
	}
	if c := chunkCountOf(ctx); c != nil {
		c.forwardsClientModel = reqCtx.IncomingModelName != "" && reqCtx.TargetModelName == reqCtx.IncomingModelName
		if c.proxyHoldsBody && c.forwardsClientModel {
			// The proxy forwards the body it holds, which the stream then does not send back: encoding the forwarded
			// body would be work thrown away, and the request's size is that of the body the model server gets.
			reqCtx.Request.RawBody, reqCtx.RequestSize = received, len(received)
			return reqCtx, nil
		}
	}
	body, ok, err := forwarded.Encode()
	if err != nil {
		return reqCtx, errcommon.Error{Code: errcommon.Internal, Msg: "Error marshalling request body"} // upstream's words
	}
	if ok {
		reqCtx.Request.RawBody = body
		reqCtx.RequestSize = len(body)
	}
	return reqCtx, nil
}

// HandleResponseBody implements handlers.Director.
func (d *hotDirector) HandleResponseBody(ctx context.Context, reqCtx *handlers.RequestContext, endOfStream bool) *handlers.RequestContext {
	if endOfStream || d.chunks == chunksEvery {
		return d.Director.HandleResponseBody(ctx, reqCtx, endOfStream)
	}
	c := chunkCountOf(ctx)
	if c == nil {
		return d.Director.HandleResponseBody(ctx, reqCtx, endOfStream)
	}
	c.n++
	if d.chunks == chunksFirst && c.n == 1 {
		reqCtx = d.Director.HandleResponseBody(ctx, reqCtx, endOfStream)
	} else {
		d.skip(ctx, c, reqCtx)
	}
	d.prepareShortcut(ctx, c, reqCtx)
	return reqCtx
}

// skip is the Director's part of a non-final chunk its plugins do not act on: the chunk observers see it, and no
// plugin's dynamic metadata outlives the chunk it was set on.
func (d *hotDirector) skip(ctx context.Context, c *chunkCount, reqCtx *handlers.RequestContext) {
	if len(d.observers) > 0 {
		if c.requestID == "" {
			c.requestID = reqCtx.Request.Headers[reqcommon.RequestIdHeaderKey]
		}
		// One Response per stream: the observers (chunkObserverTypes) read it during the call only.
		c.resp = fwkrc.Response{
			RequestId: c.requestID,
			Headers:   reqCtx.Response.Headers,
			Usage:     reqCtx.Usage,
		}
		for _, o := range d.observers {
			if co, ok := o.(chunkObserver); ok && reqCtx.TargetPod != nil {
				co.ObserveChunk(ctx, c.observedID(reqCtx), c.targetNameOf(reqCtx.TargetPod))
				continue
			}
			o.ResponseBody(ctx, reqCtx.SchedulingRequest, &c.resp, reqCtx.TargetPod)
		}
	}
	reqCtx.Response.DynamicMetadata = nil
}

// observedID is the request ID a chunk observer's ResponseBody would take for the stream's chunk: the scheduling
// request's, else the response's.
func (c *chunkCount) observedID(reqCtx *handlers.RequestContext) string {
	if r := reqCtx.SchedulingRequest; r != nil && r.RequestId != "" {
		return r.RequestId
	}
	return c.requestID
}

// targetNameOf is plugins.EndpointName(md), kept for the stream's endpoint: a response's chunks all come from one
// endpoint, whose name would otherwise be built again for each.
func (c *chunkCount) targetNameOf(md *fwkdl.EndpointMetadata) string {
	if md != c.target || c.targetName == "" {
		c.target, c.targetName = md, plugins.EndpointName(md)
	}
	return c.targetName
}

// prepareShortcut readies the stream to answer the response's later chunks itself (answerChunk), once per stream:
// only with a parser that screens chunks, and not when upstream's handler would log each chunk (its debug and trace
// lines, which the shortcut does not write).
func (d *hotDirector) prepareShortcut(ctx context.Context, c *chunkCount, reqCtx *handlers.RequestContext) {
	if d.screen == nil || c.req != nil || log.FromContext(ctx).V(logutil.DEBUG).Enabled() {
		return
	}
	c.dir, c.req, c.ctx = d, reqCtx, ctx
	c.eventStream = d.screen.EventStream(reqCtx.Response.Headers)
}

// dropResponseBodyMetadata removes the filter metadata of a response body message. Upstream's handler converts
// every message's metadata into the request context's generic map (structpb.AsMap, five allocations for the data
// plane's one namespace), and reads that map only when it routes the request and hands the response headers to the
// plugins; a body chunk's copy is overwritten unread by the next message.
func dropResponseBodyMetadata(req *extprocv3.ProcessingRequest) {
	if req.GetResponseBody() != nil {
		req.MetadataContext = nil
	}
}

// answerChunk answers a response chunk as upstream's handler would, without it, and reports whether it did: a
// non-final, non-empty chunk of a streamed response, once the stream is armed (chunkCount), that the parser finds no
// usage in. For such a chunk upstream's handler adds its size to the response's, hands the parser (which finds
// nothing) and the hot Director (which hands the chunk observers) the chunk, writes the client's model name back into
// it and sends it on as a streamed body mutation; upstream's per-chunk work around that (the message's metadata
// converted into a map nothing reads before the next message replaces it, the logger looked up, a log line's
// arguments boxed, the answer built through a slice) is what is saved. A chunk with anything else to it (a usage,
// the end of the stream, no bytes) takes upstream's handler. The request context is upstream's, touched only from
// the stream's goroutine, between two of the handler's Recv calls, as the handler itself does.
func (s *shapingStream) answerChunk(req *extprocv3.ProcessingRequest) (bool, error) {
	b := s.takeChunk(req)
	if b == nil {
		return false, nil
	}
	r := s.chunks.req
	chunk := rewriteModelName(b.Body, r.TargetModelName, r.IncomingModelName)
	for off := 0; off < len(chunk); off += envoy.BodyByteLimit { // upstream's envoy.BuildChunkedBodyResponses
		part := chunk[off:min(off+envoy.BodyByteLimit, len(chunk))]
		var err error
		if s.wireChunks {
			s.answer.Body = part
			err = s.ExternalProcessor_ProcessServer.SendMsg(&s.answer)
			s.answer.Body = nil // the chunk's bytes are the spare message's, decoded into again (recvMessage)
		} else {
			err = s.ExternalProcessor_ProcessServer.Send(newChunkAnswer(part))
		}
		if err != nil {
			return true, status.Errorf(codes.Unknown, "failed to send response back to Envoy: %v", err) // upstream's words
		}
	}
	return true, nil
}

// takeChunk does upstream's handler's work for a chunk the stream answers itself (answerChunk), but the answer, and
// returns the chunk; nil when the chunk is upstream's handler's to answer.
func (s *shapingStream) takeChunk(req *extprocv3.ProcessingRequest) *extprocv3.HttpBody {
	c := s.chunks
	if c == nil || !c.armed {
		return nil
	}
	b := req.GetResponseBody()
	r := c.req
	if b == nil || b.EndOfStream || r.ResponseComplete || r.RequestState != handlers.HeaderResponseResponseComplete ||
		!c.eventStream || !c.dir.screen.NamesNoUsage(b.Body) || c.ctx.Err() != nil {
		return nil
	}
	r.ResponseSize += len(b.Body)
	c.n++
	c.dir.skip(c.ctx, c, r)
	return b
}

// observeChunk is takeChunk for a chunk the response observer shows (responseobserver.go), which nobody answers:
// it reports whether upstream's handler need not see it.
func (s *shapingStream) observeChunk(req *extprocv3.ProcessingRequest) bool {
	return s.takeChunk(req) != nil
}

// chunkAnswer is the answer to a response chunk upstream's handler sends (a streamed body mutation that does not end
// the stream), its seven messages allocated as one.
type chunkAnswer struct {
	resp     extprocv3.ProcessingResponse
	body     extprocv3.ProcessingResponse_ResponseBody
	bodyResp extprocv3.BodyResponse
	common   extprocv3.CommonResponse
	mutation extprocv3.BodyMutation
	streamed extprocv3.BodyMutation_StreamedResponse
	chunk    extprocv3.StreamedBodyResponse
}

func newChunkAnswer(chunk []byte) *extprocv3.ProcessingResponse {
	a := &chunkAnswer{}
	a.chunk.Body = chunk
	a.streamed.StreamedResponse = &a.chunk
	a.mutation.Mutation = &a.streamed
	a.common.BodyMutation = &a.mutation
	a.bodyResp.Response = &a.common
	a.body.ResponseBody = &a.bodyResp
	a.resp.Response = &a.body
	return &a.resp
}

// armShortcut arms the stream's shortcut (answerChunk) when upstream's handler answers the non-final chunk the hot
// Director prepared it on as a streamed body mutation.
func (s *shapingStream) armShortcut(resp *extprocv3.ProcessingResponse) {
	c := s.chunks
	if c == nil || c.req == nil || c.armed {
		return
	}
	if sr := resp.GetResponseBody().GetResponse().GetBodyMutation().GetStreamedResponse(); sr != nil && !sr.EndOfStream {
		c.armed = true
	}
}

// rewriteModelName is upstream's handler's (handlers.rewriteModelName, unexported): the served model's name in a
// response chunk becomes the name the client asked for.
func rewriteModelName(body []byte, targetModel, incomingModel string) []byte {
	if targetModel == "" || incomingModel == "" || targetModel == incomingModel {
		return body
	}
	old := []byte(`"model":"` + targetModel + `"`)
	new := []byte(`"model":"` + incomingModel + `"`)
	result := bytes.ReplaceAll(body, old, new)
	if !bytes.Equal(result, body) {
		return result
	}
	old = []byte(`"model": "` + targetModel + `"`)
	new = []byte(`"model": "` + incomingModel + `"`)
	return bytes.ReplaceAll(body, old, new)
}
