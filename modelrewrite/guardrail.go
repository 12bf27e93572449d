package modelrewrite

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"
)

// Guardrail defaults, applied to zero fields of GuardrailConfig.
const (
	DefaultGuardrailMargin      = 0.05
	DefaultGuardrailWindow      = 5 * time.Minute
	DefaultGuardrailMinRequests = 20
	DefaultGuardrailBuckets     = 10
)

// GuardrailConfig configures a Guardrail. Zero fields take the defaults.
type GuardrailConfig struct {
	// Margin is how much higher, as an absolute error ratio in (0,1), a
	// target's error ratio must be than its stable target's to trip:
	// 0.05 trips a canary at 7% errors when the stable target has 1.9%.
	Margin float64
	// Window is the sliding time window over which error ratios are
	// measured. It is kept as Buckets buckets, so the oldest outcomes expire
	// in steps of Window/Buckets and the measured span is between
	// Window*(Buckets-1)/Buckets and Window.
	Window time.Duration
	// MinRequests is how many outcomes both the target and the stable target
	// need in the window before they are compared, so a few early errors
	// cannot trip a canary.
	MinRequests int
	// Buckets is the window's resolution.
	Buckets int
	// Recorder is told about every trip and clear; nil records nothing.
	Recorder TripRecorder
}

// TripRecorder is told when a target's guardrail trips or is cleared.
type TripRecorder interface {
	RecordTripped(rule RuleID, target string, tripped bool)
}

// Trip describes a tripped target: from Since until cleared, requests the
// split sends to Target go to Stable.
type Trip struct {
	Rule   RuleID
	Target string
	Stable string
	Since  time.Time
	// The error ratios and outcome counts in the window when it tripped.
	TargetErrorRatio, StableErrorRatio float64
	TargetRequests, StableRequests     int64
}

// Guardrail is the opt-in canary guardrail, a state machine per (rule,
// target): a target starts Healthy; Record trips it once, over the window,
// it has at least MinRequests outcomes, so does the rule's stable target,
// and its error ratio exceeds the stable target's by more than Margin. A
// tripped target stays tripped, whatever it or the stable target does next,
// until Clear. The stable target itself never trips: it is where tripped
// traffic goes. Clearing also forgets the target's window, so it is judged
// on fresh outcomes only.
//
// Time comes only from the now arguments. Outcomes older than the bucket a
// slot already holds (the clock stepped back) are ignored. State for rules
// without trips and without outcomes for a whole window is dropped, so
// memory follows the rules in use. A nil *Guardrail trips nothing. Methods
// are safe for concurrent use.
type Guardrail struct {
	margin      float64
	minRequests int64
	window      time.Duration
	bucketWidth int64 // nanoseconds
	buckets     int
	recorder    TripRecorder

	mu        sync.RWMutex
	rules     map[RuleID]*ruleHealth
	lastSweep time.Time
}

type ruleHealth struct {
	stable   string // the stable target named by the latest Decision
	lastSeen time.Time
	windows  map[string]*outcomeWindow
	tripped  map[string]Trip
}

// outcomeWindow counts outcomes in a ring of time buckets.
type outcomeWindow struct {
	slots []outcomeSlot
}

type outcomeSlot struct {
	epoch         int64 // bucket number: UnixNano / bucketWidth
	total, failed int64
}

// NewGuardrail validates cfg and returns a Guardrail with no trips.
func NewGuardrail(cfg GuardrailConfig) (*Guardrail, error) {
	if cfg.Margin == 0 {
		cfg.Margin = DefaultGuardrailMargin
	}
	if cfg.Window == 0 {
		cfg.Window = DefaultGuardrailWindow
	}
	if cfg.MinRequests == 0 {
		cfg.MinRequests = DefaultGuardrailMinRequests
	}
	if cfg.Buckets == 0 {
		cfg.Buckets = DefaultGuardrailBuckets
	}
	var errs []error
	if !(cfg.Margin > 0 && cfg.Margin < 1) {
		errs = append(errs, fmt.Errorf("guardrail margin %v: must be an error ratio in (0,1)", cfg.Margin))
	}
	if cfg.MinRequests < 0 {
		errs = append(errs, fmt.Errorf("guardrail minRequests %d: must not be negative", cfg.MinRequests))
	}
	if cfg.Buckets < 1 {
		errs = append(errs, fmt.Errorf("guardrail buckets %d: must be at least 1", cfg.Buckets))
	} else if cfg.Window < time.Duration(cfg.Buckets) {
		errs = append(errs, fmt.Errorf("guardrail window %v: must be at least one nanosecond per bucket (%d buckets)", cfg.Window, cfg.Buckets))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return &Guardrail{
		margin:      cfg.Margin,
		minRequests: int64(cfg.MinRequests),
		window:      cfg.Window,
		bucketWidth: int64(cfg.Window) / int64(cfg.Buckets),
		buckets:     cfg.Buckets,
		recorder:    cfg.Recorder,
		rules:       make(map[RuleID]*ruleHealth),
	}, nil
}

// Record counts the outcome of a request decided as d (failed: the request
// ended in an error) at now, and reports whether this outcome tripped a
// target. Decisions that rewrote nothing (KindNoMatch, KindUnchanged) are
// ignored. A diverted request counts for the stable target that served it.
func (g *Guardrail) Record(d Decision, failed bool, now time.Time) (tripped bool) {
	if g == nil || !d.Rewritten() {
		return false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.sweepLocked(now)
	rh := g.rules[d.Rule]
	if rh == nil {
		rh = &ruleHealth{windows: make(map[string]*outcomeWindow), tripped: make(map[string]Trip)}
		g.rules[d.Rule] = rh
	}
	rh.stable = d.Stable
	rh.lastSeen = now
	w := rh.windows[d.Model]
	if w == nil {
		w = &outcomeWindow{slots: make([]outcomeSlot, g.buckets)}
		rh.windows[d.Model] = w
	}
	w.add(g.epoch(now), failed)

	if d.Model != d.Stable {
		return g.evaluateLocked(d.Rule, rh, d.Model, now)
	}
	// A stable outcome can lower the stable ratio and so open the margin for
	// any other target of the rule.
	for target := range rh.windows {
		if target != rh.stable && g.evaluateLocked(d.Rule, rh, target, now) {
			tripped = true
		}
	}
	return tripped
}

// evaluateLocked trips target if it crossed the margin. g.mu must be held.
func (g *Guardrail) evaluateLocked(rule RuleID, rh *ruleHealth, target string, now time.Time) bool {
	if _, already := rh.tripped[target]; already {
		return false
	}
	tw, sw := rh.windows[target], rh.windows[rh.stable]
	if tw == nil || sw == nil {
		return false
	}
	cur := g.epoch(now)
	tTotal, tFailed := tw.sum(cur)
	sTotal, sFailed := sw.sum(cur)
	if tTotal == 0 || sTotal == 0 || tTotal < g.minRequests || sTotal < g.minRequests {
		return false
	}
	tRatio, sRatio := float64(tFailed)/float64(tTotal), float64(sFailed)/float64(sTotal)
	if tRatio-sRatio <= g.margin {
		return false
	}
	rh.tripped[target] = Trip{
		Rule: rule, Target: target, Stable: rh.stable, Since: now,
		TargetErrorRatio: tRatio, StableErrorRatio: sRatio,
		TargetRequests: tTotal, StableRequests: sTotal,
	}
	if g.recorder != nil {
		g.recorder.RecordTripped(rule, target, true)
	}
	return true
}

// Tripped reports whether target of rule is tripped. It implements
// TripChecker.
func (g *Guardrail) Tripped(rule RuleID, target string) bool {
	if g == nil {
		return false
	}
	g.mu.RLock()
	defer g.mu.RUnlock()
	rh := g.rules[rule]
	if rh == nil {
		return false
	}
	_, tripped := rh.tripped[target]
	return tripped
}

// Clear is the operator's reset: target of rule gets its share back and
// starts a fresh window. It reports whether target was tripped.
func (g *Guardrail) Clear(rule RuleID, target string) bool {
	if g == nil {
		return false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	rh := g.rules[rule]
	if rh == nil {
		return false
	}
	_, wasTripped := rh.tripped[target]
	delete(rh.tripped, target)
	delete(rh.windows, target)
	if wasTripped && g.recorder != nil {
		g.recorder.RecordTripped(rule, target, false)
	}
	return wasTripped
}

// Trips lists the tripped targets, ordered by rule then target.
func (g *Guardrail) Trips() []Trip {
	if g == nil {
		return nil
	}
	g.mu.RLock()
	var trips []Trip
	for _, rh := range g.rules {
		for _, t := range rh.tripped {
			trips = append(trips, t)
		}
	}
	g.mu.RUnlock()
	slices.SortFunc(trips, func(a, b Trip) int {
		return cmp.Or(
			cmp.Compare(a.Rule.Object.Namespace, b.Rule.Object.Namespace),
			cmp.Compare(a.Rule.Object.Name, b.Rule.Object.Name),
			cmp.Compare(a.Rule.Index, b.Rule.Index),
			cmp.Compare(a.Target, b.Target),
		)
	})
	return trips
}

// sweepLocked drops, at most once per window, the state of rules with no
// trips and no outcome for a whole window. g.mu must be held.
func (g *Guardrail) sweepLocked(now time.Time) {
	if now.Sub(g.lastSweep) < g.window {
		return
	}
	g.lastSweep = now
	for id, rh := range g.rules {
		if len(rh.tripped) == 0 && now.Sub(rh.lastSeen) >= g.window {
			delete(g.rules, id)
		}
	}
}

func (g *Guardrail) epoch(now time.Time) int64 { return now.UnixNano() / g.bucketWidth }

func (w *outcomeWindow) add(epoch int64, failed bool) {
	n := int64(len(w.slots))
	s := &w.slots[((epoch%n)+n)%n]
	switch {
	case s.epoch > epoch:
		return // older than what the slot holds: the clock stepped back
	case s.epoch < epoch:
		*s = outcomeSlot{epoch: epoch}
	}
	s.total++
	if failed {
		s.failed++
	}
}

// sum totals the buckets within the window ending in bucket cur.
func (w *outcomeWindow) sum(cur int64) (total, failed int64) {
	oldest := cur - int64(len(w.slots)) + 1
	for _, s := range w.slots {
		if s.epoch >= oldest && s.epoch <= cur {
			total += s.total
			failed += s.failed
		}
	}
	return total, failed
}
