package virtualbench

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/sluice-gw/sluice/flowcontrol/replication"
	"github.com/sluice-gw/sluice/testbed/eventclock"
	"github.com/sluice-gw/sluice/testbed/loadgen"
	"github.com/sluice-gw/sluice/testbed/simulator/engine"
)

// request is one logical client request: its attempts share the spec.
// epoch is time zero of every run. It is fixed, so nothing in a run depends on when it ran.
var epoch = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

type request struct {
	spec      loadgen.RequestSpec
	scheduled time.Duration // when the arrival process (or the user) issued it
	first     time.Duration // start of attempt 1
	user      int           // closed-loop user, -1 in open loop
}

// attempt is one try of a request, from the client's send to its last byte.
type attempt struct {
	idx      int // position in run.attempts; the engine request's ID is idx+1
	req      *request
	n        int
	id       string // x-request-id
	start    time.Time
	deadline time.Time
	rec      loadgen.Record
	server   int // -1 until routed
	replica  int // the EPP replica its ext_proc stream went to
	ereq     *engine.Request
	chat     bool
	stream   bool
	usage    bool // stream_options.include_usage
	last     time.Time
	closed   bool // answered, timed out or cancelled
}

// run is the state of one Run. Everything happens on the goroutine that called Run.
type run struct {
	cfg      Config
	clk      *eventclock.Clock
	servers  []*server
	replicas *replicaSet // nil without an EPP
	// peerBytes counts the peer summaries' bytes the replicas sent (Router.PeerExchange).
	peerBytes int64
	gen       *loadgen.Generator
	arrivals  *loadgen.Arrivals

	attempts []*attempt // by idx; nil once closed
	records  []loadgen.Record
	rrNext   int

	issuing  bool
	issued   int
	inFlight int       // requests without a final record
	drainAt  time.Time // zero until issuing ends
	retries  map[*attempt]*eventclock.Event

	timeouts  []*attempt // by start time, for the timeout sweep
	sweep     *eventclock.Event
	finished  []*attempt // filled by the engine observer during Advance
	firstSeen []*attempt
	chunked   []*attempt // streams that sent a later chunk in the step (Config.EveryChunk)

	samples  []Sample
	interval Sample // counters since the last sample
	epp      EPPCost
	err      error
}

// Run runs cfg in virtual time and returns every attempt's record and the measurements. It is deterministic: the
// same Config yields byte-identical Records and Samples (Result.EPP and Result.Wall measure the machine). Every
// request ends in exactly one final record. The returned error reports an invalid Config or a failure of the code
// under test (an EndpointPickerConfig that does not load, a scrape the EPP cannot read).
func Run(cfg Config) (*Result, error) {
	wallStart := time.Now()
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, fmt.Errorf("invalid virtual benchmark config: %w", err)
	}
	r := &run{cfg: cfg, clk: eventclock.New(epoch), gen: loadgen.NewGenerator(cfg.Mix, cfg.Seed), retries: map[*attempt]*eventclock.Event{}}
	observer := engine.ObserverFunc(r.stepDone)
	for i, sc := range cfg.Servers {
		s, err := newServer(i, sc, &cfg, observer)
		if err != nil {
			return nil, err
		}
		r.servers = append(r.servers, s)
	}
	if cfg.Router.Kind == EPP {
		if err := r.startPicker(); err != nil {
			return nil, err
		}
		defer r.replicas.Close()
	}
	for _, b := range cfg.Blips {
		s := r.servers[b.Server]
		s.blips = append(s.blips, epoch.Add(b.At))
		slices.SortFunc(s.blips, time.Time.Compare)
	}
	for _, sd := range cfg.Slowdowns {
		r.clk.At(epoch.Add(sd.At), func() { r.servers[sd.Server].eng.SetSlowdown(sd.Factor) })
	}
	r.startLoad()
	r.every(cfg.SampleInterval, cfg.SampleInterval, r.sample)
	for r.err == nil && (r.issuing || r.inFlight > 0) {
		if !r.drainAt.IsZero() {
			if next, ok := r.clk.Peek(); !ok || !next.Before(r.drainAt) {
				r.clk.AdvanceTo(r.drainAt)
				r.cancelAll("context canceled")
				break
			}
		}
		e := r.clk.Next()
		if e == nil {
			r.err = errors.New("virtual benchmark: the event queue ran dry with requests in flight")
			break
		}
		e.Fire()
		if r.replicas != nil && r.err == nil {
			r.err = r.replicas.Err()
		}
	}
	if r.err == nil && r.replicas != nil {
		// Every request the EPP saw has ended there too, and nothing waits in admission.
		if n, q := r.replicas.InFlight(), r.replicas.AdmissionQueue(); n != 0 || q != [len(q)]int{} {
			r.err = fmt.Errorf("virtual benchmark: the EPP still holds %d requests (admission queues %v) after the last answer", n, q)
		}
	}
	if r.err != nil {
		return nil, r.err
	}
	res := &Result{Records: r.records, Samples: r.samples, EPP: r.epp, Events: r.clk.Fired()}
	if r.replicas != nil {
		res.ReplicaRequests = r.replicas.routed
	}
	res.PeerBytes = r.peerBytes
	for _, rec := range r.records {
		res.Virtual = max(res.Virtual, rec.Start+rec.E2E)
	}
	slos := map[string]loadgen.SLO{}
	for _, c := range cfg.Mix.Classes {
		slos[c.Name] = c.SLO
	}
	res.Summary = loadgen.Summarize(r.records, loadgen.SummaryOptions{Duration: res.Virtual, SLOs: slos, DefaultSLO: cfg.SLO})
	res.Fleet.Dispatched = make([]uint64, len(r.servers))
	for i, s := range r.servers {
		st := s.eng.Stats()
		res.Fleet.PrefixQueryTokens += st.PrefixQueryTokens
		res.Fleet.PrefixHitTokens += st.PrefixHitTokens
		res.Fleet.AdapterLoads += st.AdapterLoads
		res.Fleet.Preemptions += st.Preemptions
		res.Fleet.Dispatched[i] = s.sent
	}
	res.Wall = time.Since(wallStart)
	return res, nil
}

// now is the virtual time since the start.
func (r *run) now() time.Duration { return r.clk.Now().Sub(epoch) }

// every runs f at first, then every period, until the run ends.
func (r *run) every(first, period time.Duration, f func()) {
	var tick func()
	tick = func() {
		f()
		r.clk.At(r.clk.Now().Add(period), tick)
	}
	r.clk.At(epoch.Add(first), tick)
}

// startPicker builds the EPP's replicas and their scrape and snapshot ticks: every replica scrapes its servers (all,
// or those it owns) at t=0 and every ScrapeInterval (the data layer starts every endpoint's poller at once in static
// mode, and the replicas are taken to start together); admission takes its snapshots half an interval after the
// scrapes, the mean age of the metrics it reads in a real EPP, whose ticker is independent.
func (r *run) startPicker() error {
	pods := make([]string, len(r.servers))
	for i, s := range r.servers {
		pods[i] = s.pod
	}
	rt := r.cfg.Router
	servers := replicaServers(pods, rt.Replicas)
	var views []*replication.View
	if rt.Ownership {
		var heartbeat func(time.Time)
		views, heartbeat = replicaViews(rt.Replicas)
		r.every(0, replication.DefaultProbeInterval, func() { heartbeat(r.clk.Now()) })
	}
	var exchanges []*replication.Exchange
	if rt.PeerExchange {
		exchanges = make([]*replication.Exchange, rt.Replicas)
		for k := range exchanges {
			exchanges[k] = replication.NewExchange(replicaName(k), replication.DefaultTimeout)
		}
	}
	opts := rt.AdmissionOptions
	opts.SnapshotInterval = r.cfg.ScrapeInterval
	pickers := make([]*inProcessEPP, 0, rt.Replicas)
	for k := range rt.Replicas {
		eps := make([]eppEndpoint, len(servers[k]))
		for j, i := range servers[k] {
			s := r.servers[i]
			eps[j] = eppEndpoint{Name: s.pod, Address: "127.0.0.1", Port: strings.TrimPrefix(s.name, "127.0.0.1:")}
		}
		o := eppOptions{
			Config: rt.EndpointPickerConfig, Admission: rt.Admission, AdmissionOptions: opts, Endpoints: eps,
			Objectives: r.cfg.Objectives, Clock: r.clk, Seed: replicaSeed(r.cfg.Seed, k),
		}
		if views != nil {
			o.Ownership = views[k]
		}
		if exchanges != nil {
			o.Peers = exchanges[k]
		}
		p, err := newInProcessEPP(o)
		if err != nil {
			for _, q := range pickers {
				q.Close()
			}
			return err
		}
		pickers = append(pickers, p)
	}
	r.replicas = newReplicaSet(pickers, servers, rt.Balance, r.cfg.Seed)
	// A timer of the code under test (a queue timeout in admission) may decide requests: continue them at once.
	r.clk.AfterCallback = func() {
		for _, p := range pickers {
			r.pickerCall(p, p.Resume)
		}
	}
	if exchanges != nil {
		r.every(0, replication.DefaultExchangeInterval, r.exchangeSummaries)
	}
	r.every(0, r.cfg.ScrapeInterval, r.scrape)
	// At time 0 the EPP has scraped every server and taken a snapshot, as in the real benchmark, which waits for
	// the EPP's first scrapes before it starts the load.
	r.clk.At(epoch, r.syncAdmission)
	r.every(r.cfg.ScrapeInterval/2, r.cfg.ScrapeInterval, r.syncAdmission)
	return nil
}

func (r *run) syncAdmission() {
	for k, p := range r.replicas.eps {
		var err error
		r.pickerCall(p, func() { err = p.SyncAdmission() })
		if err != nil && r.err == nil {
			r.err = fmt.Errorf("admission snapshot of EPP replica %d: %w", k, err)
		}
	}
}

// fail keeps the run's first error.
func (r *run) fail(err error) {
	if r.err == nil {
		r.err = err
	}
}

// exchangeSummaries sends every replica's summary to every other, in its wire form, arriving PeerDelay later.
func (r *run) exchangeSummaries() {
	for k, p := range r.replicas.eps {
		var wire []byte
		var err error
		r.pickerCall(p, func() { wire, err = p.PeerSummary() })
		if err != nil {
			r.fail(fmt.Errorf("EPP replica %d's peer summary: %w", k, err))
			return
		}
		for j, q := range r.replicas.eps {
			if j == k {
				continue
			}
			r.peerBytes += int64(len(wire))
			r.clk.At(r.clk.Now().Add(PeerDelay), func() {
				r.pickerCall(q, func() { err = q.HearPeer(wire) })
				if err != nil {
					r.fail(fmt.Errorf("EPP replica %d hearing replica %d: %w", j, k, err))
				}
			})
		}
	}
}

func (r *run) scrape() {
	families := make([]map[string]*dto.MetricFamily, len(r.servers))
	for i, s := range r.servers {
		families[i] = s.families(r.clk.Now())
	}
	for k, p := range r.replicas.eps {
		for j, i := range r.replicas.servers[k] {
			var err error
			wall, _ := r.eppTime(p, func() { err = p.Scrape(j, families[i]) })
			r.epp.Scraping += wall
			r.epp.Scrapes++
			if err != nil {
				r.err = fmt.Errorf("scraping server %d: %w", i, err)
				return
			}
		}
	}
}

// startLoad schedules the first arrivals (open loop) or starts the users (closed loop).
func (r *run) startLoad() {
	r.issuing = true
	if r.cfg.Mode == loadgen.ModeClosed {
		r.clk.At(epoch, func() {
			for u := range r.cfg.Users {
				r.issueClosed(u)
			}
		})
		return
	}
	r.arrivals, _ = loadgen.NewArrivals(r.cfg.Arrival, r.cfg.Seed) // validated
	r.nextArrival()
}

// nextArrival schedules the next open-loop arrival, or ends issuing, as loadgen's runOpen does.
func (r *run) nextArrival() {
	if r.cfg.MaxRequests > 0 && r.issued >= r.cfg.MaxRequests {
		r.stopIssuing()
		return
	}
	at := r.arrivals.Next()
	if r.cfg.Duration > 0 && at >= r.cfg.Duration {
		r.stopIssuing()
		return
	}
	r.issued++
	r.clk.At(epoch.Add(at), func() {
		spec := r.gen.Next()
		if r.cfg.MaxInFlight > 0 && r.inFlight >= r.cfg.MaxInFlight {
			rec := recordFor(spec, at, r.now(), 1)
			rec.Final = true
			rec.Error = "dropped by the load generator: max in-flight requests reached"
			r.records = append(r.records, rec)
		} else {
			r.issue(spec, at, -1)
		}
		r.nextArrival()
	})
}

// issueClosed makes user u send its next request, unless issuing is over.
func (r *run) issueClosed(u int) {
	if !r.issuing {
		return
	}
	if (r.cfg.Duration > 0 && r.now() >= r.cfg.Duration) || (r.cfg.MaxRequests > 0 && r.issued >= r.cfg.MaxRequests) {
		r.stopIssuing()
		return
	}
	r.issued++
	r.issue(r.gen.Next(), r.now(), u)
}

func (r *run) stopIssuing() {
	if !r.issuing {
		return
	}
	r.issuing = false
	// The drain starts when issuing stops: at Duration, or after the last request when only MaxRequests is set.
	end := r.clk.Now()
	if r.cfg.Duration > 0 {
		end = epoch.Add(r.cfg.Duration)
	}
	r.drainAt = end.Add(r.cfg.Drain)
}

func (r *run) issue(spec loadgen.RequestSpec, scheduled time.Duration, user int) {
	r.inFlight++
	req := &request{spec: spec, scheduled: scheduled, first: r.now(), user: user}
	r.startAttempt(req, 1)
}

func recordFor(spec loadgen.RequestSpec, scheduled, start time.Duration, n int) loadgen.Record {
	return loadgen.Record{
		Seq: spec.Seq, Attempt: n, Class: spec.Class, Model: spec.Model, Stream: spec.Stream,
		PrefixGroup: spec.PrefixGroup, ChatID: spec.ChatID, Turn: spec.Turn,
		PromptTokens: spec.PromptTokens, MaxTokens: spec.MaxTokens, Scheduled: scheduled, Start: start,
	}
}

// startAttempt sends attempt n of req: to the next server (round-robin) or through the EPP.
func (r *run) startAttempt(req *request, n int) {
	spec := req.spec
	a := &attempt{idx: len(r.attempts), req: req, n: n, id: fmt.Sprintf("vb-%d-%d", spec.Seq, n), start: r.clk.Now(), server: -1,
		chat: spec.API != loadgen.APICompletions, stream: spec.Stream}
	a.deadline = a.start.Add(r.cfg.RequestTimeout)
	a.rec = recordFor(spec, req.scheduled, r.now(), n)
	a.rec.SinceFirstAttempt = r.now() - req.first
	a.usage = spec.Stream // loadgen asks for the usage chunk on every stream
	r.attempts = append(r.attempts, a)
	r.timeouts = append(r.timeouts, a)
	r.armSweep()
	if r.replicas == nil {
		s := r.rrNext % len(r.servers)
		r.rrNext++
		r.dispatch(a, s, spec.Body)
		return
	}
	headers := map[string]string{
		":method": http.MethodPost, ":path": spec.API.Path(), ":authority": "127.0.0.1", ":scheme": "http",
		"content-type": "application/json",
	}
	if spec.Stream {
		headers["accept"] = "text/event-stream"
	}
	for k, v := range spec.Headers {
		headers[strings.ToLower(k)] = v
	}
	r.epp.Requests++
	a.replica = r.replicas.pick()
	p := r.replicas.eps[a.replica]
	r.pickerCall(p, func() {
		p.Route(eppRequest{ID: a.id, Headers: headers, Body: spec.Body}, func(res eppAnswer) {
			// The answer may come from inside another picker call: act on it as the loop's next event.
			r.clk.At(r.clk.Now(), func() { r.routed(a, res) })
		})
	})
}

// routed acts on the EPP's answer for a.
func (r *run) routed(a *attempt, res eppAnswer) {
	switch {
	case a.closed:
		if res.Endpoint >= 0 { // routed after the client gave up: the response is never read
			p := r.eppOf(a)
			r.pickerCall(p, func() { p.ResponseComplete(a.id, nil) })
		}
	case res.Endpoint < 0:
		r.interval.Shed++
		a.rec.Status = res.Status
		a.rec.Error = fmt.Sprintf("HTTP %d: %s", res.Status, excerpt(res.Message))
		a.rec.RetryAfter, a.rec.RetryAfterSet = res.RetryAfter, res.RetryAfterSet
		r.finish(a)
	default:
		r.dispatch(a, r.replicas.server(a.replica, res.Endpoint), res.Body)
	}
}

// excerpt is what loadgen keeps of an error body: its first 512 bytes, trimmed.
func excerpt(msg string) string {
	if len(msg) > 512 {
		msg = msg[:512]
	}
	return strings.TrimSpace(msg)
}

// eppOf is the EPP replica that routed a.
func (r *run) eppOf(a *attempt) *inProcessEPP { return r.replicas.eps[a.replica] }

// pickerCall runs f, calls into p on the request path, and counts its wall and CPU time as routing.
func (r *run) pickerCall(p *inProcessEPP, f func()) {
	wall, cpu := r.eppTime(p, f)
	r.epp.Routing += wall
	r.epp.RoutingCPU += cpu
}

// eppTime returns the wall and process CPU time f, calls into p, took, less the time p waited for goroutines plugin
// hooks started (see EPPCost.HookWait), which it adds to r.epp.HookWait.
func (r *run) eppTime(p *inProcessEPP, f func()) (wall, cpu time.Duration) {
	h := p.hooks
	start, startCPU, waited, waitedCPU := time.Now(), processCPU(), h.waited, h.waitedCPU
	f()
	wait := h.waited - waited
	r.epp.HookWait += wait
	return time.Since(start) - wait, processCPU() - startCPU - (h.waitedCPU - waitedCPU)
}

// dispatch hands a to server si, which accepts it into its engine or answers an error at once.
func (r *run) dispatch(a *attempt, si int, body []byte) {
	s := r.servers[si]
	a.server = si
	a.rec.Endpoint = s.name
	s.sent++
	r.interval.Dispatched++
	var ereq *engine.Request
	var herr *httpError
	if len(s.blips) > 0 && !r.clk.Now().Before(s.blips[0]) {
		s.blips = s.blips[1:]
		herr = &httpError{status: http.StatusInternalServerError, message: "injected blip"}
	} else {
		ereq, herr = s.accept(r.clk.Now(), body, a.chat, uint64(a.idx)+1)
	}
	if herr != nil {
		// The answer is a JSON error; loadgen keeps an excerpt of its body.
		if r.replicas != nil {
			p := r.eppOf(a)
			r.pickerCall(p, func() {
				p.ResponseHeader(a.id, map[string]string{":status": strconv.Itoa(herr.status), "content-type": "application/json"})
				p.ResponseComplete(a.id, errorBody(herr))
			})
		}
		a.rec.Status = herr.status
		a.rec.Error = fmt.Sprintf("HTTP %d: %s", herr.status, excerpt(string(errorBody(herr))))
		r.finish(a)
		return
	}
	a.ereq = ereq
	r.wake(s)
}

// wake makes sure server s advances when its engine's next event comes.
func (r *run) wake(s *server) {
	next, ok := s.eng.NextEvent()
	if !ok || (s.step != nil && !next.Before(s.stepAt)) {
		return
	}
	if s.step != nil {
		s.step.Cancel()
	}
	s.stepAt = next
	s.step = r.clk.At(next, func() {
		s.step = nil
		s.eng.Advance(r.clk.Now())
		r.afterStep()
		r.wake(s)
	})
}

// stepDone is every engine's observer: it runs inside Advance and only notes what the step produced.
func (r *run) stepDone(out *engine.StepOutput) {
	for _, er := range out.Emitted {
		a := r.attempts[er.ID-1]
		if a == nil {
			continue
		}
		if er.Generated() == 1 {
			// The simulator's x-sim-* headers, which the client reads with the response's headers.
			a.rec.ServerQueue, a.rec.ServerTTFT = er.ScheduledAt().Sub(er.Arrival()), out.End.Sub(er.Arrival())
			if a.stream {
				a.rec.TTFT = out.End.Sub(a.start)
				r.firstSeen = append(r.firstSeen, a)
			}
		} else if a.stream {
			if !r.cfg.DiscardITL {
				a.rec.ITL = append(a.rec.ITL, out.End.Sub(a.last))
			}
			if r.cfg.EveryChunk && !er.Done() {
				r.chunked = append(r.chunked, a)
			}
		}
		a.last = out.End
		if er.Done() {
			r.finished = append(r.finished, a)
		}
	}
}

// streamHeaders and jsonHeaders are the response headers of a simulated server's answers.
var (
	streamHeaders = map[string]string{":status": "200", "content-type": "text/event-stream; charset=utf-8"}
	jsonHeaders   = map[string]string{":status": "200", "content-type": "application/json"}
)

// afterStep delivers what a step produced: response headers at a stream's first token, and whole answers.
func (r *run) afterStep() {
	if r.replicas != nil {
		for _, a := range r.firstSeen {
			p := r.eppOf(a)
			r.pickerCall(p, func() {
				p.ResponseHeader(a.id, streamHeaders)
				p.ResponseChunk(a.id)
			})
		}
	}
	clear(r.firstSeen)
	r.firstSeen = r.firstSeen[:0]
	for i, a := range r.chunked {
		r.chunked[i] = nil
		if r.replicas != nil {
			p := r.eppOf(a)
			r.pickerCall(p, func() { p.ResponseChunk(a.id) })
		}
	}
	r.chunked = r.chunked[:0]
	for i, a := range r.finished {
		r.finished[i] = nil
		r.interval.Completed++
		if r.replicas != nil {
			p := r.eppOf(a)
			r.pickerCall(p, func() {
				if !a.stream {
					p.ResponseHeader(a.id, jsonHeaders)
				}
				p.ResponseComplete(a.id, lastChunk(a.ereq, a.stream, a.usage))
			})
		}
		a.rec.Status = http.StatusOK
		a.rec.OutputTokens = a.ereq.Generated()
		if !a.stream {
			a.rec.TTFT = r.clk.Now().Sub(a.start)
		}
		r.finish(a)
	}
	r.finished = r.finished[:0]
}

// finish ends attempt a (its record filled but for E2E): it becomes final, or a retry is scheduled after its
// Retry-After, as loadgen's runner decides.
func (r *run) finish(a *attempt) {
	a.closed = true
	r.attempts[a.idx] = nil
	a.rec.E2E = r.clk.Now().Sub(a.start)
	if a.rec.OK() || a.n >= r.cfg.Retry.MaxAttempts || !a.rec.RetryAfterSet ||
		(a.rec.Status != http.StatusTooManyRequests && a.rec.Status != http.StatusServiceUnavailable) {
		r.final(a.req, a.rec)
		return
	}
	at := r.clk.Now().Add(min(a.rec.RetryAfter, r.cfg.Retry.MaxWait))
	if !r.drainAt.IsZero() && !at.Before(r.drainAt) {
		r.final(a.req, a.rec) // the wait would be cut by the drain deadline
		return
	}
	r.retries[a] = r.clk.At(at, func() {
		delete(r.retries, a)
		r.records = append(r.records, a.rec)
		r.startAttempt(a.req, a.n+1)
	})
}

// final records req's last attempt; a closed-loop user sends its next request.
func (r *run) final(req *request, rec loadgen.Record) {
	rec.Final = true
	r.records = append(r.records, rec)
	r.inFlight--
	if req.user >= 0 {
		user := req.user
		r.clk.At(r.clk.Now(), func() { r.issueClosed(user) })
	}
}

// armSweep schedules the timeout sweep at the earliest deadline of an open attempt.
func (r *run) armSweep() {
	if r.sweep != nil {
		return
	}
	for len(r.timeouts) > 0 && r.timeouts[0].closed {
		r.timeouts[0] = nil
		r.timeouts = r.timeouts[1:]
	}
	if len(r.timeouts) == 0 {
		return
	}
	r.sweep = r.clk.At(r.timeouts[0].deadline, func() {
		r.sweep = nil
		for len(r.timeouts) > 0 && !r.timeouts[0].deadline.After(r.clk.Now()) {
			a := r.timeouts[0]
			r.timeouts[0] = nil
			r.timeouts = r.timeouts[1:]
			if !a.closed {
				r.abort(a, "context deadline exceeded")
			}
		}
		r.armSweep()
	})
}

// abort is the client giving up on a (RequestTimeout, or the end of the drain): the server stops generating, the
// EPP sees the disconnect, and the record says what the client saw.
func (r *run) abort(a *attempt, why string) {
	if a.ereq != nil {
		s := r.servers[a.server]
		s.eng.Cancel(a.ereq)
		r.wake(s)
	}
	if a.stream && a.rec.TTFT > 0 {
		a.rec.Status, a.rec.Error = http.StatusOK, "stream broken: "+why
	} else {
		a.rec.Status, a.rec.Error = 0, why
	}
	r.finish(a)
	if r.replicas != nil {
		p := r.eppOf(a)
		r.pickerCall(p, func() { p.Cancel(a.id) })
	}
}

// cancelAll ends the drain: every open attempt is aborted and every pending retry's last attempt becomes final.
func (r *run) cancelAll(why string) {
	for _, a := range r.attempts {
		if a != nil && !a.closed {
			r.abort(a, why)
		}
	}
	waiting := make([]*attempt, 0, len(r.retries))
	for a, ev := range r.retries {
		ev.Cancel()
		waiting = append(waiting, a)
	}
	slices.SortFunc(waiting, func(x, y *attempt) int { return x.idx - y.idx })
	for _, a := range waiting {
		delete(r.retries, a)
		r.final(a.req, a.rec)
	}
	r.issuing = false
}

// sample appends a Sample of the current state and the interval's counters.
func (r *run) sample() {
	smp := r.interval
	r.interval = Sample{}
	smp.At = r.now()
	smp.InFlight = r.inFlight
	if r.replicas != nil {
		smp.Queued = r.replicas.AdmissionQueue()
	}
	if r.cfg.ServerSeries {
		smp.ServerWaiting = make([]int, len(r.servers))
		smp.ServerRunning = make([]int, len(r.servers))
	}
	for i, s := range r.servers {
		st := s.eng.Stats()
		smp.Waiting += st.Waiting
		smp.Running += st.Running
		smp.MaxWaiting = max(smp.MaxWaiting, st.Waiting)
		if r.cfg.ServerSeries {
			smp.ServerWaiting[i], smp.ServerRunning[i] = st.Waiting, st.Running
		}
	}
	r.samples = append(r.samples, smp)
}
