package plugins

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"reflect"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8stypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/log"

	fwkdl "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/datalayer"
	fwkplugin "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/plugin"
	fwkrc "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/requestcontrol"
	fwksched "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/scheduling"
	sourcemetrics "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/datalayer/source/metrics"

	"github.com/sluice-gw/sluice/prefixcache"
)

// PrefixCacheType is the plugin type of PrefixCache.
const PrefixCacheType = "sluice-prefix-cache-scorer"

// prefillProfile is the profile name upstream's P/D disaggregation uses for
// the prefill pod, which is where the prompt's KV blocks are computed.
const prefillProfile = "prefill"

var (
	_ fwksched.Scorer          = (*PrefixCache)(nil)
	_ fwkrc.PreRequest         = (*PrefixCache)(nil)
	_ fwkrc.ResponseBody       = (*PrefixCache)(nil)
	_ fwkdl.Extractor          = (*PrefixCache)(nil)
	_ fwkplugin.ConsumerPlugin = (*PrefixCache)(nil)
)

// prefixCacheAPIConfig is the JSON schema of PrefixCache's parameters. Every
// field is optional; see prefixcache.Config for meanings and defaults.
type prefixCacheAPIConfig struct {
	// BytesPerToken is the token rule: prompt bytes per approximate token.
	BytesPerToken      *float64 `json:"bytesPerToken,omitempty"`
	DefaultBlockTokens *int     `json:"defaultBlockTokens,omitempty"`
	DefaultPodBlocks   *int     `json:"defaultPodBlocks,omitempty"`
	MaxBlocksPerPod    *int     `json:"maxBlocksPerPod,omitempty"`
	MaxPods            *int     `json:"maxPods,omitempty"`
	MaxPrefixTokens    *int     `json:"maxPrefixTokens,omitempty"`

	OverloadAbsolute *float64 `json:"overloadAbsolute,omitempty"`
	OverloadRelative *float64 `json:"overloadRelative,omitempty"`
	TaperStart       *float64 `json:"taperStart,omitempty"`
	KVCacheCutoff    *float64 `json:"kvCacheCutoff,omitempty"`

	CalibrationTolerance *float64 `json:"calibrationTolerance,omitempty"`
	ShrinkGain           *float64 `json:"shrinkGain,omitempty"`
	GrowGain             *float64 `json:"growGain,omitempty"`
	MinCapacityFraction  *float64 `json:"minCapacityFraction,omitempty"`
	MinPredictedFraction *float64 `json:"minPredictedFraction,omitempty"`
	MinCounterQueries    *float64 `json:"minCounterQueries,omitempty"`

	PendingTTL *metav1.Duration `json:"pendingTTL,omitempty"`
	MaxPending *int             `json:"maxPending,omitempty"`

	// PodSyncInterval is how often pods that left the pool are forgotten
	// and unanswered requests expired. Default 30s.
	PodSyncInterval *metav1.Duration `json:"podSyncInterval,omitempty"`
	// HitsMetric and QueriesMetric name the model server's cumulative
	// prefix-cache counters (in tokens) read by the extractor. Defaults
	// vllm:prefix_cache_hits_total and vllm:prefix_cache_queries_total.
	HitsMetric    *string `json:"hitsMetric,omitempty"`
	QueriesMetric *string `json:"queriesMetric,omitempty"`
}

// prefixCacheConfig is the validated configuration of a PrefixCache.
type prefixCacheConfig struct {
	index           prefixcache.Config
	podSyncInterval time.Duration
	hitsMetric      string
	queriesMetric   string
}

func applyPrefixCacheDefaults(c *prefixCacheAPIConfig) {
	d := prefixcache.DefaultConfig()
	setDefault(&c.BytesPerToken, d.Tokens.BytesPerToken)
	setDefault(&c.DefaultBlockTokens, d.DefaultBlockTokens)
	setDefault(&c.DefaultPodBlocks, d.DefaultPodBlocks)
	setDefault(&c.MaxBlocksPerPod, d.MaxBlocksPerPod)
	setDefault(&c.MaxPods, d.MaxPods)
	setDefault(&c.MaxPrefixTokens, d.MaxPrefixTokens)
	setDefault(&c.OverloadAbsolute, d.Guard.OverloadAbsolute)
	setDefault(&c.OverloadRelative, d.Guard.OverloadRelative)
	setDefault(&c.TaperStart, d.Guard.TaperStart)
	setDefault(&c.KVCacheCutoff, d.Guard.KVCacheCutoff)
	setDefault(&c.CalibrationTolerance, d.Calibration.Tolerance)
	setDefault(&c.ShrinkGain, d.Calibration.ShrinkGain)
	setDefault(&c.GrowGain, d.Calibration.GrowGain)
	setDefault(&c.MinCapacityFraction, d.Calibration.MinCapacityFraction)
	setDefault(&c.MinPredictedFraction, d.Calibration.MinPredictedFraction)
	setDefault(&c.MinCounterQueries, d.Calibration.MinCounterQueries)
	setDefault(&c.PendingTTL, metav1.Duration{Duration: d.PendingTTL})
	setDefault(&c.MaxPending, d.MaxPending)
	setDefault(&c.PodSyncInterval, metav1.Duration{Duration: 30 * time.Second})
	setDefault(&c.HitsMetric, "vllm:prefix_cache_hits_total")
	setDefault(&c.QueriesMetric, "vllm:prefix_cache_queries_total")
}

func setDefault[T any](field **T, v T) {
	if *field == nil {
		*field = &v
	}
}

// validatePrefixCacheConfig turns a defaulted configuration into a
// prefixCacheConfig, reporting every violated constraint at once.
func validatePrefixCacheConfig(c *prefixCacheAPIConfig) (prefixCacheConfig, error) {
	cfg := prefixCacheConfig{
		index: prefixcache.Config{
			Tokens:             prefixcache.TokenRule{BytesPerToken: *c.BytesPerToken},
			DefaultBlockTokens: *c.DefaultBlockTokens,
			DefaultPodBlocks:   *c.DefaultPodBlocks,
			MaxBlocksPerPod:    *c.MaxBlocksPerPod,
			MaxPods:            *c.MaxPods,
			MaxPrefixTokens:    *c.MaxPrefixTokens,
			Guard: prefixcache.GuardConfig{
				OverloadAbsolute: *c.OverloadAbsolute,
				OverloadRelative: *c.OverloadRelative,
				TaperStart:       *c.TaperStart,
				KVCacheCutoff:    *c.KVCacheCutoff,
			},
			Calibration: prefixcache.CalibrationConfig{
				Tolerance:            *c.CalibrationTolerance,
				ShrinkGain:           *c.ShrinkGain,
				GrowGain:             *c.GrowGain,
				MinCapacityFraction:  *c.MinCapacityFraction,
				MinPredictedFraction: *c.MinPredictedFraction,
				MinCounterQueries:    *c.MinCounterQueries,
			},
			PendingTTL: c.PendingTTL.Duration,
			MaxPending: *c.MaxPending,
		},
		podSyncInterval: c.PodSyncInterval.Duration,
		hitsMetric:      *c.HitsMetric,
		queriesMetric:   *c.QueriesMetric,
	}
	errs := []error{cfg.index.Validate()}
	if cfg.podSyncInterval <= 0 {
		errs = append(errs, fmt.Errorf("podSyncInterval must be > 0, got %v", cfg.podSyncInterval))
	}
	if cfg.hitsMetric == "" || cfg.queriesMetric == "" {
		errs = append(errs, errors.New("hitsMetric and queriesMetric must not be empty"))
	}
	return cfg, errors.Join(errs...)
}

// parsePrefixCacheConfig decodes raw (unknown fields are errors), applies
// defaults and validates.
func parsePrefixCacheConfig(raw json.RawMessage) (prefixCacheConfig, error) {
	var api prefixCacheAPIConfig
	if err := decodeParams(raw, &api); err != nil {
		return prefixCacheConfig{}, fmt.Errorf("%s parameters: %w", PrefixCacheType, err)
	}
	applyPrefixCacheDefaults(&api)
	cfg, err := validatePrefixCacheConfig(&api)
	if err != nil {
		return prefixCacheConfig{}, fmt.Errorf("%s parameters: %w", PrefixCacheType, err)
	}
	return cfg, nil
}

// PrefixCache is the EPP adapter of prefixcache.Index: a Scorer (prefix
// affinity under the load guard), a PreRequest hook (records where each
// prompt went), a ResponseBody hook (calibrates with the response's
// usage.prompt_tokens_details.cached_tokens) and a metrics Extractor (attach
// it to the metrics data source to calibrate with the pods' prefix-cache
// hit/query counters). Pods leaving the pool are forgotten every
// podSyncInterval.
type PrefixCache struct {
	typedName     fwkplugin.TypedName
	index         *prefixcache.Index
	clock         clock.PassiveClock
	hitsMetric    string
	queriesMetric string
	buffers       sync.Pool // *prefixBuffers
}

// prefixBuffers are per-call scratch, pooled so that scoring allocates
// little beyond the result map the Scorer interface requires.
type prefixBuffers struct {
	rendered []byte
	messages []prefixcache.Message
	parts    []prefixcache.Part
	cands    []prefixcache.Candidate
	scores   []float64
}

// PrefixCacheFactory builds a PrefixCache from its JSON parameters (see
// prefixCacheAPIConfig), with the real clock and no metrics.
func PrefixCacheFactory(name string, raw json.RawMessage, handle fwkplugin.Handle) (fwkplugin.Plugin, error) {
	return NewPrefixCacheFactory(nil, clock.RealClock{})(name, raw, handle)
}

// NewPrefixCacheFactory returns a factory like PrefixCacheFactory whose
// index reports to rec (nil: nowhere) and reads time from clk. When the
// handle is not nil, a goroutine bound to the handle's context forgets pods
// that left handle.PodList() every podSyncInterval.
func NewPrefixCacheFactory(rec prefixcache.Recorder, clk clock.WithTicker) fwkplugin.FactoryFunc {
	return func(name string, raw json.RawMessage, handle fwkplugin.Handle) (fwkplugin.Plugin, error) {
		cfg, err := parsePrefixCacheConfig(raw)
		if err != nil {
			return nil, err
		}
		p, err := newPrefixCache(name, cfg, rec, clk)
		if err != nil {
			return nil, err
		}
		if handle != nil {
			go p.syncPods(handle.Context(), handle.PodList, clk, cfg.podSyncInterval)
		}
		return p, nil
	}
}

func newPrefixCache(name string, cfg prefixCacheConfig, rec prefixcache.Recorder, clk clock.PassiveClock) (*PrefixCache, error) {
	if clk == nil {
		clk = clock.RealClock{}
	}
	var opts []prefixcache.Option
	if rec != nil {
		opts = append(opts, prefixcache.WithRecorder(rec))
	}
	ix, err := prefixcache.New(cfg.index, opts...)
	if err != nil {
		return nil, err
	}
	if name == "" {
		name = PrefixCacheType
	}
	return &PrefixCache{
		typedName:     fwkplugin.TypedName{Type: PrefixCacheType, Name: name},
		index:         ix,
		clock:         clk,
		hitsMetric:    cfg.hitsMetric,
		queriesMetric: cfg.queriesMetric,
	}, nil
}

// syncPods forgets pods absent from podList and expires unanswered
// requests, every interval until ctx ends.
func (p *PrefixCache) syncPods(ctx context.Context, podList func() []k8stypes.NamespacedName, clk clock.WithTicker, interval time.Duration) {
	t := clk.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
			p.forgetAbsent(podList())
			p.index.Expire(clk.Now())
		}
	}
}

// forgetAbsent forgets every indexed pod not in live.
func (p *PrefixCache) forgetAbsent(live []k8stypes.NamespacedName) {
	keep := make(map[prefixcache.PodID]struct{}, len(live))
	for _, nn := range live {
		keep[prefixcache.PodID(nn)] = struct{}{}
	}
	p.index.Retain(func(id prefixcache.PodID) bool {
		_, ok := keep[id]
		return ok
	})
}

// TypedName implements fwkplugin.Plugin.
func (p *PrefixCache) TypedName() fwkplugin.TypedName { return p.typedName }

// Category implements fwksched.Scorer.
func (p *PrefixCache) Category() fwksched.ScorerCategory { return fwksched.Affinity }

// Consumes implements fwkplugin.ConsumerPlugin: the scorer reads only the
// endpoints' core metrics (cache geometry, queue, running, KV use).
func (p *PrefixCache) Consumes() map[string]any { return map[string]any{} }

// Score implements fwksched.Scorer.
func (p *PrefixCache) Score(ctx context.Context, _ *fwksched.CycleState, req *fwksched.LLMRequest, endpoints []fwksched.Endpoint) map[fwksched.Endpoint]float64 {
	result := make(map[fwksched.Endpoint]float64, len(endpoints))
	if len(endpoints) == 0 {
		return result
	}
	buf := p.getBuffers()
	defer p.buffers.Put(buf)
	scores := p.score(ctx, buf, req, endpoints, p.index.Score)
	for i, ep := range endpoints {
		result[ep] = scores[i]
	}
	return result
}

// Affinity writes into out[i] the share of req's prompt endpoints[i] holds, as Score scores it, without counting guard
// actions (the scorer counts them when it runs). out must be at least as long as endpoints.
func (p *PrefixCache) Affinity(ctx context.Context, req *fwksched.LLMRequest, endpoints []fwksched.Endpoint, out []float64) {
	if len(endpoints) == 0 {
		return
	}
	buf := p.getBuffers()
	defer p.buffers.Put(buf)
	copy(out, p.score(ctx, buf, req, endpoints, p.index.Peek))
}

// score renders req's prompt and scores endpoints with scoreFn (the index's Score or Peek) into buf.scores, which it
// returns; a request without a prompt scores 0 everywhere.
func (p *PrefixCache) score(ctx context.Context, buf *prefixBuffers, req *fwksched.LLMRequest, endpoints []fwksched.Endpoint,
	scoreFn func(prefixcache.Prompt, []prefixcache.Candidate, []float64)) []float64 {
	if cap(buf.scores) < len(endpoints) {
		buf.scores = make([]float64, len(endpoints))
	}
	scores := buf.scores[:len(endpoints)]
	prompt, err := p.prompt(buf, req)
	if err != nil {
		log.FromContext(ctx).V(1).Info("prefix cache scorer: no prompt, scoring 0", "reason", err.Error())
		clear(scores)
		return scores
	}
	buf.cands = buf.cands[:0]
	for _, ep := range endpoints {
		buf.cands = append(buf.cands, prefixCandidate(ep))
	}
	scoreFn(prompt, buf.cands, scores)
	return scores
}

// PreRequest implements fwkrc.PreRequest: the primary profile's pod (and a
// P/D prefill pod) will hold the prompt's blocks.
func (p *PrefixCache) PreRequest(ctx context.Context, req *fwksched.LLMRequest, result *fwksched.SchedulingResult) {
	if req == nil || result == nil {
		return
	}
	primary := result.ProfileResults[result.PrimaryProfileName]
	if primary == nil || len(primary.TargetEndpoints) == 0 {
		return
	}
	buf := p.getBuffers()
	defer p.buffers.Put(buf)
	prompt, err := p.prompt(buf, req)
	if err != nil {
		log.FromContext(ctx).V(1).Info("prefix cache scorer: no prompt to record", "reason", err.Error())
		return
	}
	now := p.clock.Now()
	p.index.Route(now, req.RequestId, prompt, prefixCandidate(primary.TargetEndpoints[0]))
	if result.PrimaryProfileName != prefillProfile {
		if pr := result.ProfileResults[prefillProfile]; pr != nil && len(pr.TargetEndpoints) > 0 {
			p.index.Route(now, "", prompt, prefixCandidate(pr.TargetEndpoints[0]))
		}
	}
}

// ResponseBody implements fwkrc.ResponseBody: at the end of the response,
// the request stops counting as in flight and, when the server reported
// cached tokens, calibrates the pod it went to.
func (p *PrefixCache) ResponseBody(_ context.Context, req *fwksched.LLMRequest, resp *fwkrc.Response, _ *fwkdl.EndpointMetadata) {
	if req == nil || resp == nil || !resp.EndOfStream {
		return
	}
	u := prefixcache.Usage{PromptTokens: resp.Usage.PromptTokens}
	if d := resp.Usage.PromptTokenDetails; d != nil {
		u.CachedTokens, u.CachedReported = d.CachedTokens, true
	}
	p.index.ObserveUsage(p.clock.Now(), req.RequestId, u)
}

// ExpectedInputType implements fwkdl.Extractor: the metrics data source's
// parsed Prometheus families.
func (p *PrefixCache) ExpectedInputType() reflect.Type { return sourcemetrics.PrometheusMetricType }

// Extract implements fwkdl.Extractor: it feeds the pod's cumulative
// prefix-cache counters to calibration. A server exporting neither counter
// is skipped silently; one exporting only one of them is an error.
func (p *PrefixCache) Extract(_ context.Context, data any, ep fwkdl.Endpoint) error {
	families, ok := data.(sourcemetrics.PrometheusMetricMap)
	if !ok {
		return fmt.Errorf("%s: unexpected extractor input %T", PrefixCacheType, data)
	}
	hits, okH := sumCounter(families, p.hitsMetric)
	queries, okQ := sumCounter(families, p.queriesMetric)
	switch {
	case !okH && !okQ:
		return nil
	case !okH || !okQ:
		return fmt.Errorf("%s: pod exports only one of %s and %s", PrefixCacheType, p.hitsMetric, p.queriesMetric)
	}
	meta := ep.GetMetadata()
	if meta == nil {
		return nil
	}
	p.index.ObserveCounters(p.clock.Now(), prefixcache.PodID(meta.NamespacedName), hits, queries)
	return nil
}

// sumCounter adds up every series of the family name (one per label set,
// e.g. per model), accepting counters and untyped samples.
func sumCounter(families sourcemetrics.PrometheusMetricMap, name string) (float64, bool) {
	f := families[name]
	if f == nil {
		return 0, false
	}
	var sum float64
	for _, m := range f.GetMetric() {
		switch {
		case m.GetCounter() != nil:
			sum += m.GetCounter().GetValue()
		case m.GetUntyped() != nil:
			sum += m.GetUntyped().GetValue()
		case m.GetGauge() != nil:
			sum += m.GetGauge().GetValue()
		}
	}
	return sum, !math.IsNaN(sum)
}

// prefixCandidate reads an endpoint's identity, cache geometry and load.
func prefixCandidate(ep fwksched.Endpoint) prefixcache.Candidate {
	var c prefixcache.Candidate
	if meta := ep.GetMetadata(); meta != nil {
		c.Pod = prefixcache.PodID(meta.NamespacedName)
	}
	if m := ep.GetMetrics(); m != nil {
		c.Cache = prefixcache.CacheInfo{NumBlocks: m.CacheNumBlocks, BlockTokens: m.CacheBlockSize}
		c.Load = prefixcache.Load{Queued: m.WaitingQueueSize, Running: m.RunningRequestsSize, KVUtilization: m.KVCacheUsagePercent}
	}
	return c
}

func (p *PrefixCache) getBuffers() *prefixBuffers {
	if b, ok := p.buffers.Get().(*prefixBuffers); ok {
		return b
	}
	return &prefixBuffers{}
}

// errNoPrompt means the request carries nothing a prefix cache keys on.
var errNoPrompt = errors.New("request has no prompt")

// prompt renders the request's prompt into buf.rendered, as the model
// server would see its prefix: a completions prompt as text; a chat as its
// tools and every message in order; a responses request as instructions
// (system), tools and input; a conversation as its items.
func (p *PrefixCache) prompt(buf *prefixBuffers, req *fwksched.LLMRequest) (prefixcache.Prompt, error) {
	if req == nil || req.Body == nil {
		return prefixcache.Prompt{}, errNoPrompt
	}
	b := req.Body
	out := prefixcache.Prompt{Salt: prefixcache.Salt{Model: req.TargetModel, CacheSalt: b.CacheSalt()}}
	var err error
	r := buf.rendered[:0]
	switch {
	case b.ChatCompletions != nil:
		var tools any
		if len(b.ChatCompletions.Tools) > 0 {
			tools = b.ChatCompletions.Tools
		}
		r, err = prefixcache.AppendChat(r, prefixcache.Chat{Tools: tools, Messages: chatMessages(buf, b.ChatCompletions.Messages)})
	case b.Completions != nil:
		r = prefixcache.AppendText(r, b.Completions.Prompt.PlainText())
	case b.Responses != nil:
		r, err = prefixcache.AppendChat(r, responsesChat(b.Responses))
	case b.Conversations != nil:
		msgs := make([]prefixcache.Message, 0, len(b.Conversations.Items))
		for _, it := range b.Conversations.Items {
			msgs = append(msgs, prefixcache.Message{Role: it.Role, Parts: anyParts(it.Type, it.Content)})
		}
		r, err = prefixcache.AppendChat(r, prefixcache.Chat{Messages: msgs})
	case b.Embeddings != nil:
		if s, ok := b.Embeddings.Input.(string); ok {
			r = prefixcache.AppendText(r, s)
		} else {
			var in []byte
			in, err = json.Marshal(b.Embeddings.Input)
			r = prefixcache.AppendText(r, string(in))
		}
	default:
		return prefixcache.Prompt{}, errNoPrompt
	}
	buf.rendered = r
	if err != nil {
		return prefixcache.Prompt{}, err
	}
	out.Rendered = r
	return out, nil
}

// chatMessages converts chat messages into buf's reusable slices.
func chatMessages(buf *prefixBuffers, in []fwksched.Message) []prefixcache.Message {
	parts := buf.parts[:0]
	for _, m := range in {
		if m.Content.Raw != "" || m.Content.Structured == nil {
			parts = append(parts, prefixcache.Part{Kind: "text", Value: m.Content.Raw})
			continue
		}
		for _, blk := range m.Content.Structured {
			parts = append(parts, contentPart(blk))
		}
	}
	buf.parts = parts
	msgs := buf.messages[:0]
	next := 0
	for _, m := range in {
		n := 1
		if m.Content.Raw == "" && m.Content.Structured != nil {
			n = len(m.Content.Structured)
		}
		msgs = append(msgs, prefixcache.Message{Role: m.Role, Parts: parts[next : next+n : next+n]})
		next += n
	}
	buf.messages = msgs
	return msgs
}

// contentPart identifies one OpenAI content block by what the model sees.
func contentPart(b fwksched.ContentBlock) prefixcache.Part {
	switch b.Type {
	case "text":
		return prefixcache.Part{Kind: b.Type, Value: b.Text}
	case "image_url":
		return prefixcache.Part{Kind: b.Type, Value: b.ImageURL.Url}
	case "input_audio":
		return prefixcache.Part{Kind: b.Type, Value: b.InputAudio.Format + ":" + b.InputAudio.Data}
	case "video_url":
		return prefixcache.Part{Kind: b.Type, Value: b.VideoURL.Url}
	}
	return prefixcache.Part{Kind: b.Type, Value: b.Text}
}

// responsesChat maps a /v1/responses request onto a chat: instructions
// are the system prompt, input a user message or a list of items.
func responsesChat(r *fwksched.ResponsesRequest) prefixcache.Chat {
	c := prefixcache.Chat{Tools: r.Tools}
	if r.Instructions != nil {
		c.Messages = append(c.Messages, prefixcache.Message{Role: "system", Parts: anyParts("text", r.Instructions)})
	}
	switch in := r.Input.(type) {
	case []any:
		for _, it := range in {
			role := ""
			if m, ok := it.(map[string]any); ok {
				role, _ = m["role"].(string)
			}
			c.Messages = append(c.Messages, prefixcache.Message{Role: role, Parts: anyParts("item", it)})
		}
	default:
		c.Messages = append(c.Messages, prefixcache.Message{Role: "user", Parts: anyParts("text", in)})
	}
	return c
}

// anyParts renders decoded JSON content: a string as itself, anything
// else as its canonical JSON.
func anyParts(kind string, v any) []prefixcache.Part {
	if s, ok := v.(string); ok {
		return []prefixcache.Part{{Kind: kind, Value: s}}
	}
	b, err := json.Marshal(v)
	if err != nil {
		return []prefixcache.Part{{Kind: kind}}
	}
	return []prefixcache.Part{{Kind: kind + "/json", Value: string(b)}}
}
