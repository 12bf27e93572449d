package flowcontrol

import "time"

// returnLedger counts, for one band, the cost of the requests it has told to come back, per whole second of their
// return. Clients turned away over a long overload are all told about the same moment, the one capacity is expected
// back; without a ledger they arrive together, overflow the capacity that has just returned and are turned away
// again. Booking each return in the first second at or after its estimate that still has room spreads them out.
type returnLedger struct {
	due map[int64]float64 // Unix second → cost told to return within it
}

// book returns retry (whole seconds) moved to the first second whose returns, with cost, stay within budget (the
// cost per second the band can admit, bandRecovery.returnBudget) or that has none yet, but no later than hi; and
// records the return. A budget of zero or less (unknown) books without moving.
func (l *returnLedger) book(now time.Time, retry, hi time.Duration, cost, budget float64) time.Duration {
	if l.due == nil {
		l.due = make(map[int64]float64)
	}
	nowSec := now.Unix()
	for s := range l.due {
		if s < nowSec {
			delete(l.due, s)
		}
	}
	for budget > 0 && retry < hi {
		if due := l.due[now.Add(retry).Unix()]; due == 0 || due+cost <= budget {
			break
		}
		retry += time.Second
	}
	l.due[now.Add(retry).Unix()] += cost
	return retry
}
