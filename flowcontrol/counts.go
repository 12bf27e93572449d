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
	// Seats is how many requests the endpoint starts at once (0 while unknown) and Capacity the most admission keeps
	// there under the Critical reserve (0: no bound).
	Seats, Capacity int
	// Adopted reports an endpoint taken over from a peer that has no seat count learned here yet.
	Adopted bool
}

// Counts returns admission's counts of the named endpoints, in the order given; a name it does not know is left out.
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
			Seats: e.seats, Capacity: e.capacity, Adopted: e.adopted})
	}
	return out
}
