package flowcontrol

import (
	"cmp"
	"slices"
	"time"
)

// occupancyRecon reconciles, at each new scrape of an endpoint, the EPP's count of its requests there with the
// endpoint's own (running + waiting). The EPP's count is fresher, since it sees every request end; the scrape sees
// what the EPP does not: requests sent around it (another EPP replica's), and requests the EPP counts that are no
// longer there (their end never reported, say by a proxy that does not pass responses through the EPP). Either
// difference must show in two (foreign) or three (missing) consecutive scrapes before it counts, since a request on
// its way to the server, or whose last chunk is on its way back, differs for less than one scrape interval.
type occupancyRecon struct {
	// released are the requests released here since the latest scrape that had been sent before it: the scrape
	// counted them, the EPP no longer does.
	released []releaseMark
	// lastForeign is the previous scrape's surplus over the EPP's count.
	lastForeign int
	// missingScrapes counts consecutive scrapes that showed fewer requests than the EPP had sent, and missing is the
	// smallest such shortfall among them.
	missingScrapes, missing int
}

// releaseMark is one release: when the request was sent to the endpoint and when it was released, in Unix
// nanoseconds.
type releaseMark struct{ sentNs, releasedNs int64 }

// missingScrapesToDrop is how many consecutive scrapes must show fewer requests than the EPP counts before it stops
// counting the oldest of them.
const missingScrapesToDrop = 3

// released notes that a request sent at sent was released at now.
func (o *occupancyRecon) release(sent, now time.Time) {
	o.released = append(o.released, releaseMark{sentNs: sent.UnixNano(), releasedNs: now.UnixNano()})
}

// observe compares a new scrape, taken at scrapedNs and showing server requests, with sentBefore, the EPP's requests
// still in flight there that were sent before it. It returns how many foreign requests the endpoint holds and how
// many of the EPP's oldest requests there, sent before the scrape, are no longer there.
func (o *occupancyRecon) observe(scrapedNs int64, server, sentBefore int) (foreign, drop int) {
	ours := sentBefore
	kept := o.released[:0]
	for _, m := range o.released {
		if m.releasedNs >= scrapedNs {
			kept = append(kept, m)
			if m.sentNs < scrapedNs {
				ours++
			}
		}
	}
	clear(o.released[len(kept):])
	o.released = kept

	surplus := max(0, server-ours)
	foreign = min(surplus, o.lastForeign)
	o.lastForeign = surplus

	if short := ours - server; short > 0 {
		if o.missingScrapes == 0 || short < o.missing {
			o.missing = short
		}
		o.missingScrapes++
	} else {
		o.missingScrapes, o.missing = 0, 0
	}
	if o.missingScrapes >= missingScrapesToDrop {
		drop = min(o.missing, sentBefore)
		o.missingScrapes, o.missing = 0, 0
	}
	return foreign, drop
}

// dropMissingLocked stops counting the n oldest requests in flight on endpoint i that were sent before its scrape:
// its scrapes say they are no longer there (their end was never reported). The caller refreshes the endpoint.
func (c *Controller) dropMissingLocked(i, n int) {
	e := &c.endpoints[i]
	type sent struct {
		id string
		at time.Time
	}
	var candidates []sent
	for id, r := range c.reservations {
		if r.endpoint == e.Name && r.at.Before(e.ScrapedAt) {
			candidates = append(candidates, sent{id, r.at})
		}
	}
	slices.SortFunc(candidates, func(a, b sent) int { return cmp.Or(a.at.Compare(b.at), cmp.Compare(a.id, b.id)) })
	for _, s := range candidates[:min(n, len(candidates))] {
		r := c.reservations[s.id]
		delete(c.reservations, s.id)
		if r.pending {
			e.pendingDoneNs -= int64(r.promptTime)
		}
		e.tally(r, -1)
		c.droppedMissing++
	}
}
