package simulator

import (
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-gw/sluice/testbed/simulator/engine"
)

// Metric names. The vllm: ones match vLLM v1 (names, labels and units);
// vllm:lora_adapter_loaded and sluice_sim_lora_loads_total are the
// simulator's own.
const (
	metricRunning       = "vllm:num_requests_running"
	metricWaiting       = "vllm:num_requests_waiting"
	metricKVUsage       = "vllm:kv_cache_usage_perc"
	metricCacheConfig   = "vllm:cache_config_info"
	metricLoRAInfo      = "vllm:lora_requests_info"
	metricPrefixHits    = "vllm:prefix_cache_hits_total"
	metricPrefixQueries = "vllm:prefix_cache_queries_total"
	metricPreemptions   = "vllm:num_preemptions_total"
	metricPromptTokens  = "vllm:prompt_tokens_total"
	metricGenTokens     = "vllm:generation_tokens_total"
	metricSuccess       = "vllm:request_success_total"
	metricTTFT          = "vllm:time_to_first_token_seconds"
	metricITL           = "vllm:inter_token_latency_seconds"
	metricE2E           = "vllm:e2e_request_latency_seconds"
	metricQueueTime     = "vllm:request_queue_time_seconds"
	metricAdapterLoaded = "vllm:lora_adapter_loaded"
	metricAdapterLoads  = "sluice_sim_lora_loads_total"
	engineLabelValue    = "0" // vLLM labels metrics by engine index; one engine per server
	finishReasonStop    = "stop"
	finishReasonLength  = "length"
)

// Histogram buckets of vLLM v1 (vllm/v1/metrics/loggers.py).
var (
	ttftBuckets = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
		2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0}
	itlBuckets = []float64{0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0,
		2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0}
	requestLatencyBuckets = []float64{0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
		40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0}
)

// requestRecorder receives per-request latencies as the engine produces
// tokens. The server calls it with its lock held.
type requestRecorder interface {
	// token records one output token: the first one's latency is TTFT
	// (including queue time, as vLLM's), the others' is inter-token latency.
	token(first bool, latency time.Duration)
	// finished records a completed request.
	finished(reason string, e2e, queued time.Duration)
}

type promRecorder struct {
	ttft, itl, e2e, queue prometheus.Observer
	success               *prometheus.CounterVec
}

func (p *promRecorder) token(first bool, latency time.Duration) {
	if first {
		p.ttft.Observe(latency.Seconds())
	} else {
		p.itl.Observe(latency.Seconds())
	}
}

func (p *promRecorder) finished(reason string, e2e, queued time.Duration) {
	p.success.WithLabelValues(reason).Inc()
	p.e2e.Observe(e2e.Seconds())
	p.queue.Observe(queued.Seconds())
}

// stateSnapshot reads the engine under the server's lock.
type stateSnapshot func() (engine.Stats, time.Time)

// stateCollector exports the engine's gauges and counters at scrape time,
// so they are exact whenever they are read and cost nothing in between.
type stateCollector struct {
	snapshot                                                         stateSnapshot
	model                                                            string
	cfg                                                              engine.Config
	running, waiting, kvUsage, cacheConfig, loraInfo, loaded         *prometheus.Desc
	prefixHits, prefixQueries, preemptions, promptTok, genTok, loads *prometheus.Desc
}

// Help texts of the state metrics, shared by the collector and MetricFamilies.
var stateHelp = map[string]string{
	metricRunning:       "Number of requests in model execution batches.",
	metricWaiting:       "Number of requests waiting to be processed.",
	metricKVUsage:       "KV-cache usage. 1 means 100 percent usage.",
	metricCacheConfig:   "Information of the LLMEngine CacheConfig",
	metricLoRAInfo:      "Running stats on lora requests.",
	metricAdapterLoaded: "1 while the LoRA adapter is resident in a GPU slot (simulator metric).",
	metricPrefixHits:    "Prefix cache hits, in terms of number of cached tokens.",
	metricPrefixQueries: "Prefix cache queries, in terms of number of queried tokens.",
	metricPreemptions:   "Cumulative number of preemption from the engine.",
	metricPromptTokens:  "Number of prefill tokens processed.",
	metricGenTokens:     "Number of generation tokens processed.",
	metricAdapterLoads:  "LoRA adapter loads caused by requests (simulator metric).",
}

// Label names of the state metrics.
var (
	modelLabels       = []string{"model_name", "engine"}
	cacheConfigLabels = []string{"block_size", "num_gpu_blocks", "enable_prefix_caching", "engine"}
	loraInfoLabels    = []string{"max_lora", "running_lora_adapters", "waiting_lora_adapters"}
	adapterLabels     = []string{"model_name", "lora_name"}
	modelNameLabels   = []string{"model_name"}
)

func newStateCollector(model string, cfg engine.Config, snapshot stateSnapshot) *stateCollector {
	d := func(name string, labels []string) *prometheus.Desc {
		return prometheus.NewDesc(name, stateHelp[name], labels, nil)
	}
	return &stateCollector{
		snapshot:      snapshot,
		model:         model,
		cfg:           cfg,
		running:       d(metricRunning, modelLabels),
		waiting:       d(metricWaiting, modelLabels),
		kvUsage:       d(metricKVUsage, modelLabels),
		cacheConfig:   d(metricCacheConfig, cacheConfigLabels),
		loraInfo:      d(metricLoRAInfo, loraInfoLabels),
		loaded:        d(metricAdapterLoaded, adapterLabels),
		prefixHits:    d(metricPrefixHits, modelLabels),
		prefixQueries: d(metricPrefixQueries, modelLabels),
		preemptions:   d(metricPreemptions, modelLabels),
		promptTok:     d(metricPromptTokens, modelLabels),
		genTok:        d(metricGenTokens, modelLabels),
		loads:         d(metricAdapterLoads, modelNameLabels),
	}
}

// Describe implements prometheus.Collector.
func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.running, c.waiting, c.kvUsage, c.cacheConfig, c.loraInfo, c.loaded,
		c.prefixHits, c.prefixQueries, c.preemptions, c.promptTok, c.genTok, c.loads} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	st, now := c.snapshot()
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	counter := func(d *prometheus.Desc, v uint64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), c.model, engineLabelValue)
	}
	gauge(c.running, float64(st.Running), c.model, engineLabelValue)
	gauge(c.waiting, float64(st.Waiting), c.model, engineLabelValue)
	gauge(c.kvUsage, st.KVUsage, c.model, engineLabelValue)
	gauge(c.cacheConfig, 1, strconv.Itoa(c.cfg.BlockSize), strconv.Itoa(c.cfg.NumGPUBlocks),
		pythonBool(!c.cfg.DisablePrefixCaching), engineLabelValue)
	if c.cfg.MaxLoRAs > 0 { // vLLM exports LoRA info only with LoRA enabled
		// The value is a timestamp, as vLLM's: readers take the newest series.
		gauge(c.loraInfo, float64(now.UnixNano())/1e9, strconv.Itoa(c.cfg.MaxLoRAs),
			strings.Join(st.RunningAdapters, ","), strings.Join(st.WaitingAdapters, ","))
		for _, a := range st.ResidentAdapters {
			gauge(c.loaded, 1, c.model, a)
		}
		ch <- prometheus.MustNewConstMetric(c.loads, prometheus.CounterValue, float64(st.AdapterLoads), c.model)
	}
	counter(c.prefixHits, st.PrefixHitTokens)
	counter(c.prefixQueries, st.PrefixQueryTokens)
	counter(c.preemptions, st.Preemptions)
	counter(c.promptTok, st.PromptTokens)
	counter(c.genTok, st.GenerationTokens)
}

func pythonBool(b bool) string {
	if b {
		return "True"
	}
	return "False"
}

// registerMetrics registers the server's metrics on reg and returns the
// recorder for per-request latencies.
func registerMetrics(reg prometheus.Registerer, model string, cfg engine.Config, snapshot stateSnapshot) (*promRecorder, error) {
	labels := prometheus.Labels{"model_name": model, "engine": engineLabelValue}
	hist := func(name, help string, buckets []float64) prometheus.Histogram {
		return prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets, ConstLabels: labels})
	}
	p := &promRecorder{}
	ttft := hist(metricTTFT, "Histogram of time to first token in seconds.", ttftBuckets)
	itl := hist(metricITL, "Histogram of inter-token latency in seconds.", itlBuckets)
	e2e := hist(metricE2E, "Histogram of e2e request latency in seconds.", requestLatencyBuckets)
	queue := hist(metricQueueTime, "Histogram of time spent in WAITING phase for request.", requestLatencyBuckets)
	p.ttft, p.itl, p.e2e, p.queue = ttft, itl, e2e, queue
	p.success = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: metricSuccess, Help: "Count of successfully processed requests.", ConstLabels: labels,
	}, []string{"finished_reason"})
	// Export both reasons from the start, so rates exist before the first request.
	p.success.WithLabelValues(finishReasonStop)
	p.success.WithLabelValues(finishReasonLength)
	for _, c := range []prometheus.Collector{ttft, itl, e2e, queue, p.success, newStateCollector(model, cfg, snapshot)} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return p, nil
}
