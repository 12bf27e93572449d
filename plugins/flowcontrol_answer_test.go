package plugins

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/flowcontrol"
)

// TestShedMessage: every reason a client can be answered with is explained in words, not by its label, and a
// Retry-After is stated in the message as in the header.
func TestShedMessage(t *testing.T) {
	tests := []struct {
		reason     flowcontrol.Reason
		outcome    flowcontrol.Outcome
		status     int
		retryAfter time.Duration
		want       string
	}{
		{flowcontrol.ReasonSaturated, flowcontrol.Rejected, http.StatusTooManyRequests, 8 * time.Second, "saturation ceiling"},
		{flowcontrol.ReasonQueueFull, flowcontrol.Rejected, http.StatusTooManyRequests, 2 * time.Second, "queue is full"},
		{flowcontrol.ReasonDisplaced, flowcontrol.Rejected, http.StatusTooManyRequests, 2 * time.Second, "displaced"},
		{flowcontrol.ReasonPredictedWait, flowcontrol.Rejected, http.StatusTooManyRequests, 12 * time.Second, "predicted wait exceeds"},
		{flowcontrol.ReasonQueueTimeout, flowcontrol.Rejected, http.StatusTooManyRequests, 3 * time.Second, "maximum queue time"},
		{flowcontrol.ReasonEarlyReturn, flowcontrol.Rejected, http.StatusTooManyRequests, 9 * time.Second, "came back before"},
		{flowcontrol.ReasonNoEndpoints, flowcontrol.Unavailable, http.StatusServiceUnavailable, time.Second, "no model server endpoint"},
		{flowcontrol.ReasonShuttingDown, flowcontrol.Unavailable, http.StatusServiceUnavailable, time.Second, "shutting down"},
	}
	for _, tt := range tests {
		t.Run(tt.reason.String(), func(t *testing.T) {
			d := flowcontrol.Decision{Outcome: tt.outcome, Reason: tt.reason, Band: flowcontrol.Standard, RetryAfter: tt.retryAfter}
			if got := httpStatus(d); got != tt.status {
				t.Errorf("status %d, want %d", got, tt.status)
			}
			msg := shedMessage(d, nil)
			if !strings.Contains(msg, tt.want) {
				t.Errorf("message %q does not say %q", msg, tt.want)
			}
			if want := fmt.Sprintf(" Retry after %d seconds.", int(tt.retryAfter.Seconds())); !strings.HasSuffix(msg, want) {
				t.Errorf("message %q does not end with %q", msg, want)
			}
		})
	}
}
