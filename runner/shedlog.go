package runner

import (
	"context"
	"errors"
	"slices"
	"sync"

	"github.com/go-logr/logr"
	"sigs.k8s.io/controller-runtime/pkg/log"

	errcommon "sigs.k8s.io/gateway-api-inference-extension/pkg/common/error"
	logutil "sigs.k8s.io/gateway-api-inference-extension/pkg/common/observability/logging"
)

// Shedder is implemented by a ResponseShaper whose admission turns requests
// away by design (load shedding: 429 or 503 with Retry-After). Upstream's
// ext_proc handler logs every request it answers itself twice as an error,
// with a stack trace; under overload that is thousands of stack traces a
// minute for behaviour that is working as intended. The runner drops those
// lines for the requests a Shedder reports, and the Shedder logs its
// decision itself, once, at a verbosity level.
type Shedder interface {
	// Shed reports whether the request was answered by admission's design
	// (it is asked before that answer is sent).
	Shed(requestID string) bool
}

// upstreamRequestLines are the lines upstream's ext_proc handler logs at
// its default verbosity (2) for every request, whatever happens to it: a
// line when it arrives, when its body was answered and when its response
// ended. Formatting and writing them is a measurable share of Sluice's CPU
// per streamed chat (testbed/bench/scenarios/README.md, issue 21). On the hot path they
// are logged at verbosity 3 instead (demoteRequestLines): -v=3 brings them
// back, beside upstream's "Request handled" line of each request, which
// names the same models and the endpoint too.
var upstreamRequestLines = map[string]bool{
	"EPP received request":                       true,
	"EPP sent request body response(s) to proxy": true,
	"EPP sent response body back to proxy":       true,
}

// withShedQuietLogger returns ctx with a logger that drops error lines
// carrying upstream's request error (errcommon.Error) while shed (nil:
// never) reports the stream's request shed and, with demote, logs
// upstream's per-request lines (upstreamRequestLines) at verbosity 3 instead
// of 2. Every other line passes unchanged.
func withShedQuietLogger(ctx context.Context, shed func() bool, demote bool) context.Context {
	base := log.FromContext(ctx)
	sink := base.GetSink()
	if sink == nil {
		return ctx
	}
	// The wrapper's methods add one frame between the caller and the sink:
	// the sink skips it so its caller annotation stays the caller's.
	if cd, ok := sink.(logr.CallDepthLogSink); ok {
		sink = cd.WithCallDepth(1)
	}
	if shed == nil {
		shed = func() bool { return false }
	}
	return log.IntoContext(ctx, base.WithSink(&shedQuietSink{sink: sink, shed: shed, demote: demote}))
}

// withHeldValues returns ctx with a logger that holds the values of the loggers derived from it until a line is
// written (shedQuietSink, which sheds nothing here), for the work that derives loggers it seldom writes with.
func withHeldValues(ctx context.Context) context.Context { return withShedQuietLogger(ctx, nil, false) }

// shedQuietSink is a logr.LogSink that drops the error lines of shed
// requests (see withShedQuietLogger). It is used by pointer, and WithValues
// without values returns it unchanged: upstream's handler derives a logger
// (log.FromContext, which calls WithValues) several times for every response
// chunk, and each derivation would otherwise allocate a wrapper and a clone of
// the wrapped logger.
//
// Values are held until a line is written (values): upstream's handler and
// Director derive loggers with the request's values for every request
// (handlers/server.go, requestcontrol/director.go), and zap's WithValues
// clones its core and encodes the values at once, though at the default
// verbosity none of the lines those loggers would write is written. A line
// written carries the same values in the same order; a value is formatted
// when the first line is written, not when it was given (zap and funcr format
// at once; logr's contract does not say when), on the goroutine that writes it:
// a value that is a pointer to something changed in between shows the change,
// and one changed by another goroutine would race. Upstream's per-request values
// are strings and the objective's priority (a pointer into an object the
// datastore replaces rather than changes).
type shedQuietSink struct {
	sink   logr.LogSink
	shed   func() bool
	demote bool
	// values are the key/value pairs of each WithValues call since sink was derived, not yet handed to it, one
	// entry per call: zapr checks each call's pairs on its own, so a malformed call must not take the next call's
	// pairs with it. Shared with the sinks derived from this one, never appended to in place (WithValues copies).
	values [][]any
	// withValues is sink with values, derived once by the first line written (written).
	once       sync.Once
	withValues logr.LogSink
}

var _ logr.CallDepthLogSink = (*shedQuietSink)(nil)

// Init is a no-op: the wrapped sink was initialized by its own logger.
func (s *shedQuietSink) Init(logr.RuntimeInfo) {}

func (s *shedQuietSink) Enabled(level int) bool { return s.sink.Enabled(level) }

// written is the sink a line goes to: the wrapped sink with the values held.
func (s *shedQuietSink) written() logr.LogSink {
	if len(s.values) == 0 {
		return s.sink
	}
	s.once.Do(func() {
		// A line still goes somewhere if handing the values over panics (zap's development mode panics on a
		// malformed pair): to the sink without them.
		s.withValues = s.sink
		w := s.sink
		for _, kv := range s.values {
			w = w.WithValues(kv...)
		}
		s.withValues = w
	})
	return s.withValues
}

func (s *shedQuietSink) Info(level int, msg string, kv ...any) {
	if s.demote && level == logutil.DEFAULT && upstreamRequestLines[msg] {
		if !s.sink.Enabled(logutil.VERBOSE) {
			return
		}
		level = logutil.VERBOSE
	}
	s.written().Info(level, msg, kv...)
}

func (s *shedQuietSink) Error(err error, msg string, kv ...any) {
	var reqErr errcommon.Error
	if errors.As(err, &reqErr) && s.shed() {
		return
	}
	s.written().Error(err, msg, kv...)
}

func (s *shedQuietSink) WithValues(kv ...any) logr.LogSink {
	if len(kv) == 0 {
		return s
	}
	values := append(s.values[:len(s.values):len(s.values)], slices.Clone(kv))
	return &shedQuietSink{sink: s.sink, shed: s.shed, demote: s.demote, values: values}
}

// WithName names the wrapped sink; the values held stay held (zap and funcr keep a logger's name apart from its
// values, so the order of the two calls does not matter to them).
func (s *shedQuietSink) WithName(name string) logr.LogSink {
	return &shedQuietSink{sink: s.sink.WithName(name), shed: s.shed, demote: s.demote, values: s.values}
}

func (s *shedQuietSink) WithCallDepth(depth int) logr.LogSink {
	if cd, ok := s.sink.(logr.CallDepthLogSink); ok {
		return &shedQuietSink{sink: cd.WithCallDepth(depth), shed: s.shed, demote: s.demote, values: s.values}
	}
	return s
}
