package flowcontrol

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// APIConfig is the external, JSON-serialisable policy schema. Unset (nil) fields take defaults. The FlowControlPolicy
// CRD spec mirrors it field for field; its JSON names are camelCase and stable.
type APIConfig struct {
	// Bands configures each band; unset bands take defaults.
	Bands *APIBands `json:"bands,omitempty"`
	// MaxQueuedRequests caps the requests waiting in the EPP across all bands. A band allowed to displace evicts the
	// newest requests of lower bands rather than be refused at this limit. Default 10000.
	MaxQueuedRequests *int64 `json:"maxQueuedRequests,omitempty"`
	// MaxQueuedBytes caps the request bytes waiting in the EPP across all bands. Default 1 GiB.
	MaxQueuedBytes *int64 `json:"maxQueuedBytes,omitempty"`
	// PriorityMapping maps an InferenceObjective priority to a band.
	PriorityMapping *APIPriorityMapping `json:"priorityMapping,omitempty"`
	// Endpoint holds the per-endpoint saturation thresholds that define headroom.
	Endpoint *APIEndpointThresholds `json:"endpoint,omitempty"`
	// Tenants sets per-tenant (fairness ID) weights and band caps. Tenants not listed use DefaultTenant.
	Tenants []APITenantPolicy `json:"tenants,omitempty"`
	// DefaultTenant applies to tenants not listed in Tenants. Its name must be empty. Default weight 1, no cap.
	DefaultTenant *APITenantPolicy `json:"defaultTenant,omitempty"`
	// RetryAfterJitter spreads Retry-After values by ±this fraction so shed clients do not return in lock-step.
	// In [0, 1). Default 0.2.
	RetryAfterJitter *float64 `json:"retryAfterJitter,omitempty"`
	// DrainRateWindow is the time constant of the moving average of the pool's drain rate, used to predict waits and
	// compute Retry-After. Default 10s.
	DrainRateWindow *metav1.Duration `json:"drainRateWindow,omitempty"`
	// TenantHeader names the request header whose value is the request's tenant (the name Tenants and DefaultTenant
	// apply to); a request without it is tenant "default-flow". Default "x-gateway-inference-fairness-id", which a
	// client may send itself, so by default every caller chooses its own tenant. Name a header the gateway sets after
	// authenticating the caller, replacing any value the client sent, to bind tenants (weights, band caps) to
	// authenticated identities. Case-insensitive.
	TenantHeader *string `json:"tenantHeader,omitempty"`
	// AboveMaxBand decides a request whose priority maps above its tenant's maxBand: "Lower" (default) serves it in
	// the tenant's maxBand; "Reject" refuses it (reason "band_not_allowed", HTTP 403).
	AboveMaxBand *string `json:"aboveMaxBand,omitempty"`
}

// APIBands configures the three bands.
type APIBands struct {
	Critical  *APIBandConfig `json:"critical,omitempty"`
	Standard  *APIBandConfig `json:"standard,omitempty"`
	Sheddable *APIBandConfig `json:"sheddable,omitempty"`
}

// APIBandConfig configures one band.
type APIBandConfig struct {
	// MaxQueuedRequests caps the band's waiting requests. Default 10000.
	MaxQueuedRequests *int64 `json:"maxQueuedRequests,omitempty"`
	// MaxQueuedBytes caps the band's waiting request bytes. Default 1 GiB.
	MaxQueuedBytes *int64 `json:"maxQueuedBytes,omitempty"`
	// MaxQueueTime bounds how long a request may wait; a request predicted to wait longer is rejected at once. In a
	// band that rejects when saturated only a client's return after its Retry-After waits, so it bounds that wait.
	// Defaults: Critical 30s, Standard 15s, Sheddable 15s.
	MaxQueueTime *metav1.Duration `json:"maxQueueTime,omitempty"`
	// OverShareMaxQueueTime is MaxQueueTime for a tenant that is over its fair share while another tenant of the band
	// waits or is under its share: a request of it predicted to wait longer, at the drain fair queuing leaves it, is
	// rejected at once (429 with Retry-After), so a heavy tenant's excess is answered rather than held, and a waiting
	// request of it predicted to start later is answered then; that includes a promised return (RejectWhenSaturated).
	// A value above MaxQueueTime is MaxQueueTime. Defaults: Critical 10s, Standard 5s, Sheddable 5s (a third of each
	// band's default MaxQueueTime; they do not follow a MaxQueueTime that is set).
	OverShareMaxQueueTime *metav1.Duration `json:"overShareMaxQueueTime,omitempty"`
	// SaturationCeiling is the endpoint saturation (1.0 = at the endpoint thresholds) below which an endpoint has
	// headroom for this band. Ceilings must not increase from Critical to Sheddable.
	// Defaults: Critical 1.0, Standard 0.8, Sheddable 0.6 (the holdback). With the default endpoint thresholds
	// (queue depth 2, KV 0.8) every band may dispatch to an endpoint with at most one request waiting, but Standard
	// only below 64% KV use and Sheddable below 48%: lower bands leave each endpoint's last KV headroom to Critical, so
	// under overload a Critical request finds a batch it can join (testbed/bench/scenarios/priority-overload measures it).
	SaturationCeiling *float64 `json:"saturationCeiling,omitempty"`
	// RejectWhenSaturated rejects an arrival at once (reason "saturated") when no endpoint is below the ceiling,
	// instead of queueing it; only a request that comes back as its Retry-After told it waits (up to MaxQueueTime).
	// Defaults: true for Sheddable, false otherwise.
	RejectWhenSaturated *bool `json:"rejectWhenSaturated,omitempty"`
	// RetryAfterMin and RetryAfterMax bound the computed Retry-After. Min is at least 1s.
	// Defaults: min 1s; max Critical 15s, Standard 30s, Sheddable 60s.
	RetryAfterMin *metav1.Duration `json:"retryAfterMin,omitempty"`
	RetryAfterMax *metav1.Duration `json:"retryAfterMax,omitempty"`
	// MayDisplace lets an arrival that finds the EPP full evict the newest queued request of the lowest non-empty
	// lower band. Defaults: true for Critical and Standard.
	MayDisplace *bool `json:"mayDisplace,omitempty"`
}

// APIPriorityMapping maps InferenceObjective priorities to bands: priority >= criticalMinPriority is Critical,
// priority <= sheddableMaxPriority is Sheddable, anything between (including unset, 0) is Standard.
type APIPriorityMapping struct {
	// Default 1.
	CriticalMinPriority *int `json:"criticalMinPriority,omitempty"`
	// Default -1.
	SheddableMaxPriority *int `json:"sheddableMaxPriority,omitempty"`
}

// APIEndpointThresholds defines an endpoint's saturation: the largest of (waiting queue + requests the EPP dispatched
// to it since its last scrape) / queueDepthThreshold, kvCacheUsage / kvCacheUtilThreshold, when set,
// running / runningThreshold, and the learned time of its pending prompts over pendingTimeThreshold. An endpoint whose
// metrics are older than metricsStalenessThreshold has no headroom.
//
// Pending prompts are the streamed requests sent to an endpoint that have not had their first response chunk (they
// wait there or are in prefill). Each lengthens the endpoint's next steps, and a prompt sent there shares them, so the
// endpoint is saturated once they amount to pendingTimeThreshold of its learned first-chunk time (what one prompt took
// there, dispatch to first chunk, over the last few streamed requests, divided among the prompts this EPP had pending
// there ahead of it; until it has answered one, one pending prompt saturates it). A time rather than a count fits each
// endpoint: a slow one (an older GPU, where one prompt takes longer than the threshold) takes one new prompt at a
// time, a fast one several. Work the EPP does not see (other replicas' requests, non-streamed ones) lengthens the
// learned time, which makes the bound stricter, not looser.
//
// The burst tier: when no fresh endpoint has headroom for a band that queues when saturated (rejectWhenSaturated
// bands, Sheddable by default, never use it) and no Critical traffic is active, the band may still dispatch to
// endpoints judged by burstQueueDepthThreshold and burstPendingTimeThreshold in place of queueDepthThreshold and
// pendingTimeThreshold (each at least its normal counterpart). In a burst above the pool's capacity, a server that computes several
// prompts per step drains the backlog faster than one fed a prompt or two at a time; below capacity the normal
// thresholds keep prompts apart, so none shares a step it need not. burstQueueDepthThreshold 0 disables the tier.
//
// The Critical reserve: while Critical traffic is active (a Critical request arrived within the last drainRateWindow),
// the burst tier is off for every band, only Critical may exceed headroom for prefix affinity, and, if
// pendingThreshold is set, an endpoint is also saturated once that many prompts are pending there. With no request
// sent in the burst tier, endpoints drain to their normal thresholds and Critical, first in line, takes the next
// normal place rather than a step shared with a full batch. (Another EPP replica that sees no Critical traffic still
// uses the burst tier; this reserve only governs what this replica dispatches.) A count cap (1 or 2) protects
// Critical a little more than the time and costs lower bands much of their throughput while Critical requests arrive.
type APIEndpointThresholds struct {
	// Default 2.
	QueueDepthThreshold *int `json:"queueDepthThreshold,omitempty"`
	// 0 disables the count. Default 0.
	PendingThreshold *int `json:"pendingThreshold,omitempty"`
	// 0 disables the time. Default 100ms.
	PendingTimeThreshold *metav1.Duration `json:"pendingTimeThreshold,omitempty"`
	// 0 disables the burst tier; a value below queueDepthThreshold acts as queueDepthThreshold. Default 16.
	BurstQueueDepthThreshold *int `json:"burstQueueDepthThreshold,omitempty"`
	// 0 disables the time in the burst tier, as does pendingTimeThreshold 0; a value below pendingTimeThreshold acts as
	// pendingTimeThreshold. Default 400ms.
	BurstPendingTimeThreshold *metav1.Duration `json:"burstPendingTimeThreshold,omitempty"`
	// In (0, 1]. Default 0.8.
	KVCacheUtilThreshold *float64 `json:"kvCacheUtilThreshold,omitempty"`
	// 0 disables the running-requests term. Default 0.
	RunningThreshold *int `json:"runningThreshold,omitempty"`
	// Default 200ms.
	MetricsStalenessThreshold *metav1.Duration `json:"metricsStalenessThreshold,omitempty"`
	// Concurrency is how many requests each endpoint runs at once (vLLM's --max-num-seqs), when every endpoint of the
	// pool runs the same number. 0 learns it per endpoint from its metrics. Either way an endpoint's KV cache may
	// hold fewer, which its metrics show, and the smaller applies. Default 0.
	Concurrency *int `json:"concurrency,omitempty"`
}

// APITenantPolicy is one tenant's policy.
type APITenantPolicy struct {
	// Name is the fairness ID.
	Name string `json:"name,omitempty"`
	// Weight is the tenant's share of its band relative to other tenants. Default 1.
	Weight *float64 `json:"weight,omitempty"`
	// MaxBand is the highest band the tenant may use ("Critical", "Standard", "Sheddable"); requests above it are
	// served in it. Default "Critical" (no cap).
	MaxBand *string `json:"maxBand,omitempty"`
}
