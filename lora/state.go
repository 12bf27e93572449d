package lora

import "time"

// Adapters is a set of adapter names. Only the keys matter; the int value is
// whatever the producer stored (upstream's metrics extractor stores 0). The map
// type matches what metrics extractors produce, so callers convert their maps
// with Adapters(m) without copying.
type Adapters map[string]int

// NewAdapters returns the set holding names.
func NewAdapters(names ...string) Adapters {
	s := make(Adapters, len(names))
	for _, n := range names {
		s[n] = 0
	}
	return s
}

// Has reports whether name is in the set. A nil set holds nothing.
func (a Adapters) Has(name string) bool {
	_, ok := a[name]
	return ok
}

// Request is what a request asks of a pod's adapter slots.
type Request struct {
	// Adapter is the LoRA adapter the request targets after any model rewrite.
	// The empty string means the base model.
	Adapter string
}

// PodState is one pod's adapter state as last observed, in plain values.
type PodState struct {
	// Name identifies the pod; it feeds the rendezvous hash and the Memory, so
	// it must be the same on every EPP replica (e.g. the pod name).
	Name string
	// MaxLoRA is the number of adapter slots in GPU memory; 0 means unknown.
	MaxLoRA int
	// Resident holds the adapters the server reports resident in GPU memory.
	// nil means the server exports no residency metric; a non-nil empty set
	// means it reports none resident.
	Resident Adapters
	// Running and Waiting hold the adapters with requests running or waiting
	// on the pod (vLLM's lora_requests_info). nil means none or unknown.
	Running, Waiting Adapters
	// ObservedAt is when Resident was scraped. When Resident is non-nil, sends
	// remembered from before ObservedAt are already reflected in it. Zero means
	// unknown: every remembered send counts.
	ObservedAt time.Time
	// QueueDepth is the number of requests waiting on the pod.
	QueueDepth int
	// RunningRequests is the number of requests running on the pod.
	RunningRequests int
}

// load is the pod's outstanding work, used to bound placement.
func (p *PodState) load() int { return p.QueueDepth + p.RunningRequests }

// hasInfo reports whether the pod reports any adapter information at all.
func (p *PodState) hasInfo() bool {
	return p.MaxLoRA > 0 || p.Resident != nil || len(p.Running) > 0 || len(p.Waiting) > 0
}

// slotsFull reports whether every adapter slot of the pod is held by other
// adapters with requests in flight, so that adapter could only be loaded after
// one of them finishes. It is false when MaxLoRA is unknown.
func (p *PodState) slotsFull(adapter string) bool {
	if p.MaxLoRA <= 0 {
		return false
	}
	// Bounds first: counting distinct names iterates a map.
	if len(p.Running)+len(p.Waiting) < p.MaxLoRA {
		return false
	}
	busy := len(p.Running)
	if p.Running.Has(adapter) {
		busy--
	}
	for name := range p.Waiting {
		if busy >= p.MaxLoRA {
			break
		}
		if name != adapter && !p.Running.Has(name) {
			busy++
		}
	}
	return busy >= p.MaxLoRA
}
