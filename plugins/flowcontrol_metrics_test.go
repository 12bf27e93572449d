package plugins

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestEndpointCollector: an idle endpoint has each band's full ceiling as headroom, one at the queue-depth threshold
// (saturation 1) has none, and an endpoint with stale metrics has no series.
func TestEndpointCollector(t *testing.T) {
	pool := &fakePool{}
	fc, clk := newTestFlowControl(t, nil, pool)
	pool.set(upstreamEndpoint("10.0.0.1", 0, 0, clk.Now()), upstreamEndpoint("10.0.0.2", 2, 0, clk.Now()),
		upstreamEndpoint("10.0.0.3", 0, 0, clk.Now().Add(-time.Hour)))
	if err := fc.SyncEndpoints(); err != nil {
		t.Fatal(err)
	}
	expected := `
# HELP sluice_flowcontrol_endpoint_headroom ` + endpointHeadroomHelp + `
# TYPE sluice_flowcontrol_endpoint_headroom gauge
sluice_flowcontrol_endpoint_headroom{band="Critical",endpoint="10.0.0.1:8000"} 1
sluice_flowcontrol_endpoint_headroom{band="Standard",endpoint="10.0.0.1:8000"} 0.8
sluice_flowcontrol_endpoint_headroom{band="Sheddable",endpoint="10.0.0.1:8000"} 0.6
sluice_flowcontrol_endpoint_headroom{band="Critical",endpoint="10.0.0.2:8000"} 0
sluice_flowcontrol_endpoint_headroom{band="Standard",endpoint="10.0.0.2:8000"} 0
sluice_flowcontrol_endpoint_headroom{band="Sheddable",endpoint="10.0.0.2:8000"} 0
# HELP sluice_flowcontrol_endpoint_saturation ` + endpointSaturationHelp + `
# TYPE sluice_flowcontrol_endpoint_saturation gauge
sluice_flowcontrol_endpoint_saturation{endpoint="10.0.0.1:8000"} 0
sluice_flowcontrol_endpoint_saturation{endpoint="10.0.0.2:8000"} 1
`
	if err := testutil.CollectAndCompare(endpointCollector{fc}, strings.NewReader(expected)); err != nil {
		t.Fatal(err)
	}
}
