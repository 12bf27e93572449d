package plugins

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"
	"sigs.k8s.io/yaml"

	"sigs.k8s.io/gateway-api-inference-extension/apix/v1alpha2"

	"github.com/sluice-gw/sluice/crds/rewritecontroller"
	"github.com/sluice-gw/sluice/modelrewrite"
)

// ModelRewriteCommand is InferenceModelRewrite splitting as the EPP binary
// exposes it: its flags, and the ModelRewrite it starts. cmd/epp registers
// the flags, calls Complete after parsing and Start when the EPP is
// assembled, and feeds the rules in force to the ModelRewrite: from the API
// server in Kubernetes mode (the reconciler), from --model-rewrites-file in
// static mode (Start watches the file).
//
// Concurrency: flags and Complete run before Start; TripEvents may be read
// at any time.
type ModelRewriteCommand struct {
	sessionHeader string
	rewritesFile  string
	guardrailOn   bool
	guardrail     modelrewrite.GuardrailConfig
	// discoveryInterval is how often Kubernetes mode looks for the
	// InferenceModelRewrite CRD while it is not installed.
	discoveryInterval time.Duration

	// responseModel is "requested" or "served": which model name the client
	// sees in responses.
	responseModel string

	sessions modelrewrite.SessionKeys
	// tripped signals (without blocking) that a guardrail tripped.
	tripped chan struct{}
}

// NewModelRewriteCommand returns the command with its defaults.
func NewModelRewriteCommand() *ModelRewriteCommand {
	return &ModelRewriteCommand{
		sessionHeader: modelrewrite.DefaultSessionHeader,
		guardrail: modelrewrite.GuardrailConfig{
			Margin:      modelrewrite.DefaultGuardrailMargin,
			Window:      modelrewrite.DefaultGuardrailWindow,
			MinRequests: modelrewrite.DefaultGuardrailMinRequests,
		},
		discoveryInterval: 10 * time.Second,
		responseModel:     ResponseModelRequested,
		tripped:           make(chan struct{}, 1),
	}
}

// AddFlags registers the model rewrite flags.
func (c *ModelRewriteCommand) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&c.sessionHeader, "model-rewrite-session-header", c.sessionHeader,
		"Model rewrites: the request header whose value pins a session to one target of a weighted InferenceModelRewrite "+
			"rule; without it the request body's OpenAI \"user\" field is used, and requests with neither are split at random by weight.")
	fs.StringVar(&c.rewritesFile, "model-rewrites-file", c.rewritesFile,
		"Static mode: a YAML file of InferenceModelRewrite objects (inference.networking.x-k8s.io/v1alpha2), as kubectl applies them; "+
			"spec.poolRef is ignored (static mode serves one pool) and objects without a creationTimestamp take precedence in file order. "+
			"Re-read every --static-endpoints-reload-interval; a file that fails to load keeps the previous rules.")
	fs.StringVar(&c.responseModel, "model-rewrite-response-model", c.responseModel,
		"Model rewrites: the model name clients see in responses, streamed or not: \""+ResponseModelRequested+"\" (the one they asked for) "+
			"or \""+ResponseModelServed+"\" (the rewritten one).")
	fs.DurationVar(&c.discoveryInterval, "model-rewrite-crd-check-interval", c.discoveryInterval,
		"Kubernetes mode: while the InferenceModelRewrite CRD is not installed, how often the EPP looks for it "+
			"(model rewrites start without a restart once it is).")
	fs.BoolVar(&c.guardrailOn, "model-rewrite-guardrail", c.guardrailOn,
		"Model rewrites: when a target's error ratio exceeds its rule's stable target's by --model-rewrite-guardrail-margin over "+
			"--model-rewrite-guardrail-window, send its share to the stable target until an operator changes the object's "+
			modelrewrite.ClearGuardrailAnnotation+" annotation.")
	fs.Float64Var(&c.guardrail.Margin, "model-rewrite-guardrail-margin", c.guardrail.Margin,
		"Model rewrite guardrail: how much higher, as an absolute error ratio in (0,1), a target's error ratio must be than the stable target's to trip.")
	fs.DurationVar(&c.guardrail.Window, "model-rewrite-guardrail-window", c.guardrail.Window,
		"Model rewrite guardrail: the sliding window error ratios are measured over.")
	fs.IntVar(&c.guardrail.MinRequests, "model-rewrite-guardrail-min-requests", c.guardrail.MinRequests,
		"Model rewrite guardrail: outcomes the target and the stable target each need in the window before they are compared.")
}

// Complete checks the flags; staticMode says whether the EPP runs without a
// Kubernetes API.
func (c *ModelRewriteCommand) Complete(staticMode bool) error {
	var errs []error
	sessions, err := modelrewrite.NewSessionKeys(c.sessionHeader)
	if err != nil {
		errs = append(errs, fmt.Errorf("--model-rewrite-session-header: %w", err))
	}
	c.sessions = sessions
	if c.responseModel != ResponseModelRequested && c.responseModel != ResponseModelServed {
		errs = append(errs, fmt.Errorf("--model-rewrite-response-model must be %q or %q, got %q", ResponseModelRequested, ResponseModelServed, c.responseModel))
	}
	if c.discoveryInterval <= 0 {
		errs = append(errs, fmt.Errorf("--model-rewrite-crd-check-interval must be positive, got %v", c.discoveryInterval))
	}
	if c.rewritesFile != "" && !staticMode {
		errs = append(errs, errors.New("--model-rewrites-file is for static mode; in Kubernetes mode InferenceModelRewrites come from the API server"))
	}
	if c.guardrailOn {
		if _, err := modelrewrite.NewGuardrail(c.guardrail); err != nil {
			errs = append(errs, fmt.Errorf("--model-rewrite-guardrail-*: %w", err))
		}
	}
	return errors.Join(errs...)
}

// Values of --model-rewrite-response-model.
const (
	ResponseModelRequested = "requested"
	ResponseModelServed    = "served"
)

// ResponsesNameServedModel reports whether clients see the rewritten model's
// name in responses (--model-rewrite-response-model=served).
func (c *ModelRewriteCommand) ResponsesNameServedModel() bool {
	return c.responseModel == ResponseModelServed
}

// CRDCheckInterval is how often Kubernetes mode looks for the
// InferenceModelRewrite CRD while it is not installed.
func (c *ModelRewriteCommand) CRDCheckInterval() time.Duration { return c.discoveryInterval }

// TripEvents receives a value (coalesced) whenever a guardrail trips, so a
// reconciler can write the status that says so.
func (c *ModelRewriteCommand) TripEvents() <-chan struct{} { return c.tripped }

// ModelRewriteEnv is what Start needs from the assembled EPP.
type ModelRewriteEnv struct {
	// Pool is the InferencePool the EPP serves.
	Pool modelrewrite.PoolKey
	// StaticMode: no Kubernetes API; rules come from --model-rewrites-file.
	StaticMode bool
	// ReloadInterval is how often the rewrites file is re-read.
	ReloadInterval time.Duration
	// Registerer receives the model rewrite metrics; nil means none.
	Registerer prometheus.Registerer
	// Clock times outcomes and file reloads; nil means the real clock.
	Clock  clock.WithTicker
	Logger logr.Logger
}

// Start builds the ModelRewrite. In static mode it loads --model-rewrites-file
// (a file that fails to load fails Start) and re-reads it until ctx ends;
// without the file no rules are in force.
func (c *ModelRewriteCommand) Start(ctx context.Context, env ModelRewriteEnv) (*ModelRewrite, error) {
	if env.Clock == nil {
		env.Clock = clock.RealClock{}
	}
	var recorders []modelrewrite.Recorder
	if env.Registerer != nil {
		rec, err := modelrewrite.NewPrometheusRecorder(env.Registerer, 0)
		if err != nil {
			return nil, err
		}
		recorders = append(recorders, rec)
	}
	recorder := fanoutRecorder(recorders)
	cfg := ModelRewriteConfig{Pool: env.Pool, Sessions: c.sessions, Recorder: recorder, Clock: env.Clock}
	if c.guardrailOn {
		gc := c.guardrail
		gc.Recorder = tripSignal{recorder: recorder, logger: env.Logger, tripped: c.tripped, static: env.StaticMode}
		g, err := modelrewrite.NewGuardrail(gc)
		if err != nil {
			return nil, err
		}
		cfg.Guardrail = g
	}
	m, err := NewModelRewrite(cfg)
	if err != nil {
		return nil, err
	}
	if env.StaticMode && c.rewritesFile != "" {
		w := &rewritesFileWatcher{path: c.rewritesFile, target: m, logger: env.Logger}
		if err := w.load(); err != nil {
			return nil, err
		}
		if env.ReloadInterval <= 0 {
			return nil, fmt.Errorf("model rewrites file: reload interval must be positive, got %v", env.ReloadInterval)
		}
		go w.run(ctx, env.Clock, env.ReloadInterval)
	}
	env.Logger.Info("Model rewrites enabled", "pool", env.Pool, "sessionHeader", c.sessions.Header(),
		"guardrail", c.guardrailOn, "rewritesFile", c.rewritesFile)
	return m, nil
}

// fanoutRecorder passes every signal to each recorder.
type fanoutRecorder []modelrewrite.Recorder

func (f fanoutRecorder) RecordDecision(d modelrewrite.Decision) {
	for _, r := range f {
		r.RecordDecision(d)
	}
}

func (f fanoutRecorder) RecordOutcome(d modelrewrite.Decision, ttft time.Duration, failed bool) {
	for _, r := range f {
		r.RecordOutcome(d, ttft, failed)
	}
}

func (f fanoutRecorder) RecordTripped(rule modelrewrite.RuleID, target string, tripped bool) {
	for _, r := range f {
		r.RecordTripped(rule, target, tripped)
	}
}

// tripSignal is the guardrail's TripRecorder: it records, logs, and signals
// trips without blocking (it runs under the guardrail's lock).
type tripSignal struct {
	recorder modelrewrite.TripRecorder
	logger   logr.Logger
	tripped  chan struct{}
	static   bool
}

func (t tripSignal) RecordTripped(rule modelrewrite.RuleID, target string, tripped bool) {
	t.recorder.RecordTripped(rule, target, tripped)
	if !tripped {
		t.logger.Info("Model rewrite guardrail cleared: the target gets its share again", "rule", rule.String(), "target", target)
		return
	}
	where := "the object's status"
	if t.static {
		where = "the rewrites file"
	}
	t.logger.Info("Model rewrite guardrail tripped: the target's share goes to the rule's stable target until cleared "+
		"(change the "+modelrewrite.ClearGuardrailAnnotation+" annotation in "+where+")", "rule", rule.String(), "target", target)
	select {
	case t.tripped <- struct{}{}:
	default:
	}
}

// documentSeparator splits a multi-document YAML stream.
var documentSeparator = regexp.MustCompile(`(?m)^---\s*$`)

// ParseModelRewrites parses InferenceModelRewrite objects
// (inference.networking.x-k8s.io/v1alpha2) from a YAML stream of one or more
// documents, as `kubectl apply -f` accepts them.
func ParseModelRewrites(content []byte) ([]*v1alpha2.InferenceModelRewrite, error) {
	var (
		objs []*v1alpha2.InferenceModelRewrite
		errs []error
		seen = map[string]bool{}
	)
	for i, doc := range documentSeparator.Split(string(content), -1) {
		if len(bytes.TrimSpace([]byte(doc))) == 0 {
			continue
		}
		obj := &v1alpha2.InferenceModelRewrite{}
		if err := yaml.UnmarshalStrict([]byte(doc), obj); err != nil {
			errs = append(errs, fmt.Errorf("document %d: %w", i+1, err))
			continue
		}
		key := obj.Namespace + "/" + obj.Name
		switch {
		case obj.APIVersion != v1alpha2.GroupVersion.String() || obj.Kind != "InferenceModelRewrite":
			errs = append(errs, fmt.Errorf("document %d: want apiVersion %s, kind InferenceModelRewrite; got %s, %s",
				i+1, v1alpha2.GroupVersion, obj.APIVersion, obj.Kind))
		case obj.Name == "":
			errs = append(errs, fmt.Errorf("document %d: metadata.name is required", i+1))
		case seen[key]:
			errs = append(errs, fmt.Errorf("document %d: InferenceModelRewrite %q is defined twice", i+1, strings.TrimPrefix(key, "/")))
		default:
			seen[key] = true
			objs = append(objs, obj)
		}
	}
	return objs, errors.Join(errs...)
}

// rewritesFileWatcher keeps the rules of a static-mode rewrites file in force.
type rewritesFileWatcher struct {
	path   string
	target *ModelRewrite
	logger logr.Logger
	last   []byte
}

// load reads the file and, when it changed, puts its rules in force and
// honours changed clear-guardrail annotations. Any invalid object fails the
// whole load: a file is applied entirely or not at all.
func (w *rewritesFileWatcher) load() error {
	content, err := os.ReadFile(w.path)
	if err != nil {
		return fmt.Errorf("model rewrites file: %w", err)
	}
	if w.last != nil && bytes.Equal(content, w.last) {
		return nil
	}
	objs, err := ParseModelRewrites(content)
	if err != nil {
		return fmt.Errorf("model rewrites file %s: %w", w.path, err)
	}
	pool := w.target.Pool()
	rewrites := make([]modelrewrite.Rewrite, 0, len(objs))
	tokens := map[modelrewrite.ObjectKey]string{}
	var errs []error
	for i, obj := range objs {
		if obj.Namespace == "" {
			obj.Namespace = pool.Namespace
		}
		if obj.CreationTimestamp.IsZero() {
			// File order is precedence order, before any dated object.
			obj.CreationTimestamp = metav1.NewTime(time.Unix(int64(i), 0))
		}
		// Static mode serves one pool: every object applies to it.
		obj.Spec.PoolRef = &v1alpha2.PoolObjectReference{
			Group: v1alpha2.Group(pool.Group), Kind: modelrewrite.PoolKind, Name: v1alpha2.ObjectName(pool.Name),
		}
		if obj.Namespace != pool.Namespace {
			errs = append(errs, fmt.Errorf("InferenceModelRewrite %s/%s: namespace must be the pool's, %q", obj.Namespace, obj.Name, pool.Namespace))
			continue
		}
		rw, err := rewritecontroller.FromAPI(obj)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		rewrites = append(rewrites, rw)
		tokens[rw.Key] = obj.Annotations[modelrewrite.ClearGuardrailAnnotation]
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("model rewrites file %s: %w", w.path, err)
	}
	var table *modelrewrite.Table
	if len(rewrites) > 0 { // without rules, a nil Table spares parsing bodies
		if table, err = modelrewrite.NewTable(rewrites); err != nil {
			return fmt.Errorf("model rewrites file %s: %w", w.path, err)
		}
	}
	w.target.SetTable(table)
	for _, trip := range w.target.ClearGuardrails(tokens) {
		w.logger.Info("Model rewrite guardrail cleared by the rewrites file", "rule", trip.Rule.String(), "target", trip.Target)
	}
	w.last = content
	w.logger.Info("Model rewrites loaded", "file", w.path, "objects", len(rewrites))
	return nil
}

// run re-reads the file every interval until ctx ends.
func (w *rewritesFileWatcher) run(ctx context.Context, clk clock.WithTicker, interval time.Duration) {
	t := clk.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
			if err := w.load(); err != nil {
				w.logger.Error(err, "Keeping the previous model rewrites")
			}
		}
	}
}
