package plugins

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/utils/clock"

	"github.com/sluice-gw/sluice/modelrewrite"
)

// ModelRewrite applies InferenceModelRewrite splitting to the requests of one
// pool: it chooses each request's model with the Table in force (sticky per
// session key), and feeds how each rewritten request ended to the recorder
// and the optional guardrail.
//
// Concurrency: safe for concurrent use. Choose and Finish run on request
// paths and take no lock (the Table is swapped atomically); SetTable and
// ClearGuardrails are called by whatever follows the objects (the reconciler
// or the static-mode file watcher).
type ModelRewrite struct {
	pool      modelrewrite.PoolKey
	sessions  modelrewrite.SessionKeys
	guardrail *modelrewrite.Guardrail
	recorder  modelrewrite.Recorder
	clock     clock.PassiveClock
	rand      rand.Source

	table atomic.Pointer[modelrewrite.Table]

	mu sync.Mutex
	// clearTokens holds the last ClearGuardrailAnnotation value seen per
	// object.
	clearTokens map[modelrewrite.ObjectKey]string
}

// ModelRewriteConfig configures a ModelRewrite.
type ModelRewriteConfig struct {
	// Pool is the InferencePool whose rules apply.
	Pool modelrewrite.PoolKey
	// Sessions extracts session keys; the zero value reads x-session-id,
	// then the body's "user".
	Sessions modelrewrite.SessionKeys
	// Guardrail, when not nil, diverts tripped canary targets to their
	// stable target and is fed every rewritten request's outcome.
	Guardrail *modelrewrite.Guardrail
	// Recorder receives decisions and outcomes; nil records nothing.
	Recorder modelrewrite.Recorder
	// Clock times outcomes for the guardrail; nil means the real clock.
	Clock clock.PassiveClock
	// Rand draws the targets of requests without a session key; nil means
	// math/rand/v2's goroutine-safe global source. It must be safe for
	// concurrent use.
	Rand rand.Source
}

// NewModelRewrite returns a ModelRewrite with no rules in force.
func NewModelRewrite(cfg ModelRewriteConfig) (*ModelRewrite, error) {
	if cfg.Pool.Name == "" || cfg.Pool.Namespace == "" {
		return nil, errors.New("model rewrite: the pool's namespace and name are required")
	}
	if cfg.Pool.Group == "" {
		cfg.Pool.Group = modelrewrite.DefaultPoolGroup
	}
	if cfg.Recorder == nil {
		cfg.Recorder = modelrewrite.NopRecorder{}
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	return &ModelRewrite{
		pool:        cfg.Pool,
		sessions:    cfg.Sessions,
		guardrail:   cfg.Guardrail,
		recorder:    cfg.Recorder,
		clock:       cfg.Clock,
		rand:        cfg.Rand,
		clearTokens: map[modelrewrite.ObjectKey]string{},
	}, nil
}

// Pool returns the pool whose rules apply.
func (m *ModelRewrite) Pool() modelrewrite.PoolKey { return m.pool }

// SetTable puts t in force for the requests that start from now on; nil
// means no rules.
func (m *ModelRewrite) SetTable(t *modelrewrite.Table) { m.table.Store(t) }

// rewriteFields are the request body fields a decision reads, as
// json.Unmarshal of the body into this struct would find them.
type rewriteFields struct {
	Model json.RawMessage `json:"model"`
	User  json.RawMessage `json:"user"`
}

// readRewriteFields finds the top-level "model" and "user" of a request body
// as json.Unmarshal(body, &f) would (keys matched under case folding, the
// last match winning; ok false when the body is not valid JSON or not an
// object) without decoding the body: one validation, then the members
// skipped by byte scanners, so a long prompt is never decoded or copied.
// FuzzReadRewriteFields holds it to json.Unmarshal.
func readRewriteFields(body []byte) (f rewriteFields, ok bool) {
	if !validJSON(body) {
		return f, false
	}
	ok = eachMember(body, func(_ []byte, key string, value []byte) bool {
		switch {
		case strings.EqualFold(key, "model"):
			f.Model = value
		case strings.EqualFold(key, "user"):
			f.User = value
		}
		return true
	})
	return f, ok
}

// Choose decides the model of a request from its headers (lower-case names)
// and raw JSON body, and counts the decision. rewritten reports whether a
// rule chose the model (d.Model); then Finish must follow with the request's
// outcome. A body that is not a JSON object with a string "model" is left to
// upstream, which answers it with a clear error.
func (m *ModelRewrite) Choose(headers map[string]string, body []byte) (d modelrewrite.Decision, rewritten bool) {
	t := m.table.Load()
	if t == nil {
		return modelrewrite.Decision{}, false
	}
	f, ok := readRewriteFields(body)
	if !ok {
		return modelrewrite.Decision{}, false
	}
	var model string
	if err := json.Unmarshal(f.Model, &model); err != nil || model == "" {
		return modelrewrite.Decision{}, false
	}
	var fields map[string]any
	var user string
	if json.Unmarshal(f.User, &user) == nil {
		fields = map[string]any{"user": user}
	}
	var trips modelrewrite.TripChecker
	if m.guardrail != nil {
		trips = m.guardrail
	}
	d = t.Decide(modelrewrite.Request{Pool: m.pool, Model: model, SessionKey: m.sessions.Key(headers, fields)}, m.rand, trips)
	m.recorder.RecordDecision(d)
	return d, d.Rewritten()
}

// RequestOutcome is how a request ended (see runner.ResponseOutcome, which
// cmd/epp converts).
type RequestOutcome struct {
	// Status is the model server's HTTP status, or the EPP's own when
	// Immediate; 0 when no response arrived.
	Status int
	// Immediate: the EPP answered the request itself.
	Immediate bool
	// FirstByte is the time to the first response body bytes.
	FirstByte time.Duration
	// Complete: the response reached its end of stream.
	Complete bool
}

// Failed reports whether the outcome counts as an error of the target model:
// a non-2xx status, no response, or a response cut before its end (a stream
// that delivered its final event is complete). Clients that hang up early
// count too: both targets see those alike, so the guardrail's comparison is
// not skewed by them.
func (o RequestOutcome) Failed() bool {
	return o.Status < 200 || o.Status > 299 || !o.Complete
}

// Finish records how a request decided as d ended. Requests the EPP answered
// itself (rejections, no endpoint) are not the target model's doing and are
// not recorded.
func (m *ModelRewrite) Finish(d modelrewrite.Decision, o RequestOutcome) {
	if !d.Rewritten() || o.Immediate {
		return
	}
	failed := o.Failed()
	m.recorder.RecordOutcome(d, o.FirstByte, failed)
	m.guardrail.Record(d, failed, m.clock.Now())
}

// Trips lists the tripped targets; nil without a guardrail.
func (m *ModelRewrite) Trips() []modelrewrite.Trip { return m.guardrail.Trips() }

// ClearGuardrails honours the operator's modelrewrite.ClearGuardrailAnnotation: tokens
// holds the annotation value of every current object of the pool (objects
// without it may be left out). For each object whose value differs from the
// one seen last (or that is seen for the first time), every tripped target
// of its rules is cleared; the cleared trips are returned. Objects no longer
// listed are forgotten.
func (m *ModelRewrite) ClearGuardrails(tokens map[modelrewrite.ObjectKey]string) []modelrewrite.Trip {
	m.mu.Lock()
	changed := map[modelrewrite.ObjectKey]bool{}
	for key, token := range tokens {
		if last, seen := m.clearTokens[key]; token != "" && (!seen || last != token) {
			changed[key] = true
		}
	}
	clear(m.clearTokens)
	for key, token := range tokens {
		if token != "" {
			m.clearTokens[key] = token
		}
	}
	m.mu.Unlock()
	if len(changed) == 0 {
		return nil
	}
	var cleared []modelrewrite.Trip
	for _, trip := range m.guardrail.Trips() {
		if changed[trip.Rule.Object] && m.guardrail.Clear(trip.Rule, trip.Target) {
			cleared = append(cleared, trip)
		}
	}
	return cleared
}

// ReplaceModel returns body, a JSON object, with its top-level "model" value
// replaced by model. Everything else stays byte for byte, including nested
// "model" fields and the order of fields.
func ReplaceModel(body []byte, model string) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, errors.New("request body is not a JSON object")
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, fmt.Errorf("request body: %w", err)
		}
		var value json.RawMessage
		if err := dec.Decode(&value); err != nil {
			return nil, fmt.Errorf("request body: %w", err)
		}
		if tok != "model" {
			continue
		}
		end := int(dec.InputOffset())
		start := end - len(value)
		name, err := json.Marshal(model)
		if err != nil {
			return nil, err
		}
		out := make([]byte, 0, len(body)-len(value)+len(name))
		out = append(out, body[:start]...)
		out = append(out, name...)
		return append(out, body[end:]...), nil
	}
	return nil, errors.New(`request body has no "model" field`)
}
