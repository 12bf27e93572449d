package flowcontrol

// EndpointCount is admission's count of one endpoint's requests at a moment, as it judges the endpoint's room: what
// the decision trace shows of the endpoints a request had room on, so that a request sent to a full server can be
// told from one admission counted wrong.
type EndpointCount struct {
	Name string
	// InFlight counts this EPP's requests there (dispatched and not released), Foreign how many more the last two
	// scrapes both showed, and Peer those other replicas said they run there. Admission's occupancy is InFlight plus
	// the larger of Foreign and Peer.
	InFlight, Foreign, Peer int
	// Seats is how many requests the endpoint starts at once (0 while unknown). Capacity is the most admission keeps
	// there when it judges seats strictly (under the Critical reserve, or for a tenant under its share; 0: no bound),
	// which may be one above tentative seats, to probe for more. Known is the stated or learned slot limit it judges
	// by otherwise (0 while neither is).
	Seats, Capacity, Known int
	// Adopted reports an endpoint that joined after a peer replica had been live (one a departed peer owned, say)
	// with no seat count learned here yet.
	Adopted bool
}

// Counts returns admission's counts of the named endpoints now, in the order given; a name it does not know (a peer's
// endpoint) is left out.
func (c *Controller) Counts(names []string) []EndpointCount {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]EndpointCount, 0, len(names))
	for _, name := range names {
		i, ok := c.endpointIndex[name]
		if !ok {
			continue
		}
		e := &c.endpoints[i]
		out = append(out, EndpointCount{Name: name, InFlight: e.inflight, Foreign: e.foreign, Peer: e.peer,
			Seats: e.seats, Capacity: e.capacity, Known: e.known, Adopted: e.adopted})
	}
	return out
}
