package prefixcache

import (
	"math"
	"time"
)

// calibration is one pod's learned correction of its nominal capacity. The
// index models the pod's cache as an LRU of limit = max(1, ⌊f·nominal⌋)
// blocks; f starts at 1 and moves with every check of a prediction against
// what the server reported (see doc.go). Guarded by the pod's mutex.
type calibration struct {
	fraction float64 // f, in [MinCapacityFraction, 1]

	// Counter-based checks: the pod's last prefix-cache counters and what
	// this index routed to it since then.
	haveCounters          bool
	lastHits, lastQueries float64
	routedTokens          float64 // approximate prompt tokens routed
	predictedTokens       float64 // of which predicted cached
}

func (c *calibration) reset() { *c = calibration{fraction: 1} }

// limit is the effective capacity for nominal blocks.
func (c *calibration) limit(nominal int) int {
	return max(1, int(c.fraction*float64(nominal)))
}

func (c *calibration) routed(promptTokens, predictedTokens float64) {
	c.routedTokens += promptTokens
	c.predictedTokens += predictedTokens
}

// update folds in one check: ratio is what the server reported cached
// divided by what was predicted (both as fractions of the prompt).
func (c *calibration) update(cfg CalibrationConfig, ratio float64) {
	ratio = math.Max(0, ratio)
	if ratio < 1-cfg.Tolerance {
		c.fraction *= 1 - cfg.ShrinkGain*(1-ratio)
	} else {
		c.fraction += cfg.GrowGain * (1 - c.fraction)
	}
	c.fraction = math.Min(1, math.Max(cfg.MinCapacityFraction, c.fraction))
}

// Usage is what a server reported for one request.
type Usage struct {
	// PromptTokens is usage.prompt_tokens.
	PromptTokens int
	// CachedTokens is usage.prompt_tokens_details.cached_tokens, valid when
	// CachedReported.
	CachedTokens   int
	CachedReported bool
}

// ObserveUsage ends the request Route recorded under requestID: it is no
// longer in flight, and when the server reported cached tokens and a hit
// had been predicted, the ratio of reported to predicted cached fraction
// calibrates the pod. Unknown (or expired) ids are ignored.
func (ix *Index) ObserveUsage(now time.Time, requestID string, u Usage) {
	e, ok := ix.pending.take(now, requestID)
	if !ok {
		return
	}
	e.pod.inflight.Add(-1)
	if !u.CachedReported || u.PromptTokens <= 0 || e.predicted < ix.cfg.Calibration.MinPredictedFraction {
		return
	}
	actual := math.Min(1, float64(u.CachedTokens)/float64(u.PromptTokens))
	ix.calibrate(e.pod, actual/e.predicted, SourceUsage)
}

// ObserveCounters feeds pod id's cumulative prefix-cache counters
// (vllm:prefix_cache_hits_total and vllm:prefix_cache_queries_total, in
// tokens). Once queries grew by MinCounterQueries since the last
// comparison, the interval's hit rate is compared with the hit rate this
// index predicted for what it routed there. A counter that went down means
// the server restarted with an empty cache: the pod's entries are dropped.
func (ix *Index) ObserveCounters(now time.Time, id PodID, hits, queries float64) {
	p := ix.reg.Load().pods[id]
	if p == nil || math.IsNaN(hits) || math.IsNaN(queries) {
		return
	}
	p.mu.Lock()
	if p.gone {
		p.mu.Unlock()
		return
	}
	c := &p.cal
	if !c.haveCounters {
		c.haveCounters, c.lastHits, c.lastQueries = true, hits, queries
		c.routedTokens, c.predictedTokens = 0, 0
		p.mu.Unlock()
		return
	}
	dh, dq := hits-c.lastHits, queries-c.lastQueries
	if dh < 0 || dq < 0 {
		c.lastHits, c.lastQueries = hits, queries
		c.routedTokens, c.predictedTokens = 0, 0
		for _, h := range p.table.appendAll(p.evicted[:0]) {
			p.group.clear(h, p.bit)
		}
		p.table = newLRUTable(int(p.nominal.Load()))
		p.table.setLimit(c.limit(int(p.nominal.Load())), nil)
		p.mu.Unlock()
		return
	}
	if dq < ix.cfg.Calibration.MinCounterQueries {
		p.mu.Unlock()
		return
	}
	routed, predicted := c.routedTokens, c.predictedTokens
	c.lastHits, c.lastQueries = hits, queries
	c.routedTokens, c.predictedTokens = 0, 0
	p.mu.Unlock()
	if routed <= 0 {
		return
	}
	predictedRate := predicted / routed
	if predictedRate < ix.cfg.Calibration.MinPredictedFraction {
		return
	}
	ix.calibrate(p, (dh/dq)/predictedRate, SourceCounters)
}

// calibrate applies one check to p and trims its table to the new limit.
func (ix *Index) calibrate(p *pod, ratio float64, src CalibrationSource) {
	ix.rec.ObserveCalibration(src, ratio)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.gone {
		return
	}
	p.cal.update(ix.cfg.Calibration, ratio)
	ev := p.table.setLimit(p.cal.limit(int(p.nominal.Load())), p.evicted[:0])
	for _, h := range ev {
		p.group.clear(h, p.bit)
	}
	p.evicted = ev[:0]
}
