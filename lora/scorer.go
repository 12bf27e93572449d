package lora

import (
	"container/list"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"
)

// Default configuration values.
const (
	// DefaultSpillQueueDepth matches upstream's saturation detector default
	// queue threshold (5): beyond it a pod is saturated, and loading the
	// adapter on a pod with a free slot (tens to hundreds of milliseconds from
	// host memory) costs less than waiting behind that queue.
	DefaultSpillQueueDepth = 5
	// DefaultLoadBound lets a placement target carry up to 25% more than the
	// candidates' average load, the usual trade-off of consistent hashing with
	// bounded loads: stable placements, no pod far above average.
	DefaultLoadBound = 0.25
	// DefaultMemoryHalfLife halves a remembered send's weight every 30 s: an
	// idle adapter survives on a busy pod until enough other adapters are
	// requested there, which at typical multi-adapter rates takes seconds to
	// minutes.
	DefaultMemoryHalfLife = 30 * time.Second
	// DefaultMemoryTTL forgets a send after four half-lives (weight 1/16).
	DefaultMemoryTTL = 2 * time.Minute
	// DefaultMemoryCapacity bounds the Memory to 4096 (adapter, pod) pairs,
	// e.g. 64 adapters on each of 64 pods, at roughly 150 bytes each.
	DefaultMemoryCapacity = 4096
)

// Scores returned by Score. Their order is the contract; see the package doc.
const (
	// Neutral is the score of every pod when adapter state says nothing about
	// the request (a base-model request, or no LoRA information at all), and
	// of a pod without LoRA information.
	Neutral = 0.5
	// placementTarget is the score of the pod chosen to load the adapter.
	placementTarget = 1.0
	// spareSlotBase and spareSlotSpan place the other pods that can load the
	// adapter in [0.3, 0.6) by rendezvous order.
	spareSlotBase = 0.3
	spareSlotSpan = 0.3
	// idleSlot is the score of a pod that could load the adapter while a
	// healthy pod already holds it.
	idleSlot = 0.2
	// overloadedHolderMax scales the confidence of a holder whose queue is too
	// deep, so that any placement target (1) and most spare slots beat it.
	overloadedHolderMax = 0.4
	// noSlot is the score of a pod whose adapter slots are all busy with other
	// adapters: the request would wait for a slot.
	noSlot = 0.0
	// confirmedConfidence is the confidence from which a healthy holder makes a
	// new placement unnecessary: in flight, resident, or sent within one
	// memory half-life.
	confirmedConfidence = 0.5
)

// Config parameterises a Scorer.
type Config struct {
	// SpillQueueDepth is the queue depth beyond which a pod holding the
	// adapter counts as overloaded, so that a pod with a free slot wins.
	SpillQueueDepth int
	// LoadBound is epsilon of bounded-load rendezvous hashing: the placement
	// target's load+1 stays within (1+LoadBound) times the average.
	LoadBound float64
	// MemoryHalfLife is the time after which a remembered send weighs half.
	MemoryHalfLife time.Duration
	// MemoryTTL is the age from which a remembered send is forgotten.
	MemoryTTL time.Duration
	// MemoryCapacity bounds the number of remembered (adapter, pod) sends.
	MemoryCapacity int
}

// DefaultConfig returns the documented defaults.
func DefaultConfig() Config {
	return Config{
		SpillQueueDepth: DefaultSpillQueueDepth,
		LoadBound:       DefaultLoadBound,
		MemoryHalfLife:  DefaultMemoryHalfLife,
		MemoryTTL:       DefaultMemoryTTL,
		MemoryCapacity:  DefaultMemoryCapacity,
	}
}

// Validate reports every constraint c violates.
func (c Config) Validate() error {
	var errs []error
	if c.SpillQueueDepth < 0 {
		errs = append(errs, fmt.Errorf("SpillQueueDepth must be >= 0, got %d", c.SpillQueueDepth))
	}
	if c.LoadBound <= 0 || math.IsInf(c.LoadBound, 0) || math.IsNaN(c.LoadBound) {
		errs = append(errs, fmt.Errorf("LoadBound must be a finite number > 0, got %v", c.LoadBound))
	}
	if c.MemoryHalfLife <= 0 {
		errs = append(errs, fmt.Errorf("MemoryHalfLife must be > 0, got %v", c.MemoryHalfLife))
	}
	if c.MemoryTTL < c.MemoryHalfLife {
		errs = append(errs, fmt.Errorf("MemoryTTL (%v) must be >= MemoryHalfLife (%v)", c.MemoryTTL, c.MemoryHalfLife))
	}
	if c.MemoryCapacity <= 0 {
		errs = append(errs, fmt.Errorf("MemoryCapacity must be > 0, got %d", c.MemoryCapacity))
	}
	return errors.Join(errs...)
}

// Scorer scores pods for LoRA adapter affinity and remembers where adapters
// were sent.
type Scorer struct {
	cfg      Config
	memory   *Memory
	recorder Recorder
	scratch  sync.Pool // *[]podScratch
}

// podScratch is Score's per-pod working state.
type podScratch struct {
	confidence float64
	slotsFull  bool
}

// NewScorer returns a Scorer with an empty Memory. A nil rec records nothing.
func NewScorer(cfg Config, rec Recorder) (*Scorer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("invalid LoRA scorer configuration: %w", err)
	}
	if rec == nil {
		rec = noRecorder{}
	}
	return &Scorer{
		cfg:      cfg,
		memory:   newMemory(cfg.MemoryCapacity, cfg.MemoryHalfLife, cfg.MemoryTTL, rec),
		recorder: rec,
	}, nil
}

// Memory returns the Scorer's memory of sends.
func (s *Scorer) Memory() *Memory { return s.memory }

// Record notes that a request for adapter was sent to pod at now. Base-model
// requests (adapter "") are not remembered.
func (s *Scorer) Record(adapter, pod string, now time.Time) {
	if adapter == "" {
		return
	}
	s.memory.Record(adapter, pod, now)
}

// Score returns one score in [0,1] per pod, in the order of pods.
func (s *Scorer) Score(req Request, pods []PodState, now time.Time) []float64 {
	out := make([]float64, len(pods))
	s.ScoreInto(out, req, pods, now)
	return out
}

// ScoreInto writes Score's result into out, which must have len(pods)
// elements, and returns the rule that decided it.
func (s *Scorer) ScoreInto(out []float64, req Request, pods []PodState, now time.Time) Outcome {
	if len(out) != len(pods) {
		panic(fmt.Sprintf("lora: ScoreInto needs len(out) == len(pods), got %d and %d", len(out), len(pods)))
	}
	outcome := s.score(out, req, pods, now)
	if len(pods) > 0 {
		s.recorder.RecordScore(outcome)
	}
	return outcome
}

func (s *Scorer) score(out []float64, req Request, pods []PodState, now time.Time) Outcome {
	if req.Adapter == "" {
		fill(out, Neutral)
		return OutcomeBaseModel
	}
	adapter := req.Adapter

	sp := s.getScratch(len(pods))
	defer s.scratch.Put(sp)
	scratch := *sp

	anyInfo, anyHolder, healthyHolder, overloadedHolder := false, false, false, false
	s.memory.mu.RLock()
	remembered := s.memory.byAdapter[adapter]
	for i := range pods {
		p := &pods[i]
		full := p.slotsFull(adapter)
		c := s.confidenceLocked(p, adapter, full, remembered, now)
		scratch[i] = podScratch{confidence: c, slotsFull: full}
		anyInfo = anyInfo || p.hasInfo()
		anyHolder = anyHolder || c > 0
		healthyHolder = healthyHolder || (c >= confirmedConfidence && !s.overloaded(p))
		overloadedHolder = overloadedHolder || (c > 0 && s.overloaded(p))
	}
	s.memory.mu.RUnlock()

	if !anyInfo && !anyHolder {
		fill(out, Neutral)
		return OutcomeNoLoRAInfo
	}

	outcome := OutcomeResident
	target := -1
	if !healthyHolder {
		target = s.placementTarget(adapter, pods, scratch)
		switch {
		case target < 0:
			outcome = OutcomeNoSlot
		case overloadedHolder:
			outcome = OutcomeSpill
		default:
			outcome = OutcomeColdPlacement
		}
	}

	for i := range pods {
		p := &pods[i]
		c := scratch[i].confidence
		switch {
		case i == target:
			out[i] = placementTarget
		case c > 0 && !s.overloaded(p):
			out[i] = 0.5 + 0.5*c
		case c > 0:
			out[i] = overloadedHolderMax * c
		case canLoad(p, scratch[i].slotsFull):
			if healthyHolder {
				out[i] = idleSlot
			} else {
				w := rendezvousWeight(adapter, p.Name)
				out[i] = spareSlotBase + spareSlotSpan*(float64(w)/(1<<64))
			}
		case p.MaxLoRA > 0:
			out[i] = noSlot
		default:
			out[i] = Neutral
		}
	}
	return outcome
}

// confidenceLocked returns how sure Score is that adapter is, or is about to
// be, in the pod's GPU memory. The caller holds the Memory's read lock.
func (s *Scorer) confidenceLocked(p *PodState, adapter string, slotsFull bool, remembered map[string]*list.Element, now time.Time) float64 {
	if p.Running.Has(adapter) {
		return 1
	}
	if p.Waiting.Has(adapter) {
		if slotsFull {
			// Queued behind other adapters for a slot: committed, not loaded.
			return confirmedConfidence
		}
		return 1
	}
	if p.Resident != nil {
		if p.Resident.Has(adapter) {
			return 1
		}
		// The gauge reflects every send before its scrape.
		return s.memory.weightLocked(remembered, p.Name, now, p.ObservedAt)
	}
	if slotsFull {
		// Every slot holds another adapter in flight: adapter was evicted.
		return 0
	}
	return s.memory.weightLocked(remembered, p.Name, now, time.Time{})
}

// placementTarget picks, by bounded-load rendezvous hashing, the pod that
// should load adapter, or returns -1 when no pod can load it without waiting.
// Overloaded holders are not candidates: the point is to move load off them.
func (s *Scorer) placementTarget(adapter string, pods []PodState, scratch []podScratch) int {
	candidates, total := 0, 0
	for i := range pods {
		if s.isCandidate(&pods[i], scratch[i]) {
			candidates++
			total += pods[i].load()
		}
	}
	if candidates == 0 {
		return -1
	}
	capacity := boundedCapacity(total, candidates, s.cfg.LoadBound)
	best := -1
	var bestW uint64
	for i := range pods {
		p := &pods[i]
		if !s.isCandidate(p, scratch[i]) || p.load()+1 > capacity {
			continue
		}
		w := rendezvousWeight(adapter, p.Name)
		if best < 0 || preferred(w, p.Name, bestW, pods[best].Name) {
			best, bestW = i, w
		}
	}
	return best
}

func (s *Scorer) isCandidate(p *PodState, ps podScratch) bool {
	return canLoad(p, ps.slotsFull) && !(ps.confidence > 0 && s.overloaded(p))
}

func (s *Scorer) overloaded(p *PodState) bool { return p.QueueDepth > s.cfg.SpillQueueDepth }

// canLoad reports whether the pod has a slot the adapter can take without
// waiting for another adapter's requests to finish.
func canLoad(p *PodState, slotsFull bool) bool { return p.MaxLoRA > 0 && !slotsFull }

func (s *Scorer) getScratch(n int) *[]podScratch {
	sp, _ := s.scratch.Get().(*[]podScratch)
	if sp == nil || cap(*sp) < n {
		b := make([]podScratch, n)
		return &b
	}
	*sp = (*sp)[:n]
	return sp
}

func fill(out []float64, v float64) {
	for i := range out {
		out[i] = v
	}
}
