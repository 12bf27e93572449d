package flowcontrol

import "errors"

// ErrWithdrawn is the cause carried by the Cancelled decision of a request withdrawn with Cancel.
var ErrWithdrawn = errors.New("request withdrawn by its caller")

// Submit is Admit for callers that must not block, such as a discrete-event simulation that drives the controller,
// the model servers and the clock from one goroutine. It decides req exactly as Admit does and calls decided once
// with what Admit would have returned: the decision, and nil exactly when it is Dispatched (else an *Error).
//
// A request decided on arrival (the fast path, a rejection, Unavailable) gets its callback before Submit returns. A
// request that waits gets it later, from inside the call that decides it (UpdateEndpoints, Bind, Release, SetConfig,
// Shutdown, Cancel, or a timer callback on the controller's clock), with the controller's lock held: decided must not
// call the Controller. It should note the decision and act on it once that call has returned. The Recorder's
// RecordDecision for a waiting request runs at the same place, under the lock (Admit calls it outside).
//
// A dispatched request holds a reservation exactly as with Admit: Bind and Release apply.
func (c *Controller) Submit(req Request, decided func(Decision, error)) {
	if decided == nil {
		panic("flowcontrol: Submit needs a callback")
	}
	d, it, cause := c.arrive(req, func(it *item) {
		it.decided = func(d Decision, cause error) {
			c.recorder.RecordDecision(req.Tenant, d)
			decided(d, admitError(d, cause))
		}
	})
	if it == nil {
		c.recorder.RecordDecision(req.Tenant, d)
		decided(d, admitError(d, cause))
	}
}

// admitError is Admit's error for a decision: nil for Dispatched, else an *Error wrapping cause.
func admitError(d Decision, cause error) error {
	if d.Outcome == Dispatched {
		return nil
	}
	return newError(d, cause)
}

// Cancel withdraws a waiting request (one given to Submit, or to Admit, whose call then returns): it is answered
// Cancelled with ReasonCancelled and the cause ErrWithdrawn, and Cancel reports true. A request that is not waiting
// (unknown, or already decided) is left alone and Cancel reports false; release a dispatched one with Release.
func (c *Controller) Cancel(id string) bool {
	c.mu.Lock()
	it, ok := c.queued[id]
	if !ok {
		c.mu.Unlock()
		return false
	}
	sample := c.withdrawLocked(it, ErrWithdrawn)
	c.mu.Unlock()
	c.recorder.RecordQueue(sample)
	return true
}
