package runner

import (
	"context"
	"fmt"
	"io"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"

	"github.com/sluice-gw/sluice/runner/runnertest"
)

// BenchmarkInFlightMemory measures what the EPP holds for requests in flight: it opens 1,000 ext_proc streams, each a
// streamed chat with a 2 KB body or a 200 KB one, sent in messages of requestChunkBytes as the data plane sends them,
// and holds them all open, no response ever coming back from the model servers, whose metrics pages report full queues
// once the EPP is warm: upstream's EPP routes every request, which then waits for its response; Sluice admission queues
// every request with its body (as many as its band's limits take; the rest are answered 429 at once). Upstream's EPP
// and Sluice's run one after the other in one process (startBenchEPP). It reports the live heap the EPP holds per
// request in flight (heap-B/request: in-use heap after a GC, with the streams open, less before them), the process's
// resident memory growth per request (rss-B/request, which includes what the first EPP left to the Go runtime), and how
// the requests stand (routed, queued, answered at once).
//
//	go test -run '^$' -bench InFlightMemory -benchtime 1x ./runner/
func BenchmarkInFlightMemory(b *testing.B) {
	quietLogs(b)
	const inFlight, fullQueue = 1000, 100
	for _, promptBytes := range []int{2 << 10, 200 << 10} {
		for _, profile := range []string{"upstream-default", "sluice"} {
			benchmarkInFlightMemory(b, profile, promptBytes, inFlight, fullQueue)
		}
	}
}

// benchmarkInFlightMemory is BenchmarkInFlightMemory's run of one EPP profile at one prompt size.
func benchmarkInFlightMemory(b *testing.B, profile string, promptBytes, inFlight int, fullQueue int64) {
	b.Run(fmt.Sprintf("prompt=%dKB/epp=%s", promptBytes>>10, profile), func(b *testing.B) {
		var servers []*runnertest.ModelServer
		for range 4 {
			servers = append(servers, runnertest.StartModelServer(b, "127.0.0.1:0"))
		}
		h, err := startBenchEPP(b, profile, servers...)
		if err != nil {
			b.Fatal(err)
		}
		// Now the servers report full queues: Sluice admission queues every request, upstream's routes them all
		// (its legacy admission sheds only Sheddable requests when the pool is saturated).
		for _, s := range servers {
			s.Waiting.Store(fullQueue)
		}
		time.Sleep(4 * benchRefresh()) // a scrape or two of the full queues
		chat := newStreamedChat(promptBytes, 1)
		for range b.N {
			heapBefore, rssBefore := liveHeap(), residentBytes(b)
			streams := make([]*heldStream, inFlight)
			var wg sync.WaitGroup
			for i := range streams {
				streams[i] = newHeldStream(chat, fmt.Sprintf("inflight-%s-%d", profile, i))
				wg.Go(func() { _ = h.Process(streams[i]) })
			}
			if err := awaitInFlight(streams, 60*time.Second); err != nil {
				b.Fatal(err)
			}
			heapAfter, rssAfter := liveHeap(), residentBytes(b)
			var routed, answered int
			for _, s := range streams {
				switch {
				case s.answered.Load():
					answered++
				case s.routed.Load():
					routed++
				}
			}
			for _, s := range streams {
				s.close()
			}
			wg.Wait()
			b.ReportMetric(float64(heapAfter-heapBefore)/float64(inFlight), "heap-B/request")
			b.ReportMetric(float64(rssAfter-rssBefore)/float64(inFlight), "rss-B/request")
			b.ReportMetric(float64(routed), "routed")
			b.ReportMetric(float64(inFlight-routed-answered), "queued")
			b.ReportMetric(float64(answered), "answered")
		}
	})
}

// awaitInFlight waits until every stream's request phase has reached the EPP and the EPP has had time to act on it:
// each is then routed, answered, or waiting in admission (no answer yet).
func awaitInFlight(streams []*heldStream, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		pending := 0
		for _, s := range streams {
			if !s.bodyRead.Load() {
				pending++
			}
		}
		if pending == 0 {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d requests never reached the EPP", pending, len(streams))
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Let the EPP finish what it does with the last requests (admission, scheduling) before the heap is read.
	for last := -1; ; {
		time.Sleep(200 * time.Millisecond)
		done := 0
		for _, s := range streams {
			if s.routed.Load() || s.answered.Load() {
				done++
			}
		}
		if done == last || time.Now().After(deadline) {
			return nil
		}
		last = done
	}
}

// liveHeap is the in-use heap after a full collection.
func liveHeap() int64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapInuse)
}

// residentBytes is the process's resident set size (VmRSS); 0 where /proc is not there.
func residentBytes(b *testing.B) int64 {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				b.Fatalf("VmRSS: %v", err)
			}
			return kb << 10
		}
	}
	return 0
}

// heldStream is the proxy's side of one ext_proc stream whose response never comes: it hands the handler the request
// headers and body, then blocks in Recv until close, as Envoy does while the model server has not answered.
type heldStream struct {
	grpc.ServerStream
	ctx    context.Context
	cancel context.CancelFunc
	in     []*extprocv3.ProcessingRequest
	next   int

	bodyRead, routed, answered atomic.Bool
}

func newHeldStream(chat *streamedChat, id string) *heldStream {
	ctx, cancel := context.WithCancel(context.Background())
	in := []*extprocv3.ProcessingRequest{{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
		Headers: headerList(":method", "POST", ":path", "/v1/chat/completions", ":authority", "gateway",
			"content-type", "application/json", "x-request-id", id)}}}}
	body := chat.body.GetRequestBody().GetBody()
	for off := 0; off < len(body); off += requestChunkBytes {
		end := min(off+requestChunkBytes, len(body))
		in = append(in, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
			RequestBody: &extprocv3.HttpBody{Body: body[off:end], EndOfStream: end == len(body)}}})
	}
	return &heldStream{ctx: ctx, cancel: cancel, in: in}
}

func (s *heldStream) close() { s.cancel() }

func (s *heldStream) Context() context.Context { return s.ctx }

func (s *heldStream) Recv() (*extprocv3.ProcessingRequest, error) {
	if s.next < len(s.in) {
		m := s.in[s.next]
		s.next++
		if s.next == len(s.in) {
			s.bodyRead.Store(true)
		}
		return m, nil
	}
	<-s.ctx.Done()
	return nil, io.EOF
}

func (s *heldStream) Send(r *extprocv3.ProcessingResponse) error {
	switch v := r.Response.(type) {
	case *extprocv3.ProcessingResponse_ImmediateResponse:
		s.answered.Store(true)
	case *extprocv3.ProcessingResponse_RequestBody:
		if sr := v.RequestBody.GetResponse().GetBodyMutation().GetStreamedResponse(); sr == nil || sr.EndOfStream {
			s.routed.Store(true)
		}
	}
	return nil
}
