package plugins

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"

	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/flowcontrol/contracts"
	fwkdl "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/datalayer"
)

// Candidate narrowing: the cost of a scheduling decision grows with the candidates it considers. Upstream's Director
// copies every candidate endpoint (metadata, metrics, attributes) for each request, runs every PrepareData plugin,
// filter and scorer over all of them, and then the picker sorts them; at 1,000 endpoints that is milliseconds per
// request. Sluice admission has already ranked the endpoints when it dispatches a request (each dispatch counts on its
// endpoint at once, see flowcontrol.Controller.Saturations), so the Director's candidates can be narrowed to the
// MaxCandidates endpoints admission ranks least loaded before any of that runs: what the scorers would choose among
// is almost always there (the load scorers prefer the least loaded by construction), and what is left out would
// mostly have been filtered out by the headroom filter anyway.
//
// What narrowing keeps, of the endpoints the wrapped EndpointCandidates located (the proxy's subset hint applies
// first):
//   - when some of them serve the request's target model as their base model (the served-model filter's rule, from
//     the sluice-lora-residency-extractor's attribute), only those are ranked;
//   - of those, the MaxCandidates with the lowest admission rank, ties broken in rotation (so equally idle endpoints
//     take turns, as round-robin's would); endpoints whose metrics are stale rank last;
//   - when none of those had headroom for the request's band at dispatch (flowcontrol.Decision.Endpoints), the
//     endpoints that had it rank first. Rank and headroom mostly agree, but not always: under the Critical seat
//     reserve a lightly loaded seat-bound endpoint may keep its last idle seats for Critical, and the headroom filter
//     restricts nothing when no candidate had headroom, so a narrowed set without one would let a lower band take
//     the seats kept for Critical.
//
// It narrows nothing for a request Sluice admission did not dispatch (no stored decision: expired, or another
// admission controller), nor when the located endpoints are no more than MaxCandidates. What it gives up: an endpoint
// outside the least-loaded MaxCandidates that holds much more of the request's prompt, or has its LoRA adapter
// resident, is not scored; at most MaxCandidates candidates the affinity scorers choose among them only. Pools of at
// most MaxCandidates endpoints are not affected at all.

// DefaultMaxCandidates is FlowControlOptions.MaxCandidates's default.
const DefaultMaxCandidates = 32

// narrowedCandidates narrows what inner locates for requests Sluice admission dispatched.
type narrowedCandidates struct {
	inner contracts.EndpointCandidates
	fc    *FlowControl
	max   int
	// rotation offsets each request's scan, so ties among equally ranked endpoints go to a different one each time.
	rotation atomic.Uint64
	buffers  sync.Pool // *narrowBuffers
}

type narrowBuffers struct {
	eligible []int
	names    []string
	ranks    []float64
	top      []int // indices into eligible, ascending by rank
	set      map[string]struct{}
}

// NarrowCandidates returns inner's candidates narrowed for the requests this adapter dispatched (see above), or inner
// itself when narrowing is off (FlowControlOptions.MaxCandidates negative). The runner gives it to the Director; the
// request is known by the ID in the Locate context (WithRequestID).
func (f *FlowControl) NarrowCandidates(inner contracts.EndpointCandidates) contracts.EndpointCandidates {
	if f.opts.MaxCandidates < 0 {
		return inner
	}
	f.narrowing.Store(true)
	return &narrowedCandidates{inner: inner, fc: f, max: f.opts.MaxCandidates}
}

// Locate implements contracts.EndpointCandidates.
func (n *narrowedCandidates) Locate(ctx context.Context, requestMetadata map[string]any) []fwkdl.Endpoint {
	all := n.inner.Locate(ctx, requestMetadata)
	if len(all) <= n.max {
		return all
	}
	id := requestIDFrom(ctx)
	if id == "" {
		return all
	}
	sd, ok := n.fc.headroom.get(id)
	if !ok {
		return all
	}
	if n.fc.peers != nil && n.fc.peers.Sent(id) {
		// Sent to a peer's endpoint, which this replica's admission does not rank: that endpoint is the candidate.
		return slices.DeleteFunc(slices.Clone(all), func(ep fwkdl.Endpoint) bool {
			return !slices.Contains(sd.decision.Endpoints, EndpointName(ep.GetMetadata()))
		})
	}
	return n.narrow(id, sd.model, sd.decision.Endpoints, all)
}

// outsideHeadroom is added to the rank of an endpoint that had no headroom for the request, when it must rank after
// every endpoint that had (ranks are saturations, a few units at most, or +Inf for unusable endpoints).
const outsideHeadroom = 1e9

// narrow returns the at most n.max endpoints of all, in all's order, that admission ranks least loaded among those
// serving model (all of them when none does), with at least one of the endpoints in headroom when any is eligible.
func (n *narrowedCandidates) narrow(id, model string, headroom []string, all []fwkdl.Endpoint) []fwkdl.Endpoint {
	buf, _ := n.buffers.Get().(*narrowBuffers)
	if buf == nil {
		buf = &narrowBuffers{}
	}
	defer n.buffers.Put(buf)

	start := int(n.rotation.Add(1) % uint64(len(all)))
	buf.eligible = buf.eligible[:0]
	if model != "" {
		for k := range all {
			i := (start + k) % len(all)
			if residencyOf(all[i]).servesBase(model) {
				buf.eligible = append(buf.eligible, i)
			}
		}
	}
	if len(buf.eligible) == 0 {
		for k := range all {
			buf.eligible = append(buf.eligible, (start+k)%len(all))
		}
	}
	if len(buf.eligible) <= n.max {
		return pick(all, buf.eligible)
	}

	buf.names = buf.names[:0]
	for _, i := range buf.eligible {
		buf.names = append(buf.names, n.fc.nameOf(all[i].GetMetadata()))
	}
	buf.ranks = grow(buf.ranks, len(buf.names))
	n.fc.ctrl.Saturations(id, buf.names, buf.ranks)
	defer clear(buf.names) // keep no endpoint names alive from the pool

	buf.lowest(n.max)
	if len(headroom) > 0 && !buf.topHolds(headroom) {
		buf.rankOutsideLast(headroom)
		buf.lowest(n.max)
	}
	for k, j := range buf.top {
		buf.top[k] = buf.eligible[j]
	}
	return pick(all, buf.top)
}

// lowest sets b.top to the indices into b.eligible of the at most max lowest ranks, ascending, by insertion into a
// sorted prefix: the scan order (rotated) breaks ties.
func (b *narrowBuffers) lowest(max int) {
	top := b.top[:0]
	for j, r := range b.ranks[:len(b.eligible)] {
		if len(top) == max && r >= b.ranks[top[len(top)-1]] {
			continue
		}
		at := len(top)
		for at > 0 && r < b.ranks[top[at-1]] {
			at--
		}
		if len(top) < max {
			top = append(top, 0)
		}
		copy(top[at+1:], top[at:len(top)-1])
		top[at] = j
	}
	b.top = top
}

// topHolds reports whether one of the endpoints b.top names is among headroom. The names of b.top are indexed, not
// headroom's: headroom may list the whole pool.
func (b *narrowBuffers) topHolds(headroom []string) bool {
	if b.set == nil {
		b.set = make(map[string]struct{}, len(b.top))
	}
	defer clear(b.set)
	for _, j := range b.top {
		b.set[b.names[j]] = struct{}{}
	}
	for _, name := range headroom {
		if _, ok := b.set[name]; ok {
			return true
		}
	}
	return false
}

// rankOutsideLast moves every eligible endpoint not among headroom behind those that are, keeping their order.
func (b *narrowBuffers) rankOutsideLast(headroom []string) {
	if b.set == nil {
		b.set = make(map[string]struct{}, len(headroom))
	}
	defer clear(b.set)
	for _, name := range headroom {
		b.set[name] = struct{}{}
	}
	for j, name := range b.names {
		if _, ok := b.set[name]; !ok {
			b.ranks[j] += outsideHeadroom
		}
	}
}

// pick returns all[i] for the indices idx, in all's order; it sorts idx.
func pick(all []fwkdl.Endpoint, idx []int) []fwkdl.Endpoint {
	slices.Sort(idx)
	out := make([]fwkdl.Endpoint, len(idx))
	for k, i := range idx {
		out[k] = all[i]
	}
	return out
}

// residencyOf is the endpoint's LoRA residency attribute (nil without one).
func residencyOf(ep fwkdl.Endpoint) *LoRAResidency {
	attrs := ep.GetAttributes()
	if attrs == nil {
		return nil
	}
	v, ok := attrs.Get(LoRAResidencyKey)
	if !ok {
		return nil
	}
	res, _ := v.(*LoRAResidency)
	return res
}

type requestIDKey struct{}

// WithRequestID returns ctx carrying id, which reports the x-request-id of the request ctx serves once it is known
// (the runner's ext_proc stream learns it from the request headers). NarrowCandidates's Locate reads it: upstream's
// Director passes Locate no request, only a context derived from the stream's.
func WithRequestID(ctx context.Context, id func() string) context.Context {
	return context.WithValue(ctx, requestIDKey{}, id)
}

func requestIDFrom(ctx context.Context) string {
	if id, ok := ctx.Value(requestIDKey{}).(func() string); ok {
		return id()
	}
	return ""
}
