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

// promiseKeeper remembers when each request turned away was told to come back, by the key its caller derives from
// the request's content (Request.ReturnKey), so that the client's return can be told apart from a fresh arrival.
// A band that sheds at once when saturated (Sheddable) lets a recognised return wait in its queue, up to the band's
// MaxQueueTime, for the capacity the promise was booked against (returnLedger), instead of turning it away again,
// once the backlog the overload built drains (Controller.recoveringLocked):
// clients told to come back just as a backlog drains otherwise meet its last seconds and are shed a second time.
//
// A band that queues, below Critical, tells a return that comes back well before its moment the rest of its wait
// (Controller.admitLocked, early).
//
// Recognition needs no token a client could forge: a promise is only made to a request that was turned away, only
// the same content claims it, and only once; a claim counts only once its Retry-After has passed.
type promiseKeeper struct {
	due    map[uint64]time.Time // key → the moment its client was told to come back
	pruned time.Time
}

// At most maxPromises are kept, each until the band's longest Retry-After past the moment it names (a client that
// comes back later than that arrives fresh): past that count, a new promise is not recorded (its client will be
// answered as a fresh arrival).
const maxPromises = 1 << 16

// promiseEarly is how much earlier than told a client may come back and still claim its promise: Retry-After is in
// whole seconds, and a client may count its wait from when it sent the request rather than from the answer.
const promiseEarly = time.Second

// promise records that the request with key (0: none) was told at now to come back after retry; the promise is kept
// until ttl past that moment.
func (p *promiseKeeper) promise(key uint64, now time.Time, retry, ttl time.Duration) {
	if key == 0 {
		return
	}
	if p.due == nil {
		p.due = make(map[uint64]time.Time)
	}
	if now.Sub(p.pruned) >= time.Second {
		p.pruned = now
		for k, at := range p.due {
			if now.Sub(at) > ttl {
				delete(p.due, k)
			}
		}
	}
	if _, ok := p.due[key]; ok || len(p.due) < maxPromises {
		p.due[key] = now.Add(retry)
	}
}

// early reports how long before the moment it was told a request with key arriving at now comes back, if that is
// more than promiseEarly (a client that caps its wait below the Retry-After it was told), keeping the promise; any
// other return uses the promise up and reports 0. The key is the request's content, which another client may send
// too (a load test's fixed body): such a request is told the same moment (doc.go says what that costs).
func (p *promiseKeeper) early(key uint64, now time.Time) time.Duration {
	at, ok := p.due[key]
	if !ok || key == 0 {
		return 0
	}
	if left := at.Sub(now); left > promiseEarly {
		return left
	}
	delete(p.due, key)
	return 0
}

// claim reports whether a request with key arriving at now is the return of a client that was promised capacity and
// waited as it was told, and consumes that promise.
func (p *promiseKeeper) claim(key uint64, now time.Time, ttl time.Duration) bool {
	at, ok := p.due[key]
	if !ok || key == 0 {
		return false
	}
	delete(p.due, key)
	return !now.Before(at.Add(-promiseEarly)) && now.Sub(at) <= ttl
}
