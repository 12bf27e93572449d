package plugins

import (
	fwksched "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/scheduling"

	"github.com/sluice-gw/sluice/flowcontrol"
	"github.com/sluice-gw/sluice/flowcontrol/replication"
)

// Adapter affinity across owners. With the peer exchange each replica sends requests to the endpoints it owns, so a
// replica whose endpoints lack a LoRA adapter would load it onto one of them although a peer's endpoint has it, and a
// hot adapter would end up loaded once per replica. The headroom filter therefore keeps a peer's endpoint that holds
// the request's adapter as a candidate when none of the candidates it kept does (keepAdapterHolders), and PreRequest
// counts a placement there as adapter affinity (adapterAffinity).

// keepAdapterHolders marks in keep, when no candidate kept holds the request's LoRA adapter, the candidates a peer owns
// that hold it (holdsAdapter), have nothing waiting in their queue and no more requests than the least loaded candidate
// kept (any number when no candidate kept reports its load), and that flow control lets a request of band use
// (mayUsePeerEndpoint); it records them in the request's decision for PreRequest and returns how many it marked. The
// load bound keeps the peer's endpoint from becoming where every replica's requests for a hot adapter pile up between
// two of its scrapes.
func keepAdapterHolders(fc *FlowControl, band flowcontrol.Band, request *fwksched.LLMRequest, endpoints []fwksched.Endpoint, keep []bool) int {
	adapter := request.TargetModel
	if adapter == "" {
		return 0
	}
	least := -1 // the least load among the candidates kept that report one
	for i, ep := range endpoints {
		if !keep[i] {
			continue
		}
		if holdsAdapter(ep, adapter) {
			return 0
		}
		if m := ep.GetMetrics(); m != nil && (least < 0 || requestLoad(m) < least) {
			least = requestLoad(m)
		}
	}
	var kept []string
	for i, ep := range endpoints {
		if keep[i] || ep.GetMetadata() == nil || !holdsAdapter(ep, adapter) {
			continue
		}
		if m := ep.GetMetrics(); m == nil || m.WaitingQueueSize > 0 || (least >= 0 && requestLoad(m) > least) {
			continue
		}
		if name := EndpointName(ep.GetMetadata()); fc.isPeerEndpoint(name) && fc.mayUsePeerEndpoint(band, name) {
			keep[i] = true
			kept = append(kept, name)
		}
	}
	if len(kept) > 0 {
		fc.headroom.update(request.RequestId, func(sd *storedDecision) { sd.adapterKept = kept })
	}
	return len(kept)
}

// adapterAffinity is why a request placed on a peer's endpoint went there without an offered seat: for its adapter
// when the headroom filter kept that endpoint for it (sd, the request's decision), else for its prompt's prefix.
func adapterAffinity(sd storedDecision, endpoint string) replication.Affinity {
	for _, name := range sd.adapterKept {
		if name == endpoint {
			return replication.ForAdapter
		}
	}
	return replication.ForPrefix
}

// holdsAdapter reports whether ep holds LoRA adapter adapter at its latest scrape: the server reports it resident, or
// requests for it running or waiting there. A model the server reports serving as a base model is not an adapter.
func holdsAdapter(ep fwksched.Endpoint, adapter string) bool {
	if adapter == "" {
		return false
	}
	ps, res := loraPodState(ep)
	if res.servesBase(adapter) {
		return false
	}
	return ps.Resident.Has(adapter) || ps.Running.Has(adapter) || ps.Waiting.Has(adapter)
}
