package runner

import (
	"context"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	errcommon "sigs.k8s.io/gateway-api-inference-extension/pkg/common/error"
	reqcommon "sigs.k8s.io/gateway-api-inference-extension/pkg/common/request"
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
// the plugin runs that were skipped.

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
}

type chunkCountKey struct{}

func withChunkCount(ctx context.Context) context.Context {
	return context.WithValue(ctx, chunkCountKey{}, &chunkCount{})
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
}

var _ handlers.Director = (*hotDirector)(nil)

// HandleRequest implements handlers.Director: upstream's Director, which encodes the payload map again to forward
// the body, with the long members of the body left out of that map and encoded here without encoding/json's scanner
// (plugins.ForwardedBody), byte for byte the body upstream's Director forwards.
func (d *hotDirector) HandleRequest(ctx context.Context, reqCtx *handlers.RequestContext) (*handlers.RequestContext, error) {
	ctx, forwarded := plugins.WithForwardedBody(ctx)
	reqCtx, err := d.Director.HandleRequest(ctx, reqCtx)
	if err != nil {
		return reqCtx, err
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
		return d.Director.HandleResponseBody(ctx, reqCtx, endOfStream)
	}
	if len(d.observers) > 0 {
		if c.requestID == "" {
			c.requestID = reqCtx.Request.Headers[reqcommon.RequestIdHeaderKey]
		}
		resp := &fwkrc.Response{
			RequestId: c.requestID,
			Headers:   reqCtx.Response.Headers,
			Usage:     reqCtx.Usage,
		}
		for _, o := range d.observers {
			o.ResponseBody(ctx, reqCtx.SchedulingRequest, resp, reqCtx.TargetPod)
		}
	}
	reqCtx.Response.DynamicMetadata = nil
	return reqCtx
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
