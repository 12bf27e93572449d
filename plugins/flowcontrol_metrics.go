package plugins

import (
	"math"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-gw/sluice/flowcontrol"
)

// Per-endpoint admission metrics. They are read from the controller at scrape time (a collector, not gauges set on
// the request path), so they cost nothing between scrapes and an endpoint that left the pool leaves no stale series.
const (
	endpointSaturationHelp = "Load of each endpoint with fresh metrics as Sluice admission ranks it: its latest scrape " +
		"plus the requests dispatched to it since that have not started, over the endpoint thresholds (1 = saturated); " +
		"above 1 while it has streamed prompts it has not begun answering."
	endpointHeadroomHelp = "Each endpoint's headroom per band: the band's saturation ceiling minus the endpoint's " +
		"saturation, at least 0; at 0 admission sends it no more requests of that band."
)

var (
	endpointSaturationDesc = prometheus.NewDesc("sluice_flowcontrol_endpoint_saturation", endpointSaturationHelp,
		[]string{"endpoint"}, nil)
	endpointHeadroomDesc = prometheus.NewDesc("sluice_flowcontrol_endpoint_headroom", endpointHeadroomHelp,
		[]string{"endpoint", "band"}, nil)
)

// endpointCollector exports sluice_flowcontrol_endpoint_saturation and _headroom for fc's pool. Endpoints whose
// metrics are stale have no series (sluice_flowcontrol_stale_endpoints counts them).
type endpointCollector struct{ fc *FlowControl }

var _ prometheus.Collector = endpointCollector{}

func (c endpointCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- endpointSaturationDesc
	ch <- endpointHeadroomDesc
}

func (c endpointCollector) Collect(ch chan<- prometheus.Metric) {
	pool := c.fc.endpoints.PodList(allEndpoints)
	names := make([]string, len(pool))
	for i, ep := range pool {
		names[i] = EndpointName(ep.GetMetadata())
	}
	sats := make([]float64, len(names))
	c.fc.ctrl.Saturations("", names, sats)
	cfg := c.fc.ctrl.Config()
	for i, name := range names {
		if math.IsInf(sats[i], 1) {
			continue
		}
		ch <- prometheus.MustNewConstMetric(endpointSaturationDesc, prometheus.GaugeValue, sats[i], name)
		for _, b := range flowcontrol.AllBands() {
			ch <- prometheus.MustNewConstMetric(endpointHeadroomDesc, prometheus.GaugeValue,
				max(0, cfg.Bands[b].SaturationCeiling-sats[i]), name, b.String())
		}
	}
}
