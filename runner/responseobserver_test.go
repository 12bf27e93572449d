package runner

import (
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
	"k8s.io/utils/clock"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
)

// chanStream is the proxy's side of one ext_proc stream, fed by the test: Recv hands out what arrives on in, and once
// in is closed it cancels the stream's context when cancelAtEnd (Envoy's reset) and returns end (io.EOF when nil).
type chanStream struct {
	grpc.ServerStream
	ctx         context.Context
	cancel      context.CancelFunc
	in          chan *extprocv3.ProcessingRequest
	end         error
	cancelAtEnd bool

	// drained is closed when the handler first waits for a message the test has not given yet.
	drained     chan struct{}
	drainedOnce sync.Once

	mu   sync.Mutex
	sent []string
}

func newChanStream(msgs ...*extprocv3.ProcessingRequest) *chanStream {
	ctx, cancel := context.WithCancel(context.Background())
	s := &chanStream{ctx: ctx, cancel: cancel, in: make(chan *extprocv3.ProcessingRequest, len(msgs)+1), drained: make(chan struct{})}
	for _, m := range msgs {
		s.in <- m
	}
	return s
}

func (s *chanStream) Context() context.Context { return s.ctx }

func (s *chanStream) Recv() (*extprocv3.ProcessingRequest, error) {
	var m *extprocv3.ProcessingRequest
	var ok bool
	select {
	case m, ok = <-s.in:
	default:
		s.drainedOnce.Do(func() { close(s.drained) })
		m, ok = <-s.in
	}
	if ok {
		return m, nil
	}
	if s.cancelAtEnd {
		s.cancel()
		synctest.Wait() // whatever watches the context has seen it end
	}
	if s.end != nil {
		return nil, s.end
	}
	return nil, io.EOF
}

func (s *chanStream) Send(r *extprocv3.ProcessingResponse) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sent = append(s.sent, kindOf(r))
	return nil
}

func (s *chanStream) sentKinds() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.sent)
}

// kindOf names a message by its oneof: "request_headers", "response_body", "immediate_response" ...
func kindOf(m interface{ String() string }) string {
	kind, _, _ := strings.Cut(m.String(), ":")
	return kind
}

// routingUpstream stands in for upstream's handler as far as the join goes: it reads the stream until it ends (its
// clean-up ends the request then), recording each message's kind, whether the stream's context had ended when it
// read it, and the end; it answers each message as upstream does (the request phase, which routes the request, or an
// immediate response to the body when reject), and with blockOnBody waits on the body until the context ends, as
// a request queued in admission does.
type routingUpstream struct {
	extprocv3.UnimplementedExternalProcessorServer
	reject, blockOnBody bool

	got       []string
	ctxEnded  []string // kinds read after the stream's context ended
	ends      int
	queuedErr error
}

func (u *routingUpstream) Process(s extprocv3.ExternalProcessor_ProcessServer) error {
	ctx := s.Context()
	for {
		req, err := s.Recv()
		if err != nil {
			u.got = append(u.got, "end")
			u.ends++
			return nil
		}
		kind := kindOf(req)
		u.got = append(u.got, kind)
		if ctx.Err() != nil {
			u.ctxEnded = append(u.ctxEnded, kind)
		}
		switch req.Request.(type) {
		case *extprocv3.ProcessingRequest_RequestHeaders:
			continue // upstream answers the headers once the body is complete
		case *extprocv3.ProcessingRequest_RequestBody:
			if u.blockOnBody {
				<-ctx.Done()
				u.queuedErr = ctx.Err()
				u.ends++
				return nil
			}
			if u.reject {
				u.ends++
				return s.Send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{
					ImmediateResponse: &extprocv3.ImmediateResponse{}}})
			}
			headers := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{}}
			if err := s.Send(emptyAnswer(headers)); err != nil { // the headers' answer, then the body's
				return err
			}
		}
		if err := s.Send(emptyAnswer(req)); err != nil {
			return err
		}
	}
}

// countingRecorder counts the join's outcomes.
type countingRecorder struct {
	mu     sync.Mutex
	counts map[observerOutcome]int
	joined chan struct{} // closed at the first join
}

func newCountingRecorder() *countingRecorder {
	return &countingRecorder{counts: map[observerOutcome]int{}, joined: make(chan struct{})}
}

func (r *countingRecorder) observed(o observerOutcome) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.counts[o]++
	if o == observerJoined && r.counts[o] == 1 {
		close(r.joined)
	}
}

func (r *countingRecorder) snapshot() map[observerOutcome]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return maps.Clone(r.counts)
}

func routingHeaders(id string, response filterv3.ProcessingMode_BodySendMode) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{
		Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
			Headers: headerList(":method", "POST", "x-request-id", id)}},
		ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED,
			ResponseBodyMode: response},
	}
}

func requestBody() *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{
		Body: []byte(`{"model":"m"}`), EndOfStream: true}}}
}

func observedHeaders(id string) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{ObservabilityMode: true,
		Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
			Headers: headerList(":status", "200", "content-type", "text/event-stream")}},
		Attributes: map[string]*structpb.Struct{extProcAttributesKey: {Fields: map[string]*structpb.Value{
			requestIDAttribute: structpb.NewStringValue(id)}}},
	}
}

func observedChunk(end bool) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{ObservabilityMode: true, Request: &extprocv3.ProcessingRequest_ResponseBody{
		ResponseBody: &extprocv3.HttpBody{Body: []byte("data: {}\n\n"), EndOfStream: end}}}
}

// TestResponseObserverJoins (in a synctest bubble, so that the stream context's watcher has run when a reset stream
// returns its end): every request that enters ends exactly once, in upstream's handler, on the routing
// stream: with its observer's response when one joins (before or after the proxy ended the routing stream, which
// then does not end the request), at the wait's end when none comes, at once when the EPP answered it itself or the
// proxy streams the response on the routing stream (GIE's configuration); the proxy gets no answer on an observer
// stream and none to the response on the routing stream; an observer no routed request expects is ended at once.
func TestResponseObserverJoins(t *testing.T) {
	routed := []string{"request_headers", "request_body"}
	response := []string{"response_headers", "response_body", "response_body"}
	for _, tc := range []struct {
		name string
		// routing's messages; routingOpen keeps the routing stream open until an observer joined; routingEnd is its
		// end, cancelling its context as Envoy's reset does.
		routing     []*extprocv3.ProcessingRequest
		routingOpen bool
		routingEnd  error
		upstream    routingUpstream
		// observer's messages (none: no observer); observerFirst starts it before the routing stream ends.
		observer      []*extprocv3.ProcessingRequest
		observerFirst bool
		// waitFires: the wait for the observer ends at once (no observer comes in time).
		waitFires     bool
		cancelRouting bool // the client goes away while the request is queued

		wantUpstream   []string
		wantRoutingOut []string
		wantCounts     map[observerOutcome]int
	}{
		{
			name:           "joined after the routing stream ended",
			routing:        []*extprocv3.ProcessingRequest{routingHeaders("r1", filterv3.ProcessingMode_NONE), requestBody()},
			observer:       []*extprocv3.ProcessingRequest{observedHeaders("r1"), observedChunk(false), observedChunk(true)},
			wantUpstream:   slices.Concat(routed, response, []string{"end"}),
			wantRoutingOut: []string{"request_headers", "request_body"},
			wantCounts:     map[observerOutcome]int{observerJoined: 1},
		},
		{
			name:           "joined before the routing stream ended",
			routing:        []*extprocv3.ProcessingRequest{routingHeaders("r1", filterv3.ProcessingMode_NONE), requestBody()},
			routingOpen:    true,
			observer:       []*extprocv3.ProcessingRequest{observedHeaders("r1"), observedChunk(false), observedChunk(true)},
			observerFirst:  true,
			wantUpstream:   slices.Concat(routed, response, []string{"end"}),
			wantRoutingOut: []string{"request_headers", "request_body"},
			wantCounts:     map[observerOutcome]int{observerJoined: 1},
		},
		{
			name:           "the routing stream reset after routing: its context does not end the request's",
			routing:        []*extprocv3.ProcessingRequest{routingHeaders("r1", filterv3.ProcessingMode_NONE), requestBody()},
			routingEnd:     status.Error(codes.Canceled, "reset"),
			observer:       []*extprocv3.ProcessingRequest{observedHeaders("r1"), observedChunk(false), observedChunk(true)},
			wantUpstream:   slices.Concat(routed, response, []string{"end"}),
			wantRoutingOut: []string{"request_headers", "request_body"},
			wantCounts:     map[observerOutcome]int{observerJoined: 1},
		},
		{
			name:           "the client went away during the response",
			routing:        []*extprocv3.ProcessingRequest{routingHeaders("r1", filterv3.ProcessingMode_NONE), requestBody()},
			observer:       []*extprocv3.ProcessingRequest{observedHeaders("r1"), observedChunk(false)},
			wantUpstream:   slices.Concat(routed, []string{"response_headers", "response_body", "end"}),
			wantRoutingOut: []string{"request_headers", "request_body"},
			wantCounts:     map[observerOutcome]int{observerJoined: 1},
		},
		{
			name:    "a response without a body",
			routing: []*extprocv3.ProcessingRequest{routingHeaders("r1", filterv3.ProcessingMode_NONE), requestBody()},
			observer: []*extprocv3.ProcessingRequest{func() *extprocv3.ProcessingRequest {
				h := observedHeaders("r1")
				h.GetResponseHeaders().EndOfStream = true
				return h
			}()},
			wantUpstream:   slices.Concat(routed, []string{"response_headers", "end"}),
			wantRoutingOut: []string{"request_headers", "request_body"},
			wantCounts:     map[observerOutcome]int{observerJoined: 1},
		},
		{
			name:           "the observer missing: the request ends when the wait does",
			routing:        []*extprocv3.ProcessingRequest{routingHeaders("r1", filterv3.ProcessingMode_NONE), requestBody()},
			waitFires:      true,
			wantUpstream:   slices.Concat(routed, []string{"end"}),
			wantRoutingOut: []string{"request_headers", "request_body"},
			wantCounts:     map[observerOutcome]int{observerMissing: 1},
		},
		{
			name:           "an observer of another request ID is an orphan",
			routing:        []*extprocv3.ProcessingRequest{routingHeaders("r1", filterv3.ProcessingMode_NONE), requestBody()},
			observer:       []*extprocv3.ProcessingRequest{observedHeaders("r2"), observedChunk(true)},
			waitFires:      true,
			wantUpstream:   slices.Concat(routed, []string{"end"}),
			wantRoutingOut: []string{"request_headers", "request_body"},
			wantCounts:     map[observerOutcome]int{observerOrphan: 1, observerMissing: 1},
		},
		{
			name:           "answered by the EPP itself: no wait",
			routing:        []*extprocv3.ProcessingRequest{routingHeaders("r1", filterv3.ProcessingMode_NONE), requestBody()},
			upstream:       routingUpstream{reject: true},
			wantUpstream:   routed,
			wantRoutingOut: []string{"immediate_response"},
			wantCounts:     map[observerOutcome]int{},
		},
		{
			name:           "GIE's configuration: the routing stream's end is the request's",
			routing:        []*extprocv3.ProcessingRequest{routingHeaders("r1", filterv3.ProcessingMode_FULL_DUPLEX_STREAMED), requestBody()},
			wantUpstream:   slices.Concat(routed, []string{"end"}),
			wantRoutingOut: []string{"request_headers", "request_body"},
			wantCounts:     map[observerOutcome]int{},
		},
		{
			name:           "the client went away while the request was queued",
			routing:        []*extprocv3.ProcessingRequest{routingHeaders("r1", filterv3.ProcessingMode_NONE), requestBody()},
			routingOpen:    true,
			upstream:       routingUpstream{blockOnBody: true},
			cancelRouting:  true,
			wantUpstream:   routed,
			wantRoutingOut: nil,
			wantCounts:     map[observerOutcome]int{},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				recorder := newCountingRecorder()
				join := newObserverJoin(time.Hour, recorder)
				waiting := make(chan struct{})
				join.after = func(time.Duration) <-chan time.Time {
					close(waiting) // the routing stream waits for its observer
					if tc.waitFires {
						fired := make(chan time.Time, 1)
						fired <- time.Time{}
						return fired
					}
					return nil
				}
				srv := &shapingServer{upstream: &tc.upstream, observers: join}
				routing := newChanStream(tc.routing...)
				routing.end, routing.cancelAtEnd = tc.routingEnd, tc.routingEnd != nil
				if !tc.routingOpen {
					close(routing.in)
				}
				routingDone := make(chan error, 1)
				go func() { routingDone <- srv.Process(routing) }()

				var observer *chanStream
				observerDone := make(chan error, 1)
				if len(tc.observer) > 0 {
					observer = newChanStream(tc.observer...)
					close(observer.in)
					if !tc.observerFirst {
						select {
						case <-waiting:
						case err := <-routingDone:
							routingDone <- err
						}
					}
					if tc.observerFirst {
						<-routing.drained // routed, and expecting its observer
					}
					go func() { observerDone <- srv.Process(observer) }()
					if tc.observerFirst {
						select {
						case <-recorder.joined:
						case err := <-observerDone:
							observerDone <- err
						}
					}
				}
				if tc.cancelRouting {
					synctest.Wait() // queued: upstream's handler waits on the body
					routing.cancel()
				} else if tc.routingOpen {
					close(routing.in)
				}
				if err := <-routingDone; err != nil {
					t.Fatalf("routing stream: %v", err)
				}
				if observer != nil {
					if err := <-observerDone; err != nil {
						t.Fatalf("observer stream: %v", err)
					}
					if sent := observer.sentKinds(); len(sent) != 0 {
						t.Errorf("the observer stream was answered %v, want nothing", sent)
					}
				}
				u := &tc.upstream
				if !slices.Equal(u.got, tc.wantUpstream) {
					t.Errorf("upstream's handler read %v, want %v", u.got, tc.wantUpstream)
				}
				if u.ends != 1 {
					t.Errorf("the request ended %d times, want once", u.ends)
				}
				if len(u.ctxEnded) > 0 {
					t.Errorf("upstream's handler read %v with its context ended", u.ctxEnded)
				}
				if tc.cancelRouting && u.queuedErr == nil {
					t.Errorf("the queued request's context did not end with its client")
				}
				if sent := routing.sentKinds(); !slices.Equal(sent, tc.wantRoutingOut) {
					t.Errorf("the routing stream was answered %v, want %v", sent, tc.wantRoutingOut)
				}
				if got := recorder.snapshot(); !maps.Equal(got, tc.wantCounts) {
					t.Errorf("outcomes %v, want %v", got, tc.wantCounts)
				}
				if len(join.waiting) != 0 {
					t.Errorf("the join still holds %v", slices.Collect(maps.Keys(join.waiting)))
				}
			})
		})
	}
}

// TestResponseObserverOrphanAlone: an observer stream that no routing stream expects, or whose request already gave
// up waiting, is ended at once, unanswered.
func TestResponseObserverOrphanAlone(t *testing.T) {
	for _, tc := range []struct {
		name    string
		abandon bool
	}{
		{name: "no routing stream"},
		{name: "the routed request gave up waiting", abandon: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			recorder := newCountingRecorder()
			join := newObserverJoin(time.Hour, recorder)
			if tc.abandon {
				o := join.expect("r1", func(*extprocv3.ProcessingRequest) bool { return false })
				join.abandon(o)
			}
			srv := &shapingServer{upstream: &routingUpstream{}, observers: join}
			observer := newChanStream(observedHeaders("r1"), observedChunk(true))
			if err := srv.Process(observer); err != nil {
				t.Fatal(err)
			}
			if sent := observer.sentKinds(); len(sent) != 0 {
				t.Errorf("answered %v, want nothing", sent)
			}
			if got := recorder.snapshot()[observerOrphan]; got != 1 {
				t.Errorf("%d orphans counted, want 1", got)
			}
		})
	}
}

// TestResponseObserverDuplicateID: a second routing stream with a request ID already expected takes no part in the
// join. Before an observer claimed the first, the first is dropped too (which response is whose cannot be told, and
// the wrong one would end it early): an observer of that ID is then an orphan, and the first ends at once with its
// routing stream rather than after the wait. Once claimed, the first keeps its observer.
func TestResponseObserverDuplicateID(t *testing.T) {
	for _, tc := range []struct {
		name          string
		claimFirst    bool
		wantJoined    bool
		wantCounts    map[observerOutcome]int
		wantFirstEnds bool // the first's routing stream reads its end without waiting for an observer
	}{
		{name: "before an observer came: both dropped", wantFirstEnds: true,
			wantCounts: map[observerOutcome]int{observerDuplicateID: 1, observerOrphan: 1}},
		{name: "after the first was claimed: it keeps its observer", claimFirst: true, wantJoined: true,
			wantCounts: map[observerOutcome]int{observerDuplicateID: 1, observerJoined: 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			recorder := newCountingRecorder()
			join := newObserverJoin(time.Hour, recorder)
			take := func(*extprocv3.ProcessingRequest) bool { return false }
			first := join.expect("r1", take)
			var claimed *observedResponse
			if tc.claimFirst {
				claimed = join.claim("r1")
			}
			if second := join.expect("r1", take); first == nil || second != nil {
				t.Fatalf("expect: first %v, second %v; want the first only", first, second)
			}
			if !tc.claimFirst {
				claimed = join.claim("r1")
			}
			if (claimed == first) != tc.wantJoined {
				t.Errorf("an observer joined the first: %v, want %v", claimed == first, tc.wantJoined)
			}
			if tc.wantFirstEnds {
				if _, err := first.next(); err != io.EOF {
					t.Errorf("the first's next: %v, want io.EOF at once", err)
				}
			}
			if got := recorder.snapshot(); !maps.Equal(got, tc.wantCounts) {
				t.Errorf("outcomes %v, want %v", got, tc.wantCounts)
			}
		})
	}
}

// TestObservedOutcomeReachesTheModelSelection: a rewritten request whose response the observer carries reports its
// status, first byte and end to the selector that chose its model, as a streamed one does (a guardrail counting
// outcomes would otherwise see every observed request fail).
func TestObservedOutcomeReachesTheModelSelection(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		selector := &fakeSelector{model: "canary"}
		join := newObserverJoin(time.Hour, newCountingRecorder())
		srv := &shapingServer{upstream: &routingUpstream{}, observers: join, selector: selector, maxBodyBytes: 1 << 20,
			clock: clock.RealClock{}}
		routing := newChanStream(routingHeaders("r1", filterv3.ProcessingMode_NONE), requestBody())
		close(routing.in)
		done := make(chan error, 1)
		go func() { done <- srv.Process(routing) }()
		synctest.Wait() // routed; waiting for its observer
		observer := newChanStream(observedHeaders("r1"), observedChunk(false), observedChunk(true))
		close(observer.in)
		if err := srv.Process(observer); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		got := selector.outcomes // the routing stream's handler returned: its selection finished
		if len(got) != 1 || got[0].Status != 200 || !got[0].Complete || got[0].Immediate {
			t.Errorf("outcomes %+v, want one: status 200, complete", got)
		}
	})
}

// TestObservedRequestID reads the request ID from the request.id attribute, else from x-request-id.
func TestObservedRequestID(t *testing.T) {
	header := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{
		ResponseHeaders: &extprocv3.HttpHeaders{Headers: headerList("x-request-id", "from-header")}}}
	for _, tc := range []struct {
		name string
		req  *extprocv3.ProcessingRequest
		want string
	}{
		{"attribute", observedHeaders("from-attribute"), "from-attribute"},
		{"header", header, "from-header"},
		{"none", observedChunk(false), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := observedRequestID(tc.req); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

// TestObservedChatThroughTheEPP: through Sluice's whole EPP on its hot path, chats whose response an observer shows
// route, end, and get no answer but the request phase's (streamedChat.runObserved checks each).
func TestObservedChatThroughTheEPP(t *testing.T) {
	quietLogs(t)
	h, err := startBenchEPP(t, "sluice-observed")
	if err != nil {
		t.Fatal(err)
	}
	for _, chunks := range []int{1, 2, 16} {
		ex := newStreamedChat(2<<10, chunks)
		ex.observed = true
		for i := range 3 {
			if err := ex.run(h, fmt.Sprintf("observed-%d-%d", chunks, i)); err != nil {
				t.Fatalf("%d chunks, run %d: %v", chunks, i, err)
			}
		}
	}
}

// TestObservedChatCountsAsStreamed: upstream's per-request metrics (response size, output tokens, input tokens, the
// request count, the running requests back to where they were) move by the same amounts for chats whose response an
// observer shows as for chats streamed through the routing stream: the observer's messages end each request as the
// routing stream's would. Both EPPs share the process's registry, so each is measured by the difference it makes.
func TestObservedChatCountsAsStreamed(t *testing.T) {
	quietLogs(t)
	streamed, err := startBenchEPP(t, "sluice")
	if err != nil {
		t.Fatal(err)
	}
	observed, err := startBenchEPP(t, "sluice-observed")
	if err != nil {
		t.Fatal(err)
	}
	const chats, chunks = 5, 24
	moved := func(h benchEPP, observe bool, name string) map[string]float64 {
		before := objectiveFigures(t)
		ex := newStreamedChat(2<<10, chunks)
		ex.observed = observe
		for i := range chats {
			if err := ex.run(h, fmt.Sprintf("%s-%d", name, i)); err != nil {
				t.Fatal(err)
			}
		}
		after := objectiveFigures(t)
		diff := map[string]float64{}
		for k, v := range after {
			diff[k] = v - before[k]
		}
		for k, v := range before {
			if _, ok := after[k]; !ok {
				diff[k] = -v
			}
		}
		return diff
	}
	want := moved(streamed, false, "counts-streamed")
	got := moved(observed, true, "counts-observed")
	if want["inference_objective_output_tokens_sum"] != chats*chunks || want["inference_objective_request_total"] != chats {
		t.Fatalf("the streamed chats moved %v: not the figures this test compares", want)
	}
	if !maps.Equal(got, want) {
		t.Errorf("observed chats moved %v\nstreamed chats moved %v", got, want)
	}
}

// objectiveFigures sums upstream's per-request metrics on the process's registry, by family (histograms as _sum and
// _count).
func objectiveFigures(t *testing.T) map[string]float64 {
	t.Helper()
	families, err := crmetrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range families {
		name := f.GetName()
		switch name {
		case "inference_objective_request_total", "inference_objective_running_requests", "inference_objective_response_sizes",
			"inference_objective_output_tokens", "inference_objective_input_tokens", "inference_objective_request_error_total":
		default:
			continue
		}
		for _, m := range f.GetMetric() {
			switch {
			case m.GetHistogram() != nil:
				out[name+"_sum"] += m.GetHistogram().GetSampleSum()
				out[name+"_count"] += float64(m.GetHistogram().GetSampleCount())
			case m.GetCounter() != nil:
				out[name] += m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				out[name] += m.GetGauge().GetValue()
			}
		}
	}
	return out
}

// TestObserverDecodesIntoTakenChunks: on gRPC's stream with extProcCodec, a chunk the routing stream took is the
// message the observer's next chunk is decoded into, and a message handed to upstream's handler is never decoded into
// again (the handler may keep it).
func TestObserverDecodesIntoTakenChunks(t *testing.T) {
	chunk := func(body string, end bool) *extprocv3.ProcessingRequest {
		c := observedChunk(end)
		c.GetResponseBody().Body = []byte(body)
		return c
	}
	const usage = "data: {\"usage\":{}}\n\n"
	wire := [][]byte{mustMarshal(chunk("data: a longer first chunk\n\n", false)), mustMarshal(chunk("data: b\n\n", false)),
		mustMarshal(chunk(usage, false)), mustMarshal(chunk("data: c\n\n", false)), mustMarshal(chunk("", true))}
	j := newObserverJoin(time.Minute, newCountingRecorder())
	// The routing stream takes every chunk but the usage and the end (observeChunk's part), hands the rest on.
	o := j.expect("r1", func(m *extprocv3.ProcessingRequest) bool {
		b := m.GetResponseBody()
		return b != nil && !b.GetEndOfStream() && string(b.GetBody()) != usage
	})
	type handed struct {
		m    *extprocv3.ProcessingRequest
		body string // as upstream's handler got it
	}
	var got []handed
	done := make(chan struct{})
	go func() { // the routing stream, its proxy gone: upstream's handler reads the observer's messages
		defer close(done)
		for {
			m, err := o.next()
			if err != nil {
				return
			}
			got = append(got, handed{m, string(m.GetResponseBody().GetBody())})
		}
	}()
	proxy := &wireProxyStream{ctx: context.Background(), codec: newExtProcCodec(), in: wire}
	if err := j.serveObserver(proxy, observedHeaders("r1"), true, true); err != nil {
		t.Fatal(err)
	}
	<-done
	if len(got) != 3 || got[1].body != usage || !got[2].m.GetResponseBody().GetEndOfStream() {
		t.Fatalf("upstream's handler got %d messages %v, want the headers, the usage chunk and the end", len(got), got)
	}
	for i, h := range got {
		if now := string(h.m.GetResponseBody().GetBody()); now != h.body {
			t.Errorf("message %d changed after it was handed to upstream's handler: %q, then %q", i, h.body, now)
		}
	}
	// Decoded into: a new message (a), again (b, taken), again (the usage, handed on), a new one (c), again (the end).
	if runs := len(slices.Compact(slices.Clone(proxy.into))); len(proxy.into) != len(wire) || runs != 2 {
		t.Errorf("%d messages decoded into %d runs of one message, want %d into 2", len(proxy.into), runs, len(wire))
	}
}
