package runner

import (
	"context"
	"errors"

	"github.com/go-logr/logr"
	"sigs.k8s.io/controller-runtime/pkg/log"

	errcommon "sigs.k8s.io/gateway-api-inference-extension/pkg/common/error"
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

// withShedQuietLogger returns ctx with a logger that drops error lines
// carrying upstream's request error (errcommon.Error) while shed reports
// the stream's request shed. Every other line passes unchanged.
func withShedQuietLogger(ctx context.Context, shed func() bool) context.Context {
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
	return log.IntoContext(ctx, base.WithSink(&shedQuietSink{sink: sink, shed: shed}))
}

// shedQuietSink is a logr.LogSink that drops the error lines of shed
// requests (see withShedQuietLogger). It is used by pointer, and WithValues
// without values returns it unchanged: upstream's handler derives a logger
// (log.FromContext, which calls WithValues) several times for every response
// chunk, and each derivation would otherwise allocate a wrapper and a clone of
// the wrapped logger.
type shedQuietSink struct {
	sink logr.LogSink
	shed func() bool
}

var _ logr.CallDepthLogSink = (*shedQuietSink)(nil)

// Init is a no-op: the wrapped sink was initialized by its own logger.
func (s *shedQuietSink) Init(logr.RuntimeInfo) {}

func (s *shedQuietSink) Enabled(level int) bool { return s.sink.Enabled(level) }

func (s *shedQuietSink) Info(level int, msg string, kv ...any) { s.sink.Info(level, msg, kv...) }

func (s *shedQuietSink) Error(err error, msg string, kv ...any) {
	var reqErr errcommon.Error
	if errors.As(err, &reqErr) && s.shed() {
		return
	}
	s.sink.Error(err, msg, kv...)
}

func (s *shedQuietSink) WithValues(kv ...any) logr.LogSink {
	if len(kv) == 0 {
		return s
	}
	return &shedQuietSink{sink: s.sink.WithValues(kv...), shed: s.shed}
}

func (s *shedQuietSink) WithName(name string) logr.LogSink {
	return &shedQuietSink{sink: s.sink.WithName(name), shed: s.shed}
}

func (s *shedQuietSink) WithCallDepth(depth int) logr.LogSink {
	if cd, ok := s.sink.(logr.CallDepthLogSink); ok {
		return &shedQuietSink{sink: cd.WithCallDepth(depth), shed: s.shed}
	}
	return s
}
