package runner

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	uberzap "go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"sigs.k8s.io/controller-runtime/pkg/log"
	crzap "sigs.k8s.io/controller-runtime/pkg/log/zap"

	errcommon "sigs.k8s.io/gateway-api-inference-extension/pkg/common/error"
)

// upstreamLike handles one stream the way upstream's handler does when the
// Director refuses a request: two error lines, then the immediate response.
type upstreamLike struct {
	extprocv3.UnimplementedExternalProcessorServer
	err error
}

func (u upstreamLike) Process(srv extprocv3.ExternalProcessor_ProcessServer) error {
	logger := log.FromContext(srv.Context())
	if _, err := srv.Recv(); err != nil {
		return err
	}
	logger.Info("EPP received request")
	logger.Error(u.err, "Error handling request")
	logger.WithValues("stage", "respond").Error(u.err, "Failed to process request")
	return srv.Send(immediate(typev3.StatusCode_TooManyRequests, "busy"))
}

// shedIDs is a shaper that sheds the listed request IDs.
type shedIDs map[string]bool

func (s shedIDs) ShapeImmediateResponse(context.Context, string, *extprocv3.ImmediateResponse) {}
func (s shedIDs) Shed(id string) bool                                                          { return s[id] }

func TestShedRequestsLeaveNoErrorLines(t *testing.T) {
	shedErr := errcommon.Error{Code: errcommon.ResourceExhausted, Msg: "Request not admitted: the Standard queue is full."}
	tests := []struct {
		name       string
		shapers    []ResponseShaper
		id         string
		err        error
		wantErrors int
	}{
		{"shed by design", []ResponseShaper{OpenAIErrorBody, shedIDs{"a": true}}, "a", shedErr, 0},
		{"another request's failure", []ResponseShaper{shedIDs{"a": true}}, "b", shedErr, 2},
		{"not an upstream request error", []ResponseShaper{shedIDs{"a": true}}, "a", errors.New("stream broke"), 2},
		{"no shedder", []ResponseShaper{OpenAIErrorBody}, "a", shedErr, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var lines []string
			logger := funcr.New(func(prefix, args string) { lines = append(lines, args) }, funcr.Options{})
			stream := &fakeStream{ctx: logr.NewContext(context.Background(), logger), in: []*extprocv3.ProcessingRequest{headers("x-request-id", tt.id)}}
			srv := &shapingServer{upstream: upstreamLike{err: tt.err}, shapers: tt.shapers}
			if err := srv.Process(stream); err != nil {
				t.Fatal(err)
			}
			errorsLogged := 0
			for _, l := range lines {
				if strings.Contains(l, `"error"`) {
					errorsLogged++
				}
			}
			if errorsLogged != tt.wantErrors || len(lines) != 1+tt.wantErrors {
				t.Errorf("logged %q: want %d error lines beside the info line", lines, tt.wantErrors)
			}
			if len(stream.out) != 1 || stream.out[0].GetImmediateResponse() == nil {
				t.Errorf("answer %v, want the immediate response", stream.out)
			}
		})
	}
}

// TestShedQuietLoggerDerivesWithoutAllocating: upstream's handler calls log.FromContext several times for every
// response chunk; deriving a logger without values from the shed-quiet logger must not allocate (it did: a wrapper
// and a clone of the wrapped logger each time).
func TestShedQuietLoggerDerivesWithoutAllocating(t *testing.T) {
	base := funcr.New(func(string, string) {}, funcr.Options{})
	ctx := withShedQuietLogger(log.IntoContext(context.Background(), base), func() bool { return false }, true)
	if allocs := testing.AllocsPerRun(100, func() { _ = log.FromContext(ctx) }); allocs != 0 {
		t.Fatalf("log.FromContext allocates %.0f times per call, want 0", allocs)
	}
	if _, ok := log.FromContext(ctx).WithValues("stage", "x").GetSink().(*shedQuietSink); !ok {
		t.Fatal("a logger derived with values lost the shed-quiet sink")
	}
}

// requestLiner logs as upstream's handler does for every request (its three
// per-request lines at verbosity 2), beside another line at 2 and an error.
type requestLiner struct {
	extprocv3.UnimplementedExternalProcessorServer
}

func (requestLiner) Process(srv extprocv3.ExternalProcessor_ProcessServer) error {
	logger := log.FromContext(srv.Context())
	if _, err := srv.Recv(); err != nil {
		return err
	}
	logger.V(2).Info("EPP received request")
	logger.WithValues("stage", "body").V(2).Info("EPP sent request body response(s) to proxy", "modelName", "m")
	logger.V(2).Info("Pod added")
	logger.Error(errors.New("boom"), "Failed to process request")
	logger.V(2).Info("EPP sent response body back to proxy")
	return nil
}

// TestHotPathDemotesUpstreamRequestLines: on the hot path upstream's three
// per-request lines are logged at verbosity 3, not 2; errors and upstream's
// other lines are not touched; off the hot path everything is as upstream's.
func TestHotPathDemotesUpstreamRequestLines(t *testing.T) {
	tests := []struct {
		name      string
		hot       bool
		verbosity int
		want      []string
	}{
		{"hot, default verbosity", true, 2, []string{"Pod added", "Failed to process request"}},
		{"hot, -v=3", true, 3, []string{"EPP received request", "EPP sent request body response(s) to proxy", "Pod added", "Failed to process request", "EPP sent response body back to proxy"}},
		{"upstream path", false, 2, []string{"EPP received request", "EPP sent request body response(s) to proxy", "Pod added", "Failed to process request", "EPP sent response body back to proxy"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var lines []string
			logger := funcr.New(func(prefix, args string) { lines = append(lines, args) }, funcr.Options{Verbosity: tt.verbosity})
			stream := &fakeStream{ctx: logr.NewContext(context.Background(), logger), in: []*extprocv3.ProcessingRequest{headers("x-request-id", "a")}}
			srv := &shapingServer{upstream: requestLiner{}, hot: tt.hot}
			if err := srv.Process(stream); err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, l := range lines {
				for _, msg := range []string{"EPP received request", "EPP sent request body response(s) to proxy", "Pod added", "Failed to process request", "EPP sent response body back to proxy"} {
					if strings.Contains(l, `"msg"="`+msg+`"`) {
						got = append(got, msg)
						if upstreamRequestLines[msg] && tt.hot && !strings.Contains(l, `"level"=3`) {
							t.Errorf("%q logged as %s, want level 3", msg, l)
						}
					}
				}
			}
			if strings.Join(got, "|") != strings.Join(tt.want, "|") {
				t.Errorf("logged %q, want %q (lines %q)", got, tt.want, lines)
			}
		})
	}
}

// countingSink is a logr.LogSink that counts the loggers derived from it with values and records the lines written,
// each with the values of the logger that wrote it.
type countingSink struct {
	derived *int
	lines   *[]string
	values  []any
	name    string
	level   int // lines above it are not written
}

func (c countingSink) Init(logr.RuntimeInfo)                  {}
func (c countingSink) Enabled(level int) bool                 { return level <= c.level }
func (c countingSink) Error(err error, msg string, kv ...any) { c.write(msg, kv) }
func (c countingSink) Info(_ int, msg string, kv ...any)      { c.write(msg, kv) }
func (c countingSink) write(msg string, kv []any) {
	*c.lines = append(*c.lines, fmt.Sprint(c.name, " ", msg, " ", append(append([]any{}, c.values...), kv...)))
}
func (c countingSink) WithName(name string) logr.LogSink { c.name += name; return c }
func (c countingSink) WithValues(kv ...any) logr.LogSink {
	if len(kv) > 0 {
		*c.derived++
	}
	c.values = append(c.values[:len(c.values):len(c.values)], kv...)
	return c
}

// TestShedQuietLoggerHoldsValuesUntilALineIsWritten: upstream derives loggers with the request's values for every
// request, which zap pays for at once; the shed-quiet sink hands the values to the wrapped sink only when a line is
// written (fails without: every derivation with values reached the wrapped sink), and the lines written carry the
// same values in the same order as without it.
func TestShedQuietLoggerHoldsValuesUntilALineIsWritten(t *testing.T) {
	tests := []struct {
		name        string
		log         func(logr.Logger)
		wantDerived int
		wantLines   []string
	}{
		{"values, nothing written", func(l logr.Logger) {
			l.WithValues("x-request-id", "r1").WithValues("stage", "body").V(4).Info("not written")
		}, 0, nil},
		{"values, a line written", func(l logr.Logger) {
			l.WithValues("x-request-id", "r1").WithValues("stage", "body").Info("written", "k", 1)
		}, 2, []string{" written [x-request-id r1 stage body k 1]"}},
		{"two lines from one logger derive once", func(l logr.Logger) {
			d := l.WithValues("a", 1)
			d.Info("one")
			d.Error(errors.New("boom"), "two")
		}, 1, []string{" one [a 1]", " two [a 1]"}},
		{"a name between values", func(l logr.Logger) {
			l.WithValues("a", 1).WithName("n").WithValues("b", 2).Info("named")
		}, 2, []string{"n named [a 1 b 2]"}},
		{"siblings keep their own values", func(l logr.Logger) {
			d := l.WithValues("a", 1)
			d.WithValues("b", 2).Info("first")
			d.WithValues("c", 3).Info("second")
		}, 4, []string{" first [a 1 b 2]", " second [a 1 c 3]"}},
		{"no values", func(l logr.Logger) { l.Info("plain") }, 0, []string{" plain []"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			derived, lines := 0, []string{}
			base := logr.New(countingSink{derived: &derived, lines: &lines, level: 2})
			ctx := withShedQuietLogger(log.IntoContext(context.Background(), base), func() bool { return false }, false)
			tt.log(log.FromContext(ctx))
			if derived != tt.wantDerived {
				t.Errorf("the wrapped sink derived %d loggers with values, want %d", derived, tt.wantDerived)
			}
			if fmt.Sprint(lines) != fmt.Sprint(tt.wantLines) {
				t.Errorf("lines %q, want %q", lines, tt.wantLines)
			}
		})
	}
}

// TestShedQuietLoggerHandsEachCallsValuesApart: zapr checks the pairs of each WithValues call on its own, reporting
// and dropping an odd one; the held values reach it call by call, so a malformed call does not take the next call's
// pairs with it.
func TestShedQuietLoggerHandsEachCallsValuesApart(t *testing.T) {
	var out strings.Builder
	zl := crzap.New(crzap.WriteTo(&out), crzap.Encoder(zapcore.NewJSONEncoder(uberzap.NewProductionEncoderConfig())))
	ctx := withHeldValues(log.IntoContext(context.Background(), zl))
	log.FromContext(ctx).WithValues("odd").WithValues("b", 2).Info("the line")
	var line string
	for l := range strings.Lines(out.String()) {
		if strings.Contains(l, `"msg":"the line"`) {
			line = l
		}
	}
	if !strings.Contains(line, `"b":2`) || strings.Contains(line, `"odd":"b"`) {
		t.Errorf("the line %q, want b=2 and no pair made of the odd call's key and b", line)
	}
}

// TestHeldValuesLogger: the data store's context (its endpoints' collectors) holds the values of upstream's per-poll
// logger (the extractor's, with the endpoint's name, for a line at -v=5) until a line is written.
func TestHeldValuesLogger(t *testing.T) {
	derived, lines := 0, []string{}
	base := logr.New(countingSink{derived: &derived, lines: &lines, level: 2})
	ctx := withHeldValues(log.IntoContext(context.Background(), base))
	for range 3 {
		log.FromContext(ctx).WithValues("endpoint", "default/pod-1").V(5).Info("Refreshed metrics")
	}
	log.FromContext(ctx).WithValues("endpoint", "default/pod-1").Error(errors.New("boom"), "poll failed")
	if derived != 1 || fmt.Sprint(lines) != "[ poll failed [endpoint default/pod-1]]" {
		t.Errorf("the wrapped sink derived %d loggers with values and wrote %q; want 1 and the error line with its value", derived, lines)
	}
}

// BenchmarkRequestLoggerDerivations derives a request's loggers as upstream's handler and Director do for every
// request (the request ID, then the objective, the models and the priority), at the default verbosity, where none of
// their lines is written, from a zap logger as upstream's InitSetupLogging builds it: sink=zap derives from zap itself,
// sink=held through the request path's sink.
func BenchmarkRequestLoggerDerivations(b *testing.B) {
	zl := crzap.New(crzap.Level(uberzap.NewAtomicLevelAt(zapcore.Level(-2))), crzap.WriteTo(io.Discard),
		crzap.Encoder(zapcore.NewJSONEncoder(uberzap.NewProductionEncoderConfig())))
	priority := 1
	for _, tt := range []struct {
		name string
		ctx  context.Context
	}{
		{"zap", log.IntoContext(context.Background(), zl)},
		{"held", withHeldValues(log.IntoContext(context.Background(), zl))},
	} {
		b.Run("sink="+tt.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				l := log.FromContext(tt.ctx).WithValues("x-request-id", "3f2c9a1e-7d4b-4c55-9f0e-2b8d6a4c1e77")
				l = l.WithValues("objectiveKey", "default/chat", "incomingModelName", "meta-llama/Llama-3.1-8B-Instruct",
					"targetModelName", "meta-llama/Llama-3.1-8B-Instruct", "priority", &priority)
				l.V(4).Info("LLM request assembled")
			}
		})
	}
}
