package dataplane

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/sluice-gw/sluice/runner/runnertest"
)

// TestClientCannotRouteEndToEnd sends requests through the data plane and the real Sluice EPP whose headers name
// another server as destination, subset hint and served endpoint. The gateway's subset hint (its configuration, sent
// as envoy.lb.subset_hint metadata) allows only one server, so a request that lands anywhere else was routed by the
// client. The same holds when the EPP is down and the data plane fails open: the request goes to the configured
// endpoints, never where its headers point. Envoy with GIE's reference configuration routes fail-open requests on
// whatever x-gateway-destination-endpoint they carry (its ORIGINAL_DST cluster reads the header), which is why the
// gateway must strip it from client requests (SECURITY.md, the threat model); this data plane does.
func TestClientCannotRouteEndToEnd(t *testing.T) {
	allowed := startSimulator(t, "127.0.0.2", "h100")
	other := startSimulator(t, "127.0.0.3", "h100")
	hostile := []string{
		"X-Gateway-Destination-Endpoint", other,
		"X-Gateway-Destination-Endpoint-Subset", other,
		"X-Gateway-Destination-Endpoint-Served", other,
	}
	body := `{"model":"base","prompt":"route me elsewhere","max_tokens":4}`
	check := func(t *testing.T, url string) {
		t.Helper()
		for i := range 20 {
			status, header, reply := post(t, url+"/v1/completions", body, hostile...)
			if status != http.StatusOK {
				t.Fatalf("request %d: status %d: %s", i, status, reply)
			}
			if served := header.Get("X-Gateway-Destination-Endpoint-Served"); served != allowed {
				t.Fatalf("request %d served by %q, want %s: the client's headers routed it", i, served, allowed)
			}
		}
	}

	t.Run("through the EPP", func(t *testing.T) {
		epp := runnertest.StartEPP(t, nil, "--static-endpoints="+allowed+","+other, "--secure-serving=false")
		proxy, _ := startProxy(t, Config{EPPAddress: fmt.Sprintf("127.0.0.1:%d", epp.GRPCPort), ReportServedHeader: true,
			SubsetHint: []string{allowed}})
		check(t, proxy.URL)
	})
	t.Run("failing open without the EPP", func(t *testing.T) {
		proxy, _ := startProxy(t, Config{EPPAddress: fmt.Sprintf("127.0.0.1:%d", runnertest.FreePort(t)), ReportServedHeader: true,
			FailureModeAllow: true, Endpoints: []string{allowed}})
		check(t, proxy.URL)
	})
}
