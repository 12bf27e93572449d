package flowcontrol

import (
	"errors"
	"fmt"
	"time"
)

// Outcome is the final state of one request. Every request given to Controller.Admit ends in exactly one Outcome.
// Outcomes are a closed, low-cardinality set, fit for metric labels; the edge (plugins/ and the gRPC layer) maps them to
// wire codes: Dispatched proceeds to scheduling, Rejected is HTTP 429 (400 for ReasonInvalidRequest, 403 for
// ReasonBandNotAllowed), Unavailable is HTTP 503, and Cancelled gets no answer because the client is gone.
type Outcome uint8

const (
	_ Outcome = iota // zero: never returned, so an unset Outcome is detectably invalid.

	// Dispatched: the request may proceed to the scheduler now.
	Dispatched
	// Rejected: the request was shed (429 with Retry-After), was invalid (400) or asked for a band its tenant may not
	// use (403); Reason says which.
	Rejected
	// Unavailable: no endpoint can serve it, or the controller is shutting down (503 with Retry-After).
	Unavailable
	// Cancelled: the caller's context ended before a decision.
	Cancelled
)

// String returns the outcome's metric label value.
func (o Outcome) String() string {
	switch o {
	case Dispatched:
		return "dispatched"
	case Rejected:
		return "rejected"
	case Unavailable:
		return "unavailable"
	case Cancelled:
		return "cancelled"
	default:
		return fmt.Sprintf("Outcome(%d)", uint8(o))
	}
}

// Reason says why a request was not dispatched. It is a closed enum: its String value is the x-sluice-shed-reason
// header value and a metric label.
type Reason uint8

const (
	// ReasonNone is the reason of a dispatched request.
	ReasonNone Reason = iota
	// ReasonSaturated: the band rejects when saturated (by default Sheddable, the holdback band) and no endpoint was
	// below the band's saturation ceiling.
	ReasonSaturated
	// ReasonQueueFull: the band's or the controller's queue capacity (requests or bytes) was reached.
	ReasonQueueFull
	// ReasonDisplaced: the request was queued, then evicted to make room for a higher band's arrival.
	ReasonDisplaced
	// ReasonPredictedWait: the estimated wait exceeded the band's maximum queue time (its over-share queue time for a
	// tenant over its share), so it was rejected at once, or answered while waiting once predicted to start too late.
	ReasonPredictedWait
	// ReasonQueueTimeout: the request waited for the band's maximum queue time without being dispatched.
	ReasonQueueTimeout
	// ReasonNoEndpoints: the pool had no endpoint with fresh metrics (Outcome Unavailable).
	ReasonNoEndpoints
	// ReasonShuttingDown: the controller is shutting down (Outcome Unavailable).
	ReasonShuttingDown
	// ReasonCancelled: the caller's context ended while the request waited (Outcome Cancelled).
	ReasonCancelled
	// ReasonInvalidRequest: the request was malformed, e.g. an empty or duplicate ID (Outcome Rejected, HTTP 400).
	ReasonInvalidRequest
	// ReasonBandNotAllowed: the request's priority maps above its tenant's maxBand and the policy rejects such
	// requests rather than lowering them (Config.AboveMaxBand CapReject; Outcome Rejected, HTTP 403, no Retry-After).
	ReasonBandNotAllowed
	// ReasonEarlyReturn: the request came back more than a second before the moment an earlier 429's Retry-After
	// named for it and would have waited, so it was told the rest of that wait (a band that queues, below Critical, at
	// a controller that is not one of several replicas).
	ReasonEarlyReturn
)

var reasonNames = [...]string{
	ReasonNone:           "",
	ReasonSaturated:      "saturated",
	ReasonQueueFull:      "queue_full",
	ReasonDisplaced:      "displaced",
	ReasonPredictedWait:  "predicted_wait",
	ReasonQueueTimeout:   "queue_timeout",
	ReasonNoEndpoints:    "no_endpoints",
	ReasonShuttingDown:   "shutting_down",
	ReasonCancelled:      "cancelled",
	ReasonInvalidRequest: "invalid_request",
	ReasonBandNotAllowed: "band_not_allowed",
	ReasonEarlyReturn:    "early_return",
}

// String returns the reason's header and label value ("" for ReasonNone).
func (r Reason) String() string {
	if int(r) < len(reasonNames) {
		return reasonNames[r]
	}
	return fmt.Sprintf("Reason(%d)", uint8(r))
}

// Decision is the answer to one Admit call.
type Decision struct {
	Outcome Outcome
	// Reason is ReasonNone for Dispatched, otherwise why the request was not dispatched.
	Reason Reason
	// Band is the band the request was served in, after priority mapping and the tenant's cap; for
	// ReasonBandNotAllowed, the band its priority maps to, which its tenant may not use.
	Band Band
	// Capped is true when the tenant's cap lowered the request's band.
	Capped bool
	// Endpoints lists, for a Dispatched request, the endpoints that had headroom for its band at dispatch time, in
	// snapshot order. The scheduler should be restricted to them.
	Endpoints []string
	// Reserved is, for a Dispatched request, the endpoint of Endpoints admission counts it on until Bind moves it to
	// the one the scheduler picked; empty when it holds nothing here (sent to a peer's endpoint: DispatchedElsewhere,
	// DispatchWaitingElsewhere, DispatchSpareElsewhere).
	Reserved string
	// RetryAfter is set for Rejected (except ReasonInvalidRequest and ReasonBandNotAllowed, which a retry cannot
	// change) and Unavailable: a whole number of seconds, at least 1.
	RetryAfter time.Duration
	// Waited is how long the request waited in the queue (0 on the fast path).
	Waited time.Duration
	// Burst is true for a request dispatched in the burst tier: no endpoint had headroom for its band under the
	// normal thresholds (see APIEndpointThresholds).
	Burst bool
}

// RetryAfterSeconds returns RetryAfter as RFC 9110 delay-seconds (RetryAfter is already whole seconds).
func (d Decision) RetryAfterSeconds() int64 { return int64(d.RetryAfter / time.Second) }

// Sentinel errors, one per class of non-dispatched outcome. Errors returned by Admit wrap exactly one of them; use
// errors.Is.
var (
	// ErrRejected: the request was shed (HTTP 429).
	ErrRejected = errors.New("request rejected by flow control")
	// ErrInvalidRequest: the request was malformed (HTTP 400). It also matches ErrRejected.
	ErrInvalidRequest = errors.New("invalid flow control request")
	// ErrBandNotAllowed: the request asked for a band its tenant may not use (HTTP 403). It also matches ErrRejected;
	// the cause is a *BandNotAllowedError.
	ErrBandNotAllowed = errors.New("band not allowed for the tenant")
	// ErrUnavailable: no endpoint can take the request, or the controller is shutting down (HTTP 503).
	ErrUnavailable = errors.New("no capacity available")
	// ErrCancelled: the caller's context ended first. The error also wraps the context's error.
	ErrCancelled = errors.New("request cancelled while waiting for admission")
)

// Error is the error Admit returns for every outcome but Dispatched. It carries the decision fields the edge needs
// for its answer (status from Outcome, x-sluice-shed-reason from Reason, Retry-After from RetryAfter).
type Error struct {
	Outcome    Outcome
	Reason     Reason
	Band       Band
	RetryAfter time.Duration
	// Err is the underlying cause, if any (the context's error for Cancelled, a description for invalid requests, a
	// *BandNotAllowedError for ReasonBandNotAllowed).
	Err error
}

func newError(d Decision, cause error) *Error {
	return &Error{Outcome: d.Outcome, Reason: d.Reason, Band: d.Band, RetryAfter: d.RetryAfter, Err: cause}
}

// Error implements error.
func (e *Error) Error() string {
	msg := fmt.Sprintf("flow control: %s (%s) in band %s", e.Outcome, e.Reason, e.Band)
	if e.RetryAfter > 0 {
		msg += fmt.Sprintf(", retry after %ds", int64(e.RetryAfter/time.Second))
	}
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

// Is matches the sentinel of the error's class.
func (e *Error) Is(target error) bool {
	switch target {
	case ErrRejected:
		return e.Outcome == Rejected
	case ErrInvalidRequest:
		return e.Reason == ReasonInvalidRequest
	case ErrBandNotAllowed:
		return e.Reason == ReasonBandNotAllowed
	case ErrUnavailable:
		return e.Outcome == Unavailable
	case ErrCancelled:
		return e.Outcome == Cancelled
	}
	return false
}

// Unwrap returns the underlying cause.
func (e *Error) Unwrap() error { return e.Err }

// BandNotAllowedError is the cause of a ReasonBandNotAllowed rejection: which tenant asked for which band, and the
// highest band it may use.
type BandNotAllowedError struct {
	Tenant  string
	Band    Band
	MaxBand Band
}

// Error implements error.
func (e *BandNotAllowedError) Error() string {
	return fmt.Sprintf("tenant %q may not use the %s band; its highest band is %s", e.Tenant, e.Band, e.MaxBand)
}
