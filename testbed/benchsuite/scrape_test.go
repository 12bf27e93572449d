package benchsuite

import (
	"maps"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

const simulatorPage = `# HELP vllm:num_requests_waiting Number of requests waiting.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 3
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 7
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 1200
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 4000
# TYPE sluice_sim_lora_loads_total counter
sluice_sim_lora_loads_total{engine="0",model_name="m"} 5
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{le="0.1"} 2
vllm:time_to_first_token_seconds_bucket{le="+Inf"} 3
vllm:time_to_first_token_seconds_sum 0.5
vllm:time_to_first_token_seconds_count 3
`

const sluiceEPPPage = `# TYPE sluice_flowcontrol_stale_endpoints gauge
sluice_flowcontrol_stale_endpoints 3
# TYPE sluice_flowcontrol_queue_length gauge
sluice_flowcontrol_queue_length{band="Critical"} 1
sluice_flowcontrol_queue_length{band="Standard"} 4
sluice_flowcontrol_queue_length{band="Sheddable"} 0
# TYPE sluice_flowcontrol_dispatched_total counter
sluice_flowcontrol_dispatched_total{band="Critical",tenant="a"} 10
sluice_flowcontrol_dispatched_total{band="Critical",tenant="b"} 5
sluice_flowcontrol_dispatched_total{band="Standard",tenant="a"} 20
# TYPE sluice_flowcontrol_burst_dispatched_total counter
sluice_flowcontrol_burst_dispatched_total{band="Standard"} 12
# TYPE sluice_flowcontrol_shed_total counter
sluice_flowcontrol_shed_total{band="Sheddable",outcome="rejected",reason="queue_full",tenant="a"} 7
sluice_flowcontrol_shed_total{band="Standard",outcome="unavailable",reason="no_endpoints",tenant="a"} 2
`

const upstreamEPPPage = `# TYPE inference_extension_flow_control_queue_size gauge
inference_extension_flow_control_queue_size{fairness_id="a",inference_pool="p",model_name="m",priority="10",target_model_name=""} 2
inference_extension_flow_control_queue_size{fairness_id="b",inference_pool="p",model_name="m",priority="10",target_model_name=""} 1
inference_extension_flow_control_queue_size{fairness_id="a",inference_pool="p",model_name="m",priority="-1",target_model_name=""} 6
`

func mustParse(t *testing.T, page string) MetricPage {
	t.Helper()
	p, err := ParseMetrics(strings.NewReader(page))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestMetricPage(t *testing.T) {
	p := mustParse(t, simulatorPage)
	for name, want := range map[string]float64{
		metricServerWaiting: 3, metricServerRunning: 7, metricPrefixHits: 1200, metricPrefixQueries: 4000,
		metricAdapterLoads: 5, metricPreemptions: 0, "vllm:time_to_first_token_seconds": 0,
	} {
		if got := p.Sum(name); got != want {
			t.Errorf("sum(%s) = %v, want %v", name, got, want)
		}
	}
	if q := eppQueued(p); q != nil {
		t.Errorf("a page without EPP queues: %v", q)
	}
	if a := admissionCounters(p); a != nil {
		t.Errorf("a page without Sluice admission: %+v", a)
	}
}

func TestEPPQueued(t *testing.T) {
	sluice := eppQueued(mustParse(t, sluiceEPPPage))
	if want := map[string]float64{"Critical": 1, "Standard": 4, "Sheddable": 0}; !maps.Equal(sluice, want) {
		t.Errorf("Sluice queues %v, want %v", sluice, want)
	}
	upstream := eppQueued(mustParse(t, upstreamEPPPage))
	if want := map[string]float64{"priority 10": 3, "priority -1": 6}; !maps.Equal(upstream, want) {
		t.Errorf("upstream queues %v, want %v", upstream, want)
	}
	if total := (QueueSample{EPPQueued: upstream}).EPPQueuedTotal(); total != 9 {
		t.Errorf("total %v", total)
	}
}

func TestAdmissionCounters(t *testing.T) {
	a := admissionCounters(mustParse(t, sluiceEPPPage))
	if a == nil {
		t.Fatal("no counters")
	}
	if want := map[string]float64{"Critical": 15, "Standard": 20}; !maps.Equal(a.Dispatched, want) {
		t.Errorf("dispatched %v, want %v", a.Dispatched, want)
	}
	if want := map[string]float64{"Standard": 12}; !maps.Equal(a.BurstDispatched, want) {
		t.Errorf("dispatched in the burst tier %v, want %v", a.BurstDispatched, want)
	}
	if want := map[string]float64{"Sheddable": 7, "Standard": 2}; !maps.Equal(a.Shed, want) {
		t.Errorf("shed %v, want %v", a.Shed, want)
	}
	if want := map[string]float64{"queue_full": 7, "no_endpoints": 2}; !maps.Equal(a.ShedByReason, want) {
		t.Errorf("shed by reason %v, want %v", a.ShedByReason, want)
	}

	if n := eppStaleEndpoints(mustParse(t, sluiceEPPPage)); n == nil || *n != 3 {
		t.Errorf("stale endpoints %v, want 3", n)
	}
	if n := eppStaleEndpoints(mustParse(t, upstreamEPPPage)); n != nil {
		t.Errorf("stale endpoints %v on a page without Sluice admission, want none", *n)
	}

	// Before the first request the counter vectors have no series.
	quiet := admissionCounters(mustParse(t, "# TYPE sluice_flowcontrol_queue_length gauge\nsluice_flowcontrol_queue_length{band=\"Critical\"} 0\n"))
	if quiet == nil || quiet.Dispatched == nil || quiet.BurstDispatched == nil || len(quiet.Shed) != 0 || quiet.ShedByReason == nil {
		t.Errorf("quiet EPP: %+v", quiet)
	}
}

func TestScrape(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write([]byte(simulatorPage))
	}))
	defer srv.Close()
	p, err := Scrape(t.Context(), srv.Client(), srv.URL+"/metrics")
	if err != nil {
		t.Fatal(err)
	}
	if p.Sum(metricServerWaiting) != 3 {
		t.Errorf("waiting %v", p.Sum(metricServerWaiting))
	}
	if _, err := Scrape(t.Context(), srv.Client(), srv.URL+"/other"); err == nil || !strings.Contains(err.Error(), "404") {
		t.Errorf("a 404 page: %v", err)
	}
	if _, err := ParseMetrics(strings.NewReader("this is not { a page\n")); err == nil {
		t.Error("a malformed page parsed")
	}
}

// The EPP's replicas read as one EPP: queues and counters add up over their pages.
func TestScrapeMergedAddsReplicas(t *testing.T) {
	var urls []string
	for range 2 {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			_, _ = w.Write([]byte(sluiceEPPPage))
		}))
		t.Cleanup(srv.Close)
		urls = append(urls, srv.URL)
	}
	page, err := ScrapeMerged(t.Context(), http.DefaultClient, urls)
	if err != nil {
		t.Fatal(err)
	}
	if q := eppQueued(page); q["Critical"] != 2 || q["Standard"] != 8 {
		t.Errorf("queues %v, want each band twice one page's", q)
	}
	c := admissionCounters(page)
	if c.Dispatched["Critical"] != 30 || c.ShedByReason["queue_full"] != 14 {
		t.Errorf("counters %+v, want each twice one page's", c)
	}
	if _, err := ScrapeMerged(t.Context(), http.DefaultClient, append(urls, "http://127.0.0.1:1/metrics")); err == nil {
		t.Error("a replica's missing page went unnoticed")
	}
}
