package plugins

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"reflect"
	"sync"
	"time"
	"weak"

	k8stypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/log"

	fwkdl "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/datalayer"
	fwkplugin "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/plugin"
	fwkrc "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/requestcontrol"
	fwksched "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/scheduling"
	sourcemetrics "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/datalayer/source/metrics"

	"github.com/sluice-gw/sluice/internal/ttlmap"
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

// PrefixCache is the EPP adapter of prefixcache.Index: a Scorer (prefix
// affinity under the load guard), a PreRequest hook (records where each
// prompt went), a ResponseBody hook (calibrates with the response's
// usage.prompt_tokens_details.cached_tokens) and a metrics Extractor (attach
// it to the metrics data source to calibrate with the pods' prefix-cache
// hit/query counters). Every podSyncInterval, SyncPods forgets pods that left
// the pool and requests whose response never ended.
type PrefixCache struct {
	typedName       fwkplugin.TypedName
	index           *prefixcache.Index
	clock           clock.PassiveClock
	podSyncInterval time.Duration
	hitsMetric      string
	queriesMetric   string
	buffers         sync.Pool // *prefixBuffers
	chains          requestChains
}

// requestChains keeps each request's prompt chains from its first scoring
// (admission's affinity look, Score) to the insert after the pick
// (PreRequest), which takes them out. The key is the request object, which
// upstream's Director allocates for each request and whose body does not
// change once scheduling begins (the salt, which may, is checked by
// Chains). Keys are weak, so a request that is
// never routed is not kept alive by its entry; its entry expires after
// chainsTTL or when maxRequestChains newer ones are held.
type requestChains struct {
	mu sync.Mutex
	m  *ttlmap.Map[weak.Pointer[fwksched.LLMRequest], *prefixcache.Chains]
}

// Bounds of requestChains. A request is scored and routed within one
// scheduling cycle, so a few seconds suffice; a request admission looks at
// and queues for longer is hashed again when it is scheduled. Entries expire
// only when the map is next used, so an idle EPP keeps at most
// maxRequestChains of them: each a request's block hashes per block size
// (at most the index's blocks per prompt), a few MiB in all at the defaults.
const (
	chainsTTL        = 10 * time.Second
	maxRequestChains = 4096
)

// get returns req's chains, new and kept when it has none (take: removed,
// nil when it has none).
func (rc *requestChains) get(now time.Time, req *fwksched.LLMRequest, take bool) *prefixcache.Chains {
	key := weak.Make(req)
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if rc.m == nil {
		rc.m = ttlmap.New[weak.Pointer[fwksched.LLMRequest], *prefixcache.Chains](chainsTTL, nil)
	}
	if take {
		c, _ := rc.m.Take(now, key)
		return c
	}
	if c, ok := rc.m.Get(now, key); ok {
		return c
	}
	c := &prefixcache.Chains{}
	rc.m.Put(now, key, c)
	for rc.m.Len() > maxRequestChains {
		rc.m.DropOldest()
	}
	return c
}

// heldChains is how many requests' chains the scorer holds (tests).
func (p *PrefixCache) heldChains() int {
	p.chains.mu.Lock()
	defer p.chains.mu.Unlock()
	if p.chains.m == nil {
		return 0
	}
	return p.chains.m.Len()
}

// prefixBuffers are per-call scratch, pooled so that scoring allocates
// little beyond the result map the Scorer interface requires.
type prefixBuffers struct {
	messages []prefixcache.Message
	parts    []prefixcache.Part
	cands    []prefixcache.Candidate
	scores   []float64
}

// PrefixCacheFactory builds a PrefixCache from its JSON parameters (see
// prefixCacheAPIConfig), with no metrics, on the handle's clock (see
// ClockHandle) or the wall clock.
func PrefixCacheFactory(name string, raw json.RawMessage, handle fwkplugin.Handle) (fwkplugin.Plugin, error) {
	return NewPrefixCacheFactory(nil, clock.RealClock{})(name, raw, handle)
}

// NewPrefixCacheFactory returns a factory like PrefixCacheFactory whose
// index reports to rec (nil: nowhere) and reads time from clk, unless the
// handle is a ClockHandle. When the handle is not nil, a goroutine bound to
// the handle's context runs SyncPods with handle.PodList() every
// podSyncInterval of clk's ticker.
func NewPrefixCacheFactory(rec prefixcache.Recorder, clk clock.WithTicker) fwkplugin.FactoryFunc {
	return func(name string, raw json.RawMessage, handle fwkplugin.Handle) (fwkplugin.Plugin, error) {
		cfg, err := parsePrefixCacheConfig(raw)
		if err != nil {
			return nil, err
		}
		p, err := newPrefixCache(name, cfg, rec, clockOf(handle, clk))
		if err != nil {
			return nil, err
		}
		if handle != nil {
			go p.syncPods(handle.Context(), handle.PodList, clk)
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
		typedName:       fwkplugin.TypedName{Type: PrefixCacheType, Name: name},
		index:           ix,
		clock:           clk,
		podSyncInterval: cfg.podSyncInterval,
		hitsMetric:      cfg.hitsMetric,
		queriesMetric:   cfg.queriesMetric,
	}, nil
}

// syncPods runs SyncPods every podSyncInterval of ticker's clock until ctx ends.
func (p *PrefixCache) syncPods(ctx context.Context, podList func() []k8stypes.NamespacedName, ticker clock.WithTicker) {
	t := ticker.NewTicker(p.podSyncInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
			p.SyncPods(p.clock.Now(), podList())
		}
	}
}

// PodSyncInterval is how often SyncPods should run (the podSyncInterval parameter).
func (p *PrefixCache) PodSyncInterval() time.Duration { return p.podSyncInterval }

// SyncPods is the scorer's periodic maintenance: it forgets every indexed pod not in live (the pool's pods now) and
// the requests routed pendingTTL or longer before now whose response never ended. The factory runs it on a ticker
// bound to the handle's context; a caller whose handle context is done (the virtual-time engine) runs it on its own
// clock.
func (p *PrefixCache) SyncPods(now time.Time, live []k8stypes.NamespacedName) {
	keep := make(map[prefixcache.PodID]struct{}, len(live))
	for _, nn := range live {
		keep[prefixcache.PodID(nn)] = struct{}{}
	}
	p.index.Retain(func(id prefixcache.PodID) bool {
		_, ok := keep[id]
		return ok
	})
	p.index.Expire(now)
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
	var chains *prefixcache.Chains
	if req != nil {
		chains = p.chains.get(p.clock.Now(), req, false)
	}
	prompt, err := p.prompt(buf, req, chains)
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
	now := p.clock.Now()
	chains := p.chains.get(now, req, true)
	if chains == nil {
		chains = &prefixcache.Chains{} // for the P/D prefill pod's insert below
	}
	prompt, err := p.prompt(buf, req, chains)
	if err != nil {
		log.FromContext(ctx).V(1).Info("prefix cache scorer: no prompt to record", "reason", err.Error())
		return
	}
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
