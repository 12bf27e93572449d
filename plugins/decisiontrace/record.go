package decisiontrace

import "time"

// Outcome is how a traced request left the EPP.
type Outcome string

const (
	// Routed: the EPP sent the request to Record.Endpoint.
	Routed Outcome = "routed"
	// Answered: the EPP answered the request itself (Record.Status): shed by admission, a scheduling failure, a bad
	// request.
	Answered Outcome = "answered"
	// Ended: the request ended before the EPP answered it, e.g. the client went away while it waited in a queue.
	Ended Outcome = "ended"
)

// Record is one request's decision, as the EPP made it.
type Record struct {
	RequestID string `json:"requestId"`
	// Received is when the proxy sent the request's headers; Decided when the EPP answered (or the request ended).
	Received time.Time `json:"received"`
	Decided  time.Time `json:"decided"`
	// Model is the model the request is served with (after any rewrite), Objective its InferenceObjective and
	// Priority the objective's priority, as admission or the scheduler saw them.
	Model     string `json:"model,omitempty"`
	Objective string `json:"objective,omitempty"`
	Priority  int    `json:"priority"`
	// Admission is Sluice admission's decision; nil under upstream's admission.
	Admission *Admission `json:"admission,omitempty"`
	// Profiles are the scheduling profiles that ran, in order.
	Profiles []Profile `json:"profiles,omitempty"`

	Outcome Outcome `json:"outcome"`
	// Endpoint is where a Routed request went (x-gateway-destination-endpoint).
	Endpoint string `json:"endpoint,omitempty"`
	// Status, ShedReason, RetryAfter and Error describe the EPP's own answer (Answered).
	Status     int    `json:"status,omitempty"`
	ShedReason string `json:"shedReason,omitempty"`
	RetryAfter string `json:"retryAfter,omitempty"`
	Error      string `json:"error,omitempty"`
}

// Admission is Sluice admission's decision for one request.
type Admission struct {
	Tenant string `json:"tenant,omitempty"`
	// Band is the priority band the request was served in, after the tenant's cap (Capped).
	Band   string `json:"band"`
	Capped bool   `json:"capped,omitempty"`
	// Outcome is Dispatched, Rejected, Unavailable or Cancelled; Reason why a request was not dispatched.
	Outcome string `json:"outcome"`
	Reason  string `json:"reason,omitempty"`
	// WaitSeconds is how long the request waited in its band's queue (0 when dispatched at once).
	WaitSeconds float64 `json:"waitSeconds"`
	// Burst: dispatched in the burst tier (no endpoint had headroom under the normal thresholds).
	Burst bool `json:"burst,omitempty"`
	// Headroom lists the endpoints that had headroom for the band at dispatch, which the headroom filter keeps.
	Headroom []string `json:"headroom,omitempty"`
	// RetryAfterSeconds is the Retry-After of a request that was not dispatched.
	RetryAfterSeconds int64 `json:"retryAfterSeconds,omitempty"`
	// Reserved is the endpoint of Headroom admission counted the request on until the scheduler's pick moved it.
	Reserved string `json:"reserved,omitempty"`
	// Counts are admission's counts of the endpoints in Headroom as the trace read them, just after the decision
	// (this request included on Reserved only, and any dispatched in between). A peer's endpoint, where a request
	// sent to a peer's idle seat goes, has none.
	Counts []EndpointCount `json:"counts,omitempty"`
}

// EndpointCount is admission's count of one endpoint's requests (flowcontrol.EndpointCount): its occupancy is
// InFlight plus the larger of Foreign and Peer, held to Capacity when admission judges seats strictly (under the
// Critical reserve, or for a tenant under its share) and to Known otherwise.
type EndpointCount struct {
	Endpoint string `json:"endpoint"`
	// InFlight counts this EPP's requests there, Foreign how many more its scrapes showed, Peer those other replicas
	// said they run there.
	InFlight int `json:"inFlight"`
	Foreign  int `json:"foreign,omitempty"`
	Peer     int `json:"peer,omitempty"`
	// Seats is how many requests the endpoint starts at once (0 while unknown); Capacity the most admission keeps
	// there when it judges seats strictly (0: no bound), one above tentative seats while it probes for more; Known
	// the stated or learned slot limit (0 while neither is).
	Seats    int `json:"seats"`
	Capacity int `json:"capacity,omitempty"`
	Known    int `json:"known,omitempty"`
	// Adopted: joined after a peer replica had been live, with no seat count learned here yet.
	Adopted bool `json:"adopted,omitempty"`
}

// Occupancy is how many requests admission counted the endpoint as holding: InFlight plus the larger of Foreign and
// Peer, since the peers' requests are among those the scrapes show as foreign (flowcontrol's rule).
func (c EndpointCount) Occupancy() int { return c.InFlight + max(c.Foreign, c.Peer) }

// Profile is one scheduling profile's run.
type Profile struct {
	Name string `json:"name"`
	// Candidates are the endpoints the profile started from.
	Candidates []string `json:"candidates"`
	// Filters are the profile's filters in the order they ran (the scheduler stops at one that removes every
	// candidate).
	Filters []Filter `json:"filters,omitempty"`
	// Scorers are the profile's scorers with their weights, in order.
	Scorers []Scorer `json:"scorers,omitempty"`
	// Endpoints are the candidates left after the filters, highest total first.
	Endpoints []EndpointScores `json:"endpoints,omitempty"`
	// Picked are the endpoints the picker chose, the first being where the request goes when this is the primary
	// profile.
	Picked []string `json:"picked,omitempty"`
	// Error is why the profile chose nothing.
	Error string `json:"error,omitempty"`
}

// Filter is one filter's effect.
type Filter struct {
	Plugin string `json:"plugin"`
	// Kept is how many candidates it let through; Removed names the others.
	Kept    int      `json:"kept"`
	Removed []string `json:"removed,omitempty"`
}

// Scorer is one scorer of a profile.
type Scorer struct {
	Plugin string  `json:"plugin"`
	Weight float64 `json:"weight"`
}

// EndpointScores is one candidate's scores.
type EndpointScores struct {
	Endpoint string `json:"endpoint"`
	// Scores holds each scorer's score by plugin name, as the scorer returned it; the scheduler clamps it to [0, 1]
	// before weighing it.
	Scores map[string]float64 `json:"scores,omitempty"`
	// Total is the weighted sum the picker chose by.
	Total float64 `json:"total"`
}
