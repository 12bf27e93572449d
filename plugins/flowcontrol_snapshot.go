package plugins

import (
	"context"
	"fmt"
	"net"
	"slices"

	fwkdl "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/datalayer"

	"github.com/sluice-gw/sluice/flowcontrol"
)

// What admission knows of the pool: the snapshots it takes of the endpoints' metrics, and the warm-up before the first.

// EndpointName names an endpoint the way the EPP routes to it: address:port (upstream's x-gateway-destination-endpoint).
func EndpointName(md *fwkdl.EndpointMetadata) string {
	if md == nil {
		return ""
	}
	return net.JoinHostPort(md.GetIPAddress(), md.GetPort())
}

// requestLoad is an endpoint's running and waiting requests at its latest scrape.
func requestLoad(m *fwkdl.Metrics) int { return m.RunningRequestsSize + m.WaitingQueueSize }

// EndpointSnapshot converts an upstream endpoint and its latest metrics to the controller's view. An endpoint with no
// metrics yet has a zero scrape time, hence no headroom. Negative counts read as 0 and KV-cache usage is clamped to
// [0, 1] (vLLM reports a fraction), so one odd scrape cannot drop the endpoint from the snapshot.
func EndpointSnapshot(ep fwkdl.Endpoint) flowcontrol.Endpoint {
	e := flowcontrol.Endpoint{Name: EndpointName(ep.GetMetadata())}
	m := ep.GetMetrics()
	if m == nil {
		return e
	}
	e.WaitingQueue = max(m.WaitingQueueSize, 0)
	e.Running = max(m.RunningRequestsSize, 0)
	e.KVCacheUsage = m.KVCacheUsagePercent
	if !(e.KVCacheUsage >= 0) { // also NaN
		e.KVCacheUsage = 0
	}
	e.KVCacheUsage = min(e.KVCacheUsage, 1)
	e.ScrapedAt = m.UpdateTime
	return e
}

func allEndpoints(fwkdl.Endpoint) bool { return true }

// nameOf is EndpointName(md), from the last snapshot's names when md was in it: the datastore replaces an endpoint's
// metadata rather than change it, so a known pointer has the same name, and a per-request pass over the pool needs
// no new string per endpoint.
func (f *FlowControl) nameOf(md *fwkdl.EndpointMetadata) string {
	if names := f.names.Load(); names != nil {
		if name, ok := (*names)[md]; ok {
			return name
		}
	}
	return EndpointName(md)
}

// markEjected sets Ejected on the endpoints of eps (named names) that an attached outlier filter leaves out of a pick
// among them all, once it has seen their scrapes (the requests others sent there explain a stall:
// outlier.Pace.Scraped).
func (f *FlowControl) markEjected(eps []flowcontrol.Endpoint, names []string) {
	outliers := f.outliers.Load()
	if outliers == nil || len(*outliers) == 0 {
		return
	}
	now := f.clock.Now()
	var ejected []bool
	for _, o := range *outliers {
		for i := range eps {
			o.pace.Scraped(now, names[i], eps[i].Running+eps[i].WaitingQueue, eps[i].ScrapedAt)
		}
		o.ejectStalled(context.Background(), now)
		if o.detector.Clean() {
			continue
		}
		if ejected == nil {
			ejected = make([]bool, len(eps))
		}
		o.detector.Eject(now, names, ejected)
		for i := range eps {
			eps[i].Ejected = eps[i].Ejected || ejected[i]
		}
	}
}

// SyncEndpoints hands the controller a snapshot of the latest metrics of every endpoint this replica owns (every
// endpoint without replication), and of which endpoints attached outlier filters eject from a pick among the whole
// pool, which dispatches waiting requests onto any endpoint that now has headroom. The error lists endpoints the
// controller left out.
func (f *FlowControl) SyncEndpoints() error {
	pool := f.endpoints.PodList(allEndpoints)
	eps := make([]flowcontrol.Endpoint, len(pool))
	names := make([]string, len(pool))
	byMetadata := make(map[*fwkdl.EndpointMetadata]string, len(pool))
	scraped := false
	for i, ep := range pool {
		eps[i] = EndpointSnapshot(ep)
		names[i] = eps[i].Name
		scraped = scraped || !eps[i].ScrapedAt.IsZero()
		if md := ep.GetMetadata(); md != nil {
			byMetadata[md] = eps[i].Name
		}
	}
	f.names.Store(&byMetadata)
	f.markEjected(eps, names)
	eps = f.ownedOnly(eps, names)
	err := f.ctrl.UpdateEndpoints(eps)
	if scraped {
		f.markWarm("endpoint metrics arrived")
	}
	return err
}

// ownedOnly keeps, in order, the endpoints of eps this replica owns. Ownership is recomputed on every snapshot, so
// when a peer falls silent its endpoints join this replica's snapshot at the next one. When every endpoint it owns is
// ejected it keeps the whole pool: the outlier filters never eject the whole pool, and a replica whose share is
// failing routes to its peers' endpoints rather than turn its requests away. names are eps' names, in order.
func (f *FlowControl) ownedOnly(eps []flowcontrol.Endpoint, names []string) []flowcontrol.Endpoint {
	if f.ownership == nil {
		return eps
	}
	owned := f.ownership.Owned(names, f.clock.Now())
	if len(owned) == len(eps) {
		return eps
	}
	mine := make(map[string]bool, len(owned))
	for _, n := range owned {
		mine[n] = true
	}
	if !slices.ContainsFunc(eps, func(e flowcontrol.Endpoint) bool { return mine[e.Name] && !e.Ejected }) {
		return eps
	}
	return slices.DeleteFunc(eps, func(e flowcontrol.Endpoint) bool { return !mine[e.Name] })
}

// Run takes a snapshot at once and then every SnapshotInterval, until ctx ends. Then it shuts the controller down:
// new requests are answered 503 (shutting_down), waiting ones may still be dispatched for ShutdownGrace (snapshots
// continue meanwhile) and are answered 503 after that. Run returns once no request waits.
func (f *FlowControl) Run(ctx context.Context) {
	ticker := f.clock.NewTicker(f.opts.SnapshotInterval)
	defer ticker.Stop()
	lastErr := ""
	snapshot := func() {
		err := f.SyncEndpoints()
		if msg := fmt.Sprint(err); err != nil && msg != lastErr {
			f.logger.Error(err, "Some endpoints were left out of the flow control snapshot")
		}
		lastErr = fmt.Sprint(err)
	}
	snapshot()
	done := ctx.Done()
	var drained <-chan struct{}
	for {
		select {
		case <-done:
			f.logger.Info("Shutting down flow control", "grace", f.opts.ShutdownGrace)
			done, drained = nil, f.ctrl.Shutdown(f.opts.ShutdownGrace)
			f.markWarm("shutting down") // requests held for metrics are answered too
		case <-drained:
			return
		case <-ticker.C():
			snapshot()
		}
	}
}

// Start implements controller-runtime's manager.Runnable with Run: the runner runs an admission controller that is a
// Runnable beside the EPP's servers and waits for it on shutdown, so the requests still waiting are answered before
// the process exits.
func (f *FlowControl) Start(ctx context.Context) error {
	f.Run(ctx)
	return nil
}

// awaitWarm holds a request that arrives before any endpoint's metrics were scraped until they are, Run stops, the
// warm-up ends or ctx does (the client is gone: its error is returned). A new EPP replica answers its pool's first
// requests on real metrics then, instead of 503 no_endpoints for the moments before its first scrape lands.
func (f *FlowControl) awaitWarm(ctx context.Context) error {
	select {
	case <-f.warm:
		return nil
	default:
	}
	left := f.warmUntil.Sub(f.clock.Now())
	if left <= 0 {
		return nil
	}
	t := f.clock.NewTimer(left)
	defer t.Stop()
	select {
	case <-f.warm:
	case <-t.C():
	case <-ctx.Done():
		return ctx.Err()
	}
	return nil
}

// markWarm ends the warm-up: requests are decided on arrival from now on.
func (f *FlowControl) markWarm(why string) {
	f.warmOnce.Do(func() {
		close(f.warm)
		f.logger.Info("Admission deciding requests", "after", f.clock.Since(f.started), "because", why)
	})
}
