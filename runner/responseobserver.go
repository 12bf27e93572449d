package runner

import (
	"context"
	"errors"
	"io"
	"sync"
	"time"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The response observer (an opt-in of the proxy, --response-observer-wait; README "The response observer").
//
// With GIE's Envoy configuration every streamed response chunk is a round trip through the EPP: Envoy sends it
// FULL_DUPLEX_STREAMED and forwards only what the EPP sends back, so each chunk costs the EPP a decode and an answer
// (encoding, an HTTP/2 frame, a write), and the client waits for both. The EPP only reads the response (the first
// chunk, the usage, the end), so the proxy may instead show it the response without waiting for it:
//
//   - The routing filter (GIE's ext_proc filter) processes the request as ever and skips the response
//     (response_header_mode SKIP, response_body_mode NONE). Envoy then closes its ext_proc stream as the response
//     headers arrive (the filter has "no external processing configured in the encoding path"), by a reset or, with
//     graceful closing, a half-close: the EPP sees the stream end (io.EOF or Canceled) after its request-phase answers,
//     though the request is not over.
//   - A second ext_proc filter on the same cluster, with observability_mode true, sends the response headers and the
//     response body STREAMED and nothing of the request (request_header_mode SKIP), with the attribute request.id
//     (response_attributes), which is the request's x-request-id. In observability mode Envoy sends each message
//     without waiting and ignores any answer ("External processor should not send back processing response");
//     ProcessingRequest.observability_mode is set on every message, and Envoy sends no protocol_config. It opens
//     that stream at the response headers and closes it after deferred_close_timeout (5 s by default) once the HTTP
//     stream is over, unless the EPP ends it first ("External processor may still close the stream").
//
// The EPP joins the two by the request ID. A routing stream whose request headers say the response body is NONE
// (protocol_config) expects an observer (observerJoin.expect) from its request headers on. When the proxy ends it
// after the request was routed, the stream does not hand upstream's handler that end: it waits for its observer, at
// most --response-observer-wait from that moment, and hands upstream's handler the observer's messages as if they had
// come on the routing stream; whatever upstream's handler answers to them is dropped. When the observer's response
// ends (end_of_stream, trailers) or its stream ends (the client went away), upstream's handler sees the end as before
// (a response never completed is completed by upstream's clean-up, as for a client that went away). A routed request
// whose observer does not come within the wait ends then (missing, counted). An observer whose request ID no routing
// stream expects (orphan: the request was answered by the EPP itself, or routed by another replica) is ended at once,
// counted. So every request that enters ends exactly once, on the routing stream's goroutine, in upstream's handler.
//
// Who touches the request's state: upstream's handler owns it on the routing stream's goroutine. The observer's
// goroutine may work on it only while that goroutine waits in Recv for the observer's next message (it holds the
// turn: observedResponse.turn); it then does the hot path's per-chunk work itself for the chunks the stream would
// answer itself (answerChunk, less the answer) and hands over the others (msgs), which returns the turn. So a plain
// chunk costs a decode and the hot path's bookkeeping, with no answer and no goroutine hand-off.
//
// What the proxy no longer gets: any change to the response. Upstream's handler writes the client's model name back
// into each chunk when the request went out with another model (an InferenceModelRewrite) and sets response headers;
// its answers are dropped here, so the client sees the served model's name and the model server's headers.
//
// Limits: both streams of a request must reach the same EPP replica, so the setting is for one replica (or an
// active-passive pair), not for --peers; observer streams Envoy cannot hand the EPP (its flow control in this mode is
// not built, envoyproxy/envoy#33319) are not seen. Upstream's own EPP cannot take it: its handler ends a request when
// the routing stream ends.

// observerOutcome labels the response observer's counter.
type observerOutcome string

const (
	// observerJoined: an observer stream joined its routed request.
	observerJoined observerOutcome = "joined"
	// observerOrphan: an observer stream no routing stream expected; ended at once.
	observerOrphan observerOutcome = "orphan"
	// observerMissing: a routed request's observer did not come within the wait; the request ended then.
	observerMissing observerOutcome = "missing"
	// observerDuplicateID: a routing stream whose request ID another routing stream already expects an observer for.
	// Neither takes an observer then (which response is whose cannot be told): both end with their routing streams,
	// as without the observer.
	observerDuplicateID observerOutcome = "duplicate_id"
)

// observerRecorder counts the response observer's outcomes.
type observerRecorder interface {
	observed(observerOutcome)
}

// requestIDAttribute is the Envoy attribute the observer filter sends (response_attributes): the request's
// x-request-id. Envoy groups attributes under the filter's name.
const (
	requestIDAttribute   = "request.id"
	extProcAttributesKey = "envoy.filters.http.ext_proc"
)

// observerJoin pairs routing streams with their observer streams by request ID.
type observerJoin struct {
	// wait is how long a routed request waits for its observer once the proxy ended its routing stream.
	wait time.Duration
	// after starts that wait (time.After; tests hand their own channel).
	after    func(time.Duration) <-chan time.Time
	recorder observerRecorder

	mu      sync.Mutex
	waiting map[string]*observedResponse
}

func newObserverJoin(wait time.Duration, recorder observerRecorder) *observerJoin {
	return &observerJoin{wait: wait, after: time.After, recorder: recorder, waiting: map[string]*observedResponse{}}
}

// observedResponse is one routed request's side of the join.
type observedResponse struct {
	join *observerJoin
	id   string

	// joined is closed when an observer claims the request; claimed and abandoned are guarded by join.mu.
	joined    chan struct{}
	claimed   bool
	abandoned bool
	// dropped is closed when a second routing stream came with the same request ID before an observer claimed this
	// one: no observer will, and the request ends with its routing stream.
	dropped chan struct{}
	// turn carries the right to touch the request's state from the routing goroutine (waiting in Recv) to the
	// observer's; msgs carries a message back, and with it the turn. msgs is closed when the observer is done.
	turn chan struct{}
	msgs chan *extprocv3.ProcessingRequest
	// routingDone is closed when the routing stream's handler returned: an observer then has nobody to hand to.
	routingDone chan struct{}
	// take is the routing stream's per-chunk work for a message it need not hand upstream's handler (observeChunk);
	// it runs on the observer's goroutine, with the turn.
	take func(*extprocv3.ProcessingRequest) bool
	// waited: the routing stream has started waiting for the observer; ended: it has had its io.EOF (routing
	// goroutine only).
	waited, ended bool
}

// expectsObserver reports whether req, a request's first message, says the proxy skips the response on this
// stream: then the response can only reach the EPP through an observer.
func expectsObserver(req *extprocv3.ProcessingRequest) bool {
	pc := req.GetProtocolConfig()
	return req.GetRequestHeaders() != nil && pc != nil && pc.GetResponseBodyMode() == filterv3.ProcessingMode_NONE
}

// expect registers a routing stream for id. It returns nil when another routing stream already expects id; that one
// is then dropped too unless an observer already claimed it, so that no observer joins the wrong request (which would
// end it early, with another request's usage): both end with their routing streams, as without an observer.
func (j *observerJoin) expect(id string, take func(*extprocv3.ProcessingRequest) bool) *observedResponse {
	j.mu.Lock()
	defer j.mu.Unlock()
	if prev, dup := j.waiting[id]; dup {
		j.recorder.observed(observerDuplicateID)
		if !prev.claimed && !prev.abandoned {
			prev.abandoned = true
			close(prev.dropped)
		}
		return nil
	}
	o := &observedResponse{join: j, id: id, joined: make(chan struct{}), dropped: make(chan struct{}),
		turn: make(chan struct{}, 1), msgs: make(chan *extprocv3.ProcessingRequest), routingDone: make(chan struct{}),
		take: take}
	j.waiting[id] = o
	return o
}

// claim hands an observer stream the routed request of id, or nil (an orphan).
func (j *observerJoin) claim(id string) *observedResponse {
	j.mu.Lock()
	defer j.mu.Unlock()
	o := j.waiting[id]
	if o == nil || o.claimed || o.abandoned {
		j.recorder.observed(observerOrphan)
		return nil
	}
	o.claimed = true
	close(o.joined)
	j.recorder.observed(observerJoined)
	return o
}

// abandon gives up waiting for o's observer; false when an observer claimed it meanwhile (it is then to be read).
func (j *observerJoin) abandon(o *observedResponse) bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	if o.claimed {
		return false
	}
	if !o.abandoned { // dropped as a duplicate, counted then
		o.abandoned = true
		j.recorder.observed(observerMissing)
	}
	return true
}

// release ends the routing stream's part: its handler returned.
func (o *observedResponse) release() {
	j := o.join
	j.mu.Lock()
	if j.waiting[o.id] == o {
		delete(j.waiting, o.id)
	}
	j.mu.Unlock()
	close(o.routingDone)
}

// awaits reports whether the routing stream's end, err, is to be followed by the observer's messages: the request
// was routed, and the proxy ended the stream (it does so as the response headers arrive).
func (o *observedResponse) awaits(err error, routed bool) bool {
	return o != nil && routed && (errors.Is(err, io.EOF) || status.Code(err) == codes.Canceled)
}

// next is the routing stream's Recv once the proxy ended it: the observer's next message for upstream's handler, or
// io.EOF when the observer is done or did not come.
func (o *observedResponse) next() (*extprocv3.ProcessingRequest, error) {
	if o.ended {
		return nil, io.EOF
	}
	if !o.waited {
		o.waited = true
		select {
		case <-o.joined:
		default:
			select {
			case <-o.joined:
			case <-o.dropped:
				o.ended = true
				return nil, io.EOF
			case <-o.join.after(o.join.wait):
				if o.join.abandon(o) {
					o.ended = true
					return nil, io.EOF
				}
			}
		}
	}
	o.turn <- struct{}{} // never blocks: the observer took the last one before it handed a message over
	m, ok := <-o.msgs
	if !ok {
		o.ended = true
		return nil, io.EOF
	}
	return m, nil
}

// serveObserver serves one observer stream whose first message is first: it joins the routed request of the
// request ID first carries, and hands that request's routing stream every message until the response ends or the
// stream does, each readied as the routing stream's (prepareFromProxy; hot: the EPP's hot path). It never answers.
// With wireChunks (gRPC's stream with extProcCodec) a chunk the routing stream took (observedResponse.take, which keeps
// nothing of it) is decoded into again: the codec reuses its wrappers and body for the next chunk.
func (j *observerJoin) serveObserver(stream extprocv3.ExternalProcessor_ProcessServer, first *extprocv3.ProcessingRequest,
	hot, wireChunks bool) error {
	o := j.claim(observedRequestID(first))
	if o == nil {
		return nil // ending the stream tells the proxy it need send no more
	}
	// Closing msgs touches no request state: the routing stream reads the end when it next waits.
	defer close(o.msgs)
	turn := false
	for m := first; ; {
		prepareFromProxy(m, hot)
		if !turn && !o.waitTurn() {
			return nil
		}
		turn = true
		end := endsResponse(m)
		var spare *extprocv3.ProcessingRequest
		if end || !o.take(m) {
			o.msgs <- m
			turn = false
		} else if wireChunks {
			spare = m
		}
		if end {
			return nil
		}
		var err error
		if m, err = recvInto(stream, spare); err != nil {
			return nil // the proxy ended the stream before the response's end: the client went away
		}
	}
}

// recvInto receives stream's next message, decoded into spare when it is not nil (gRPC's RecvMsg; see
// unmarshalProcessingRequest), else into a new message, as the stream's Recv does.
func recvInto(stream extprocv3.ExternalProcessor_ProcessServer, spare *extprocv3.ProcessingRequest) (*extprocv3.ProcessingRequest, error) {
	if spare == nil {
		return stream.Recv()
	}
	if err := stream.RecvMsg(spare); err != nil {
		return nil, err
	}
	return spare, nil
}

// waitTurn waits until upstream's handler waits for the next message; false when the routing stream is gone.
func (o *observedResponse) waitTurn() bool {
	select {
	case <-o.turn:
		return true
	case <-o.routingDone:
		return false
	}
}

// observedRequestID is the request ID an observer's message carries: the request.id attribute (the filter's
// response_attributes), else the x-request-id among its headers.
func observedRequestID(req *extprocv3.ProcessingRequest) string {
	if v := req.GetAttributes()[extProcAttributesKey].GetFields()[requestIDAttribute].GetStringValue(); v != "" {
		return v
	}
	var h *extprocv3.HttpHeaders
	switch r := req.Request.(type) {
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		h = r.ResponseHeaders
	case *extprocv3.ProcessingRequest_RequestHeaders:
		h = r.RequestHeaders
	}
	for _, hv := range h.GetHeaders().GetHeaders() {
		if hv.Key == requestIDHeader {
			if len(hv.RawValue) > 0 {
				return string(hv.RawValue)
			}
			return hv.Value
		}
	}
	return ""
}

// endsResponse reports whether req is the response's last message.
func endsResponse(req *extprocv3.ProcessingRequest) bool {
	switch r := req.Request.(type) {
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		return r.ResponseHeaders.GetEndOfStream()
	case *extprocv3.ProcessingRequest_ResponseBody:
		return r.ResponseBody.GetEndOfStream()
	case *extprocv3.ProcessingRequest_ResponseTrailers:
		return true
	}
	return false
}

// observedContext is the routing stream's context when observers are on: the stream's values, cancelled when the
// proxy ends the stream before the request was routed (a client that went away while queued), but not after, when
// the proxy ends it because the response goes to the observer. A deadline on the stream cancels it the same way
// (before routing only), though ctx.Deadline no longer reports it: nothing on the request path reads it. stop
// releases it.
func observedContext(stream context.Context, routed func() bool) (ctx context.Context, stop func()) {
	ctx, cancel := context.WithCancel(context.WithoutCancel(stream))
	unwatch := context.AfterFunc(stream, func() {
		if !routed() {
			cancel()
		}
	})
	return ctx, func() {
		unwatch()
		cancel()
	}
}
