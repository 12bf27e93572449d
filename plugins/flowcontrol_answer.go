package plugins

import (
	"errors"
	"fmt"
	"net/http"

	errcommon "sigs.k8s.io/gateway-api-inference-extension/pkg/common/error"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/metadata"

	"github.com/sluice-gw/sluice/flowcontrol"
)

// The answers admission gives a request it does not dispatch: upstream's error code, the HTTP status, the message.

// errorCode maps a decision that is not Dispatched to upstream's error code, hence the HTTP status.
func errorCode(d flowcontrol.Decision) string {
	switch {
	case d.Outcome == flowcontrol.Unavailable:
		return errcommon.ServiceUnavailable
	case d.Reason == flowcontrol.ReasonInvalidRequest:
		return errcommon.BadRequest
	case d.Reason == flowcontrol.ReasonBandNotAllowed:
		return errcommon.Forbidden
	default:
		return errcommon.ResourceExhausted
	}
}

// httpStatus is the status upstream answers for errorCode(d).
func httpStatus(d flowcontrol.Decision) int {
	switch errorCode(d) {
	case errcommon.ServiceUnavailable:
		return http.StatusServiceUnavailable
	case errcommon.BadRequest:
		return http.StatusBadRequest
	case errcommon.Forbidden:
		return http.StatusForbidden
	default:
		return http.StatusTooManyRequests
	}
}

// shedMessage is the client-facing explanation of a decision that is not Dispatched.
func shedMessage(d flowcontrol.Decision, err error) string {
	var why string
	switch d.Reason {
	case flowcontrol.ReasonSaturated:
		why = "every endpoint is above the " + d.Band.String() + " band's saturation ceiling"
	case flowcontrol.ReasonQueueFull:
		why = "the " + d.Band.String() + " queue is full"
	case flowcontrol.ReasonDisplaced:
		why = "the request was displaced from the " + d.Band.String() + " queue by higher-priority traffic"
	case flowcontrol.ReasonPredictedWait:
		why = "the predicted wait exceeds the " + d.Band.String() + " band's maximum queue time"
	case flowcontrol.ReasonEarlyReturn:
		why = "the request came back before the time an earlier answer's Retry-After named for it"
	case flowcontrol.ReasonQueueTimeout:
		why = "the request waited the " + d.Band.String() + " band's maximum queue time"
	case flowcontrol.ReasonNoEndpoints:
		why = "no model server endpoint has fresh metrics"
	case flowcontrol.ReasonShuttingDown:
		why = "the endpoint picker is shutting down"
	case flowcontrol.ReasonInvalidRequest:
		var fe *flowcontrol.Error
		if errors.As(err, &fe) && fe.Err != nil {
			return "invalid request: " + fe.Err.Error()
		}
		return "invalid request"
	case flowcontrol.ReasonBandNotAllowed:
		var bna *flowcontrol.BandNotAllowedError
		if errors.As(err, &bna) {
			return fmt.Sprintf("Request not admitted: %s. Send an objective (%s) of the %s band or lower.",
				bna.Error(), metadata.ObjectiveKey, bna.MaxBand)
		}
		return "Request not admitted: the request's objective is above its tenant's highest band."
	default:
		why = d.Reason.String()
	}
	msg := "Request not admitted: " + why + "."
	if s := d.RetryAfterSeconds(); s > 0 {
		msg += fmt.Sprintf(" Retry after %d seconds.", s)
	}
	return msg
}
