package runner_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/runner/runnertest"
)

// TestClientCannotChooseEndpoint runs the EPP binary in static mode with two endpoints, one idle and one with a full
// queue, and sends requests whose headers name the busy one as destination, subset hint and served endpoint, the
// way a client would try to pick its server past a gateway that forwards every header. The EPP routes on its own
// decision only: the idle endpoint, named once in the header mutation and in the envoy.lb metadata that Envoy's
// ORIGINAL_DST cluster routes on, and none of the client's routing headers is passed on. Upstream reads the subset
// hint only from Envoy's envoy.lb.subset_hint metadata, which a client cannot set; a header of that name is ignored.
func TestClientCannotChooseEndpoint(t *testing.T) {
	// Two addresses: upstream's subset filter matches endpoints by IP.
	idle := runnertest.StartModelServer(t, "127.0.0.2:0")
	busy := runnertest.StartModelServer(t, "127.0.0.3:0")
	busy.Waiting.Store(100)
	hostile := map[string]string{
		"x-gateway-destination-endpoint":        busy.Addr,
		"x-gateway-destination-endpoint-subset": busy.Addr,
		"x-gateway-destination-endpoint-served": busy.Addr,
	}
	for _, mode := range []struct {
		name string
		args []string
	}{
		{"upstream admission", nil},
		{"Sluice admission", []string{"--sluice-admission"}},
	} {
		t.Run(mode.name, func(t *testing.T) {
			epp := runnertest.StartEPP(t, nil, append([]string{"--static-endpoints=" + idle.Addr + "," + busy.Addr, "--secure-serving=false"}, mode.args...)...)
			// Until both endpoints are scraped the scheduler cannot tell them apart (and Sluice admission answers 503).
			runnertest.Eventually(t, "requests go to the idle endpoint", func() string {
				for i := range 5 {
					a := runnertest.Route(t, epp.GRPCPort, false, nil, completion(fmt.Sprintf("warm-up %d %d", i, time.Now().UnixNano())), nil)
					if a.Destination != idle.Addr {
						return fmt.Sprintf("answer %+v, want routed to %s", a, idle.Addr)
					}
				}
				return ""
			})
			for i := range 20 {
				a := runnertest.Route(t, epp.GRPCPort, false, hostile, completion(fmt.Sprintf("hostile %d %d", i, time.Now().UnixNano())), nil)
				if a.Status != 0 {
					t.Fatalf("request %d: immediate response %d: %s", i, a.Status, a.Body)
				}
				if got := a.SetHeaders["x-gateway-destination-endpoint"]; !slices.Equal(got, []string{idle.Addr}) || a.Metadata != idle.Addr {
					t.Fatalf("request %d: destination headers %q, metadata %q; want only the EPP's choice %s", i, got, a.Metadata, idle.Addr)
				}
				for _, h := range []string{"x-gateway-destination-endpoint-subset", "x-gateway-destination-endpoint-served"} {
					if v, ok := a.SetHeaders[h]; ok {
						t.Fatalf("request %d: the EPP passes the client's %s on: %q", i, h, v)
					}
				}
			}
		})
	}
}
