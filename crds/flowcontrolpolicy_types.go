package crds

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Status condition of a FlowControlPolicy, and its reasons.
const (
	// ConditionAccepted is True when the policy is the one in force for its pool, and False with one of the
	// reasons below otherwise.
	ConditionAccepted = "Accepted"

	// ReasonAccepted: the policy is valid and applied to its pool.
	ReasonAccepted = "Accepted"
	// ReasonInvalidSpec: the spec does not convert to a flow control configuration; the message says why.
	ReasonInvalidSpec = "InvalidSpec"
	// ReasonPoolNotFound: the referenced InferencePool does not exist.
	ReasonPoolNotFound = "PoolNotFound"
	// ReasonConflicted: another valid policy for the same pool is older and therefore wins.
	ReasonConflicted = "Conflicted"
)

// FlowControlPolicy configures priority-aware admission for one InferencePool: how InferenceObjective priorities
// map to the Critical, Standard and Sheddable bands, how much each band may queue in the EPP and for how long, when
// it sheds with 429 and which Retry-After it computes, per-tenant weights and band caps, and which request header
// names the tenant (by default one the client sends; see tenantHeader). At most one policy is
// in force per pool (the oldest valid one); without one the EPP uses the defaults shown by an empty spec.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=fcp,categories=sluice
// +kubebuilder:printcolumn:name="Pool",type=string,JSONPath=`.spec.poolRef.name`
// +kubebuilder:printcolumn:name="Accepted",type=string,JSONPath=`.status.conditions[?(@.type=="Accepted")].status`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Accepted")].reason`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type FlowControlPolicy struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec FlowControlPolicySpec `json:"spec"`
	// +optional
	Status FlowControlPolicyStatus `json:"status,omitempty"`
}

// FlowControlPolicyList is a list of FlowControlPolicy.
//
// +kubebuilder:object:root=true
type FlowControlPolicyList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []FlowControlPolicy `json:"items"`
}

// FlowControlPolicySpec is the desired admission policy. Apart from poolRef it mirrors flowcontrol.APIConfig field
// for field; every other field is optional and defaulted by the API server.
type FlowControlPolicySpec struct {
	// PoolRef is the InferencePool, in the policy's namespace, that this policy configures.
	// +required
	PoolRef PoolReference `json:"poolRef"`

	// Bands configures each priority band.
	// +optional
	// +kubebuilder:default={}
	Bands *Bands `json:"bands,omitempty"`

	// MaxQueuedRequests caps the requests waiting in the EPP across all bands. A band allowed to displace evicts the
	// newest requests of lower bands rather than be refused at this limit.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:default=10000
	MaxQueuedRequests *int64 `json:"maxQueuedRequests,omitempty"`

	// MaxQueuedBytes caps the request body bytes waiting in the EPP across all bands. Default 1 GiB.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:default=1073741824
	MaxQueuedBytes *int64 `json:"maxQueuedBytes,omitempty"`

	// PriorityMapping maps an InferenceObjective priority to a band.
	// +optional
	// +kubebuilder:default={}
	PriorityMapping *PriorityMapping `json:"priorityMapping,omitempty"`

	// Endpoint holds the per-endpoint saturation thresholds that define headroom.
	// +optional
	// +kubebuilder:default={}
	Endpoint *EndpointThresholds `json:"endpoint,omitempty"`

	// Tenants sets per-tenant (fairness ID) weights and band caps. Tenants not listed use defaultTenant.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=256
	Tenants []TenantPolicy `json:"tenants,omitempty"`

	// DefaultTenant applies to every tenant not listed in tenants.
	// +optional
	// +kubebuilder:default={}
	DefaultTenant *DefaultTenantPolicy `json:"defaultTenant,omitempty"`

	// RetryAfterJitter spreads Retry-After values by plus or minus this fraction so that shed clients do not return
	// in lock-step. In [0, 1).
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1
	// +kubebuilder:validation:ExclusiveMaximum=true
	// +kubebuilder:default=0.2
	RetryAfterJitter *float64 `json:"retryAfterJitter,omitempty"`

	// DrainRateWindow is the time constant of the moving average of the pool's drain rate, which predicts waits and
	// Retry-After. A Go duration, for example "10s".
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="duration(self) > duration('0s')",message="drainRateWindow must be positive"
	// +kubebuilder:default="10s"
	DrainRateWindow *metav1.Duration `json:"drainRateWindow,omitempty"`

	// TenantHeader names the request header whose value is the request's tenant, the name tenants and defaultTenant
	// apply to; a request without it is tenant "default-flow". The default, x-gateway-inference-fairness-id, is sent
	// by clients themselves: every caller then chooses its own tenant, hence its weight and band cap. To make caps
	// hold, name a header the gateway sets after authenticating the caller, replacing any value the client sent.
	// Case-insensitive.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=256
	// +kubebuilder:validation:Pattern="^[A-Za-z0-9!#$%&'*+.^_`|~-]+$"
	// +kubebuilder:default="x-gateway-inference-fairness-id"
	TenantHeader *string `json:"tenantHeader,omitempty"`

	// AboveMaxBand decides a request whose objective's priority maps above its tenant's maxBand: Lower serves it in
	// the tenant's maxBand; Reject answers it 403 with an OpenAI-style error (x-sluice-shed-reason: band_not_allowed).
	// +optional
	// +kubebuilder:validation:Enum=Lower;Reject
	// +kubebuilder:default=Lower
	AboveMaxBand *string `json:"aboveMaxBand,omitempty"`
}

// PoolReference names an InferencePool in the policy's namespace.
type PoolReference struct {
	// Group is the InferencePool's API group.
	// +optional
	// +kubebuilder:validation:Enum=inference.networking.k8s.io;inference.networking.x-k8s.io
	// +kubebuilder:default="inference.networking.k8s.io"
	Group string `json:"group,omitempty"`

	// Kind is the referenced kind; only InferencePool is supported.
	// +optional
	// +kubebuilder:validation:Enum=InferencePool
	// +kubebuilder:default=InferencePool
	Kind string `json:"kind,omitempty"`

	// Name is the InferencePool's name.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
}

// Bands configures the three priority bands. Saturation ceilings must not increase from Critical to Sheddable:
// a lower band must never get headroom that a higher band lacks.
//
// +kubebuilder:validation:XValidation:rule="!has(self.critical) || !has(self.standard) || !has(self.critical.saturationCeiling) || !has(self.standard.saturationCeiling) || self.standard.saturationCeiling <= self.critical.saturationCeiling",message="inverted ceilings: standard.saturationCeiling must not exceed critical.saturationCeiling"
// +kubebuilder:validation:XValidation:rule="!has(self.standard) || !has(self.sheddable) || !has(self.standard.saturationCeiling) || !has(self.sheddable.saturationCeiling) || self.sheddable.saturationCeiling <= self.standard.saturationCeiling",message="inverted ceilings: sheddable.saturationCeiling must not exceed standard.saturationCeiling"
type Bands struct {
	// +optional
	// +kubebuilder:default={}
	Critical *CriticalBand `json:"critical,omitempty"`
	// +optional
	// +kubebuilder:default={}
	Standard *StandardBand `json:"standard,omitempty"`
	// +optional
	// +kubebuilder:default={}
	Sheddable *SheddableBand `json:"sheddable,omitempty"`
}

// The three band types below have the fields of flowcontrol.APIBandConfig, in its order and with its types (Go
// converts between them), and differ only in their defaults. A field or rule changed in one must change in all three.

// CriticalBand configures the Critical band.
//
// +kubebuilder:validation:XValidation:rule="!has(self.retryAfterMin) || !has(self.retryAfterMax) || duration(self.retryAfterMin) <= duration(self.retryAfterMax)",message="retryAfterMin must not exceed retryAfterMax"
type CriticalBand struct {
	// MaxQueuedRequests caps the band's waiting requests.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:default=10000
	MaxQueuedRequests *int64 `json:"maxQueuedRequests,omitempty"`
	// MaxQueuedBytes caps the band's waiting request body bytes. Default 1 GiB.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:default=1073741824
	MaxQueuedBytes *int64 `json:"maxQueuedBytes,omitempty"`
	// MaxQueueTime bounds how long a request may wait; a request predicted to wait longer is rejected at once.
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="duration(self) > duration('0s')",message="maxQueueTime must be positive"
	// +kubebuilder:default="30s"
	MaxQueueTime *metav1.Duration `json:"maxQueueTime,omitempty"`
	// OverShareMaxQueueTime is maxQueueTime for a tenant over its fair share while another tenant of the band waits
	// or is under its share: a request of it predicted to wait longer is rejected at once (429 with Retry-After), so a
	// heavy tenant's excess is answered rather than held. A value above maxQueueTime is maxQueueTime. The default is a
	// third of the band's default maxQueueTime and does not follow a maxQueueTime that is set.
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="duration(self) > duration('0s')",message="overShareMaxQueueTime must be positive"
	// +kubebuilder:default="10s"
	OverShareMaxQueueTime *metav1.Duration `json:"overShareMaxQueueTime,omitempty"`
	// SaturationCeiling is the endpoint saturation (1.0 = at the endpoint thresholds) below which an endpoint has
	// headroom for this band. In (0, 1].
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:ExclusiveMinimum=true
	// +kubebuilder:validation:Maximum=1
	// +kubebuilder:default=1.0
	SaturationCeiling *float64 `json:"saturationCeiling,omitempty"`
	// RejectWhenSaturated rejects an arrival at once (429, reason "saturated") when no endpoint is below the
	// ceiling, instead of queueing it.
	// +optional
	// +kubebuilder:default=false
	RejectWhenSaturated *bool `json:"rejectWhenSaturated,omitempty"`
	// RetryAfterMin is the lower bound of the computed Retry-After; at least 1s.
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1s')",message="retryAfterMin must be at least 1s"
	// +kubebuilder:default="1s"
	RetryAfterMin *metav1.Duration `json:"retryAfterMin,omitempty"`
	// RetryAfterMax is the upper bound of the computed Retry-After; at least retryAfterMin.
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1s')",message="retryAfterMax must be at least 1s"
	// +kubebuilder:default="15s"
	RetryAfterMax *metav1.Duration `json:"retryAfterMax,omitempty"`
	// MayDisplace lets an arrival that finds the EPP full evict the newest queued request of the lowest non-empty
	// lower band.
	// +optional
	// +kubebuilder:default=true
	MayDisplace *bool `json:"mayDisplace,omitempty"`
}

// StandardBand configures the Standard band.
//
// +kubebuilder:validation:XValidation:rule="!has(self.retryAfterMin) || !has(self.retryAfterMax) || duration(self.retryAfterMin) <= duration(self.retryAfterMax)",message="retryAfterMin must not exceed retryAfterMax"
type StandardBand struct {
	// MaxQueuedRequests caps the band's waiting requests.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:default=10000
	MaxQueuedRequests *int64 `json:"maxQueuedRequests,omitempty"`
	// MaxQueuedBytes caps the band's waiting request body bytes. Default 1 GiB.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:default=1073741824
	MaxQueuedBytes *int64 `json:"maxQueuedBytes,omitempty"`
	// MaxQueueTime bounds how long a request may wait; a request predicted to wait longer is rejected at once.
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="duration(self) > duration('0s')",message="maxQueueTime must be positive"
	// +kubebuilder:default="15s"
	MaxQueueTime *metav1.Duration `json:"maxQueueTime,omitempty"`
	// OverShareMaxQueueTime is maxQueueTime for a tenant over its fair share while another tenant of the band waits
	// or is under its share: a request of it predicted to wait longer is rejected at once (429 with Retry-After), so a
	// heavy tenant's excess is answered rather than held. A value above maxQueueTime is maxQueueTime. The default is a
	// third of the band's default maxQueueTime and does not follow a maxQueueTime that is set.
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="duration(self) > duration('0s')",message="overShareMaxQueueTime must be positive"
	// +kubebuilder:default="5s"
	OverShareMaxQueueTime *metav1.Duration `json:"overShareMaxQueueTime,omitempty"`
	// SaturationCeiling is the endpoint saturation (1.0 = at the endpoint thresholds) below which an endpoint has
	// headroom for this band. In (0, 1]; at most critical's.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:ExclusiveMinimum=true
	// +kubebuilder:validation:Maximum=1
	// +kubebuilder:default=0.8
	SaturationCeiling *float64 `json:"saturationCeiling,omitempty"`
	// RejectWhenSaturated rejects an arrival at once (429, reason "saturated") when no endpoint is below the
	// ceiling, instead of queueing it.
	// +optional
	// +kubebuilder:default=false
	RejectWhenSaturated *bool `json:"rejectWhenSaturated,omitempty"`
	// RetryAfterMin is the lower bound of the computed Retry-After; at least 1s.
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1s')",message="retryAfterMin must be at least 1s"
	// +kubebuilder:default="1s"
	RetryAfterMin *metav1.Duration `json:"retryAfterMin,omitempty"`
	// RetryAfterMax is the upper bound of the computed Retry-After; at least retryAfterMin.
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1s')",message="retryAfterMax must be at least 1s"
	// +kubebuilder:default="30s"
	RetryAfterMax *metav1.Duration `json:"retryAfterMax,omitempty"`
	// MayDisplace lets an arrival that finds the EPP full evict the newest queued request of the lowest non-empty
	// lower band.
	// +optional
	// +kubebuilder:default=true
	MayDisplace *bool `json:"mayDisplace,omitempty"`
}

// SheddableBand configures the Sheddable band. Its defaults make it the holdback band: it only dispatches below 80%
// of the endpoint thresholds and is shed at once above.
//
// +kubebuilder:validation:XValidation:rule="!has(self.retryAfterMin) || !has(self.retryAfterMax) || duration(self.retryAfterMin) <= duration(self.retryAfterMax)",message="retryAfterMin must not exceed retryAfterMax"
type SheddableBand struct {
	// MaxQueuedRequests caps the band's waiting requests.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:default=10000
	MaxQueuedRequests *int64 `json:"maxQueuedRequests,omitempty"`
	// MaxQueuedBytes caps the band's waiting request body bytes. Default 1 GiB.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:default=1073741824
	MaxQueuedBytes *int64 `json:"maxQueuedBytes,omitempty"`
	// MaxQueueTime bounds how long a request may wait; a request predicted to wait longer is rejected at once. While
	// the band rejects when saturated, only a client coming back when its Retry-After told it waits, so this bounds
	// that wait.
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="duration(self) > duration('0s')",message="maxQueueTime must be positive"
	// +kubebuilder:default="15s"
	MaxQueueTime *metav1.Duration `json:"maxQueueTime,omitempty"`
	// OverShareMaxQueueTime is maxQueueTime for a tenant over its fair share while another tenant of the band waits
	// or is under its share: a request of it predicted to wait longer is rejected at once (429 with Retry-After), so a
	// heavy tenant's excess is answered rather than held. A value above maxQueueTime is maxQueueTime. The default is a
	// third of the band's default maxQueueTime and does not follow a maxQueueTime that is set.
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="duration(self) > duration('0s')",message="overShareMaxQueueTime must be positive"
	// +kubebuilder:default="5s"
	OverShareMaxQueueTime *metav1.Duration `json:"overShareMaxQueueTime,omitempty"`
	// SaturationCeiling is the endpoint saturation (1.0 = at the endpoint thresholds) below which an endpoint has
	// headroom for this band. In (0, 1]; at most standard's.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:ExclusiveMinimum=true
	// +kubebuilder:validation:Maximum=1
	// +kubebuilder:default=0.6
	SaturationCeiling *float64 `json:"saturationCeiling,omitempty"`
	// RejectWhenSaturated rejects an arrival at once (429, reason "saturated") when no endpoint is below the
	// ceiling, instead of queueing it.
	// +optional
	// +kubebuilder:default=true
	RejectWhenSaturated *bool `json:"rejectWhenSaturated,omitempty"`
	// RetryAfterMin is the lower bound of the computed Retry-After; at least 1s.
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1s')",message="retryAfterMin must be at least 1s"
	// +kubebuilder:default="1s"
	RetryAfterMin *metav1.Duration `json:"retryAfterMin,omitempty"`
	// RetryAfterMax is the upper bound of the computed Retry-After; at least retryAfterMin.
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1s')",message="retryAfterMax must be at least 1s"
	// +kubebuilder:default="60s"
	RetryAfterMax *metav1.Duration `json:"retryAfterMax,omitempty"`
	// MayDisplace lets an arrival that finds the EPP full evict the newest queued request of the lowest non-empty
	// lower band.
	// +optional
	// +kubebuilder:default=false
	MayDisplace *bool `json:"mayDisplace,omitempty"`
}

// PriorityMapping maps InferenceObjective priorities to bands: priority >= criticalMinPriority is Critical,
// priority <= sheddableMaxPriority is Sheddable, anything between (including unset, 0) is Standard.
//
// +kubebuilder:validation:XValidation:rule="!has(self.criticalMinPriority) || !has(self.sheddableMaxPriority) || self.sheddableMaxPriority < self.criticalMinPriority",message="sheddableMaxPriority must be below criticalMinPriority"
type PriorityMapping struct {
	// CriticalMinPriority is the lowest priority served in the Critical band.
	// +optional
	// +kubebuilder:default=1
	CriticalMinPriority *int `json:"criticalMinPriority,omitempty"`
	// SheddableMaxPriority is the highest priority served in the Sheddable band; below criticalMinPriority.
	// +optional
	// +kubebuilder:default=-1
	SheddableMaxPriority *int `json:"sheddableMaxPriority,omitempty"`
}

// EndpointThresholds define an endpoint's saturation: the largest of (waiting queue + requests the EPP dispatched
// to it since its last scrape) / queueDepthThreshold, kvCacheUsage / kvCacheUtilThreshold, when set,
// running / runningThreshold, and its pending prompts' learned time over pendingTimeThreshold. An endpoint whose
// metrics are older than metricsStalenessThreshold has no headroom. When no endpoint has headroom for a band that
// queues when saturated and no Critical traffic is active, the burst thresholds replace queueDepthThreshold and
// pendingTimeThreshold.
type EndpointThresholds struct {
	// QueueDepthThreshold is the queue length (waiting plus recently dispatched requests) at which an endpoint is
	// saturated. At least 1.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:default=2
	QueueDepthThreshold *int `json:"queueDepthThreshold,omitempty"`
	// PendingThreshold is the Critical reserve's optional count: while Critical traffic is active (a Critical request
	// arrived within the last drainRateWindow), an endpoint is also saturated once this many streamed requests sent to
	// it have not had their first response chunk. 1 (one new prompt per endpoint at a time) keeps Critical's time to
	// first token closest to an idle pool's but costs lower bands much of their throughput while Critical requests
	// arrive, more so where the proxy adds latency between the EPP and the servers. 0, the default, leaves the limit
	// to pendingTimeThreshold.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:default=0
	PendingThreshold *int `json:"pendingThreshold,omitempty"`
	// PendingTimeThreshold bounds the prompts waiting on an endpoint by time: an endpoint is saturated once the
	// streamed requests sent to it that have not had their first response chunk (they wait there or are in prefill)
	// amount to this much of its learned first-chunk time (the time one prompt takes there from dispatch to first
	// response chunk, learned from the streamed requests it answered; until it has answered one, one pending prompt
	// saturates it). A slow endpoint (an older GPU generation, a long prompt mix) takes one new prompt at a time, a
	// fast one several, so a prompt, Critical or not, never shares its first step with much work wherever it lands. A
	// Go duration; "0s" disables the time limit.
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$`
	// +kubebuilder:default="100ms"
	PendingTimeThreshold *metav1.Duration `json:"pendingTimeThreshold,omitempty"`
	// BurstQueueDepthThreshold is the queue depth of the burst tier: when no endpoint has headroom for a band that
	// queues when saturated (bands with rejectWhenSaturated, Sheddable by default, never use the tier) and no Critical
	// traffic is active, the band may dispatch to endpoints judged with this in place of queueDepthThreshold (and
	// burstPendingTimeThreshold in place of pendingTimeThreshold). In a burst above the pool's capacity, servers that
	// compute several prompts per step drain the backlog faster; below capacity the normal thresholds keep prompts
	// apart. 0 disables the burst tier; a value below queueDepthThreshold acts as queueDepthThreshold (the tier is
	// never stricter than the normal one).
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:default=16
	BurstQueueDepthThreshold *int `json:"burstQueueDepthThreshold,omitempty"`
	// BurstPendingTimeThreshold is pendingTimeThreshold in the burst tier: how much learned first-chunk time of
	// pending prompts an endpoint may hold in a burst. A Go duration; a value below pendingTimeThreshold acts as
	// pendingTimeThreshold; "0s" disables the time limit in the burst tier, as does pendingTimeThreshold "0s".
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$`
	// +kubebuilder:default="400ms"
	BurstPendingTimeThreshold *metav1.Duration `json:"burstPendingTimeThreshold,omitempty"`
	// KVCacheUtilThreshold is the KV-cache utilisation at which an endpoint is saturated. In (0, 1].
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:ExclusiveMinimum=true
	// +kubebuilder:validation:Maximum=1
	// +kubebuilder:default=0.8
	KVCacheUtilThreshold *float64 `json:"kvCacheUtilThreshold,omitempty"`
	// RunningThreshold is the number of running requests at which an endpoint is saturated; 0 disables this term.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:default=0
	RunningThreshold *int `json:"runningThreshold,omitempty"`
	// MetricsStalenessThreshold is the age beyond which an endpoint's metrics no longer prove headroom. A Go
	// duration, for example "200ms".
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="duration(self) > duration('0s')",message="metricsStalenessThreshold must be positive"
	// +kubebuilder:default="200ms"
	MetricsStalenessThreshold *metav1.Duration `json:"metricsStalenessThreshold,omitempty"`
	// Concurrency is how many requests each endpoint runs at once (vLLM's --max-num-seqs), for a pool whose
	// endpoints all run the same number. Admission fills an endpoint to its concurrency and no further, so requests
	// wait in the EPP, in priority and fair order, rather than inside the server. 0, the default, learns it per
	// endpoint from its metrics (the running count it plateaus at while requests wait there); an endpoint whose KV
	// cache holds fewer requests uses that smaller number either way.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:default=0
	Concurrency *int `json:"concurrency,omitempty"`
}

// TenantPolicy is one tenant's policy. Its fields are flowcontrol.APITenantPolicy's.
type TenantPolicy struct {
	// Name is the tenant's fairness ID.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
	// Weight is the tenant's share of its band relative to other tenants. In (0, 1e6].
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:ExclusiveMinimum=true
	// +kubebuilder:validation:Maximum=1000000
	// +kubebuilder:default=1
	Weight *float64 `json:"weight,omitempty"`
	// MaxBand is the highest band the tenant may use; its requests above it are served in it.
	// +optional
	// +kubebuilder:validation:Enum=Critical;Standard;Sheddable
	// +kubebuilder:default=Critical
	MaxBand *string `json:"maxBand,omitempty"`
}

// DefaultTenantPolicy is the policy of tenants not listed in tenants.
type DefaultTenantPolicy struct {
	// Weight is the tenant's share of its band relative to other tenants. In (0, 1e6].
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:ExclusiveMinimum=true
	// +kubebuilder:validation:Maximum=1000000
	// +kubebuilder:default=1
	Weight *float64 `json:"weight,omitempty"`
	// MaxBand is the highest band the tenant may use; its requests above it are served in it.
	// +optional
	// +kubebuilder:validation:Enum=Critical;Standard;Sheddable
	// +kubebuilder:default=Critical
	MaxBand *string `json:"maxBand,omitempty"`
}

// FlowControlPolicyStatus is written by the EPP serving the referenced pool.
type FlowControlPolicyStatus struct {
	// ObservedGeneration is the metadata.generation the conditions describe.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// Conditions: Accepted is True when the policy is in force, False with reason InvalidSpec, PoolNotFound or
	// Conflicted otherwise.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=8
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}
