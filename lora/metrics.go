package lora

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Outcome names the rule that decided a Score call. The set is closed, so it
// is safe as a metric label.
type Outcome string

const (
	// OutcomeBaseModel: the request targets the base model; all pods Neutral.
	OutcomeBaseModel Outcome = "base_model"
	// OutcomeNoLoRAInfo: no pod reports adapter state and the Memory knows
	// nothing; all pods Neutral.
	OutcomeNoLoRAInfo Outcome = "no_lora_info"
	// OutcomeResident: a healthy pod holds the adapter and is preferred.
	OutcomeResident Outcome = "resident"
	// OutcomeSpill: every holder is overloaded; another pod is chosen to load it.
	OutcomeSpill Outcome = "spill"
	// OutcomeColdPlacement: no pod holds the adapter; one is chosen to load it.
	OutcomeColdPlacement Outcome = "cold_placement"
	// OutcomeNoSlot: a placement is needed but no pod has a free slot.
	OutcomeNoSlot Outcome = "no_slot"
)

// Outcomes lists every Outcome, for pre-initialising metric series.
var Outcomes = []Outcome{OutcomeBaseModel, OutcomeNoLoRAInfo, OutcomeResident, OutcomeSpill, OutcomeColdPlacement, OutcomeNoSlot}

// EvictionReason names why the Memory forgot a send.
type EvictionReason string

const (
	// EvictionCapacity: the Memory was full; the oldest send was dropped.
	EvictionCapacity EvictionReason = "capacity"
	// EvictionExpired: the send was older than the TTL.
	EvictionExpired EvictionReason = "expired"
)

// Recorder receives the package's observations. Implementations must be safe
// for concurrent use; RecordMemoryEviction is called with the Memory's lock
// held, so it must not call back into the Memory.
type Recorder interface {
	RecordScore(Outcome)
	RecordMemoryEviction(EvictionReason)
}

// noRecorder is the default Recorder: it records nothing.
type noRecorder struct{}

func (noRecorder) RecordScore(Outcome)                 {}
func (noRecorder) RecordMemoryEviction(EvictionReason) {}

// PrometheusRecorder counts outcomes and evictions.
type PrometheusRecorder struct {
	outcomes  *prometheus.CounterVec
	evictions *prometheus.CounterVec
	// Children are resolved once so that recording is one map lookup and an
	// atomic add, not a label hash per call.
	byOutcome map[Outcome]prometheus.Counter
	byReason  map[EvictionReason]prometheus.Counter
}

var _ Recorder = (*PrometheusRecorder)(nil)

// NewPrometheusRecorder registers the package's metrics on reg (cmd/ passes a
// non-default registry) and returns the Recorder that updates them.
func NewPrometheusRecorder(reg prometheus.Registerer) (*PrometheusRecorder, error) {
	r := &PrometheusRecorder{
		outcomes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "sluice",
			Subsystem: "lora",
			Name:      "score_outcomes_total",
			Help:      "LoRA affinity scoring calls, by the rule that decided them.",
		}, []string{"outcome"}),
		evictions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "sluice",
			Subsystem: "lora",
			Name:      "memory_evictions_total",
			Help:      "(adapter, pod) sends forgotten by the LoRA affinity memory, by reason.",
		}, []string{"reason"}),
	}
	for _, c := range []prometheus.Collector{r.outcomes, r.evictions} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	r.byOutcome = make(map[Outcome]prometheus.Counter, len(Outcomes))
	for _, o := range Outcomes {
		r.byOutcome[o] = r.outcomes.WithLabelValues(string(o))
	}
	r.byReason = map[EvictionReason]prometheus.Counter{}
	for _, e := range []EvictionReason{EvictionCapacity, EvictionExpired} {
		r.byReason[e] = r.evictions.WithLabelValues(string(e))
	}
	return r, nil
}

// RecordScore implements Recorder. Values outside the closed set are ignored.
func (r *PrometheusRecorder) RecordScore(o Outcome) {
	if c, ok := r.byOutcome[o]; ok {
		c.Inc()
	}
}

// RecordMemoryEviction implements Recorder. Values outside the closed set are
// ignored.
func (r *PrometheusRecorder) RecordMemoryEviction(e EvictionReason) {
	if c, ok := r.byReason[e]; ok {
		c.Inc()
	}
}
