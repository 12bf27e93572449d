package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/flowcontrol"
	"github.com/sluice-gw/sluice/testbed/loadgen"
)

// Timeline is when a run's events happen, from the start of its load.
type Timeline struct {
	// Load is how long requests are issued; Rate how many per second
	// (Poisson).
	Load time.Duration
	Rate float64
	// FaultAt is when the case's Inject runs, ClearAt its Clear.
	FaultAt, ClearAt time.Duration
}

// The timelines of `make test` (seconds per case; they check outcomes, not
// timing) and of `make chaos` (long enough for the report's figures).
var (
	ShortTimeline = Timeline{Load: 4 * time.Second, Rate: 6, FaultAt: 1500 * time.Millisecond, ClearAt: 3 * time.Second}
	FullTimeline  = Timeline{Load: 30 * time.Second, Rate: 8, FaultAt: 10 * time.Second, ClearAt: 20 * time.Second}
)

// Bounds of every run: how long one answer may take before it counts as
// hung, and how long the EPP may take to show no queue and no reservation
// once the load is over.
const (
	requestTimeout = time.Minute
	drainTimeout   = 15 * time.Second
)

// The load: 20% Critical, 50% Standard, 30% Sheddable streamed chats from
// three tenants, 64 prompt and 32 output tokens, each request sent once (the
// report shows the raw answers; the soak's clients honour Retry-After).
const (
	mixYAML = `api: chat
stream: true
classes:
  - {name: critical, model: m, weight: 20, objective: critical, tenant: interactive, prompt_tokens: 64, output_tokens: 32}
  - {name: standard, model: m, weight: 50, objective: standard, tenant: apps, prompt_tokens: 64, output_tokens: 32}
  - {name: sheddable, model: m, weight: 30, objective: sheddable, tenant: batch, prompt_tokens: 64, output_tokens: 32}
`
	burstMixYAML = `api: chat
stream: true
classes:
  - {name: burst, model: m, objective: standard, tenant: burst, prompt_tokens: 64, output_tokens: 32}
`
	// holdMixYAML's answers are four times the load's: they hold their seats for about 2.5 s. Its tenant is the
	// burst's, so that a burst sent after it queues behind it in arrival order: as another tenant, the burst would
	// take its fair turn at the seats the holders wait for.
	holdMixYAML = `api: chat
stream: true
classes:
  - {name: hold, model: m, objective: standard, tenant: burst, prompt_tokens: 64, output_tokens: 128}
`
	criticalClass = "critical"
)

// Run is one case run in one mode: its stack and what the case did when.
// Inject and Clear run on the test goroutine and may block.
type Run struct {
	T     *testing.T
	Stack *Stack
	Timeline

	ctx    context.Context
	began  time.Time // wall clock, just before the load started
	faulty string
	leave  time.Time
	marks  map[string]time.Time
	bursts []*burst

	// set once the load is over: the load's start and its records
	started time.Time
	records []loadgen.Record
}

// Records are every attempt's record of the load. Valid in Check.
func (r *Run) Records() []loadgen.Record { return r.records }

// burst is extra traffic a case sends: n Standard requests at once.
type burst struct {
	disconnect bool
	done       chan *loadgen.Result
}

// Faulty names server i's endpoint as the faulty one: from now on traffic
// should leave it.
func (r *Run) Faulty(i int) {
	r.faulty = r.Stack.Servers[i].Addr
	r.leave = time.Now()
}

// Mark notes the instant of a named event (e.g. "kill").
func (r *Run) Mark(name string) { r.marks[name] = time.Now() }

// At is when a marked event happened, from the start of the load; -1 if it
// did not. Valid once the load is over (in Expect and Check).
func (r *Run) At(name string) time.Duration {
	t, ok := r.marks[name]
	if !ok {
		return -1
	}
	return t.Sub(r.started)
}

// Burst sends n Standard requests at once, beside the load. With
// disconnect, each client gives up after timeout (the request is then
// counted as disconnected, not hung); 0 is the usual bound.
func (r *Run) Burst(n int, timeout time.Duration, disconnect bool) {
	r.send(burstMixYAML, n, timeout, disconnect)
}

// Hold sends n Standard requests at once, beside the load, whose answers
// are long enough to keep the seats they take for seconds.
func (r *Run) Hold(n int) { r.send(holdMixYAML, n, 0, false) }

// send sends n requests of the classes (a mix in YAML) at once, beside the load (see Burst).
func (r *Run) send(classes string, n int, timeout time.Duration, disconnect bool) {
	if timeout == 0 {
		timeout = requestTimeout
	}
	mix, err := loadgen.ParseMix([]byte(classes))
	if err != nil {
		r.T.Fatal(err)
	}
	b := &burst{disconnect: disconnect, done: make(chan *loadgen.Result, 1)}
	r.bursts = append(r.bursts, b)
	cfg := loadgen.RunConfig{Target: r.Stack.Target, Mix: mix, Seed: uint64(len(r.bursts)) + 100, Mode: loadgen.ModeOpen,
		Arrival: loadgen.ArrivalConfig{Kind: loadgen.ArrivalConstant, Rate: 1000}, MaxRequests: n,
		RequestTimeout: timeout, Drain: requestTimeout}
	go func() {
		res, err := loadgen.Run(r.ctx, cfg)
		if err != nil {
			res = nil
		}
		b.done <- res
	}()
}

// RunCase runs c in mode against a fresh stack on tl and returns what the
// clients saw; with a Case.Baseline, the baseline runs first, on its own
// stack. The caller checks Result.Failures.
func RunCase(t *testing.T, c Case, mode Mode, tl Timeline, base StackOptions) Result {
	t.Helper()
	var baseline *Baseline
	var baselineRecords []loadgen.Record
	var baselineDecisions map[string]tracedDecision
	if c.Baseline != nil {
		baseline = &Baseline{Name: c.BaselineName, Target: c.BaselineTarget}
		if !t.Run("baseline", func(t *testing.T) {
			baselineRecords, baselineDecisions = runBaseline(t, c, mode, tl, base, baseline)
		}) {
			baseline.Failures = append(baseline.Failures, "the baseline run did not complete (see its subtest)")
		}
	}
	opts, s := startCaseStack(t, c, mode, base, "", c.Stack)
	ctx := t.Context()
	r := &Run{T: t, Stack: s, Timeline: tl, ctx: ctx, marks: map[string]time.Time{}}
	cfg := loadConfig(t, s, c, tl)
	logBefore := len(s.EPP.Output.String())
	done := make(chan *loadgen.Result, 1)
	r.began = time.Now()
	go func() {
		res, err := loadgen.Run(ctx, cfg)
		if err != nil {
			res = nil
		}
		done <- res
	}()

	at := func(d time.Duration) {
		if err := loadgen.Sleep(ctx, time.Until(r.began.Add(d))); err != nil {
			t.Fatal(err)
		}
	}
	faultAt := tl.FaultAt
	if c.FaultAt > 0 {
		faultAt = c.FaultAt
	}
	at(faultAt)
	r.Mark("fault")
	c.Inject(r)
	if c.Clear != nil {
		at(tl.ClearAt)
		r.Mark("clear")
		c.Clear(r)
	}
	main := <-done
	if main == nil {
		t.Fatal("the load did not run (invalid configuration)")
	}
	r.started = main.Started
	res := Result{Case: c.Name, Mode: mode, Fault: c.Fault, Faulty: r.faulty, Baseline: baseline, Marks: map[string]time.Duration{}}
	for name := range r.marks {
		res.Marks[name] = r.At(name)
	}
	from, to := r.collect(c, main, &res)
	if baseline != nil && baselineRecords != nil {
		baseline.measure(baselineRecords, from, to, c.Retry)
	}
	saveRecords(t, opts.Dir, main.Records)
	logBytes := len(s.EPP.Output.String()) - logBefore
	if res.Requests > 0 {
		res.EPPLogBytesPerRequest = float64(logBytes) / float64(res.Requests)
	}
	if err := s.WaitDrained(ctx, drainTimeout); err != nil {
		res.Leak = err.Error()
	}
	// Only a case with a baseline reads its traces back; every case keeps them.
	if decisions := keepDecisions(t, s, opts.Dir, baseline != nil); decisions != nil {
		res.Slowest = slowestCritical(main.Records, from, to, decisions, slowestShown)
		if baselineDecisions != nil {
			above, baseAbove := aboveSeats(main.Records, from, to, decisions), aboveSeats(baselineRecords, from, to, baselineDecisions)
			res.AboveSeats, baseline.AboveSeats = &above, &baseAbove
		}
	}
	r.records = main.Records
	if c.Check != nil {
		if err := c.Check(r); err != nil {
			res.CheckError = err.Error()
		}
	}
	return res
}

// loadConfig is the case's load against s: the same seed in every run, so a baseline run sends the same requests at
// the same instants.
func loadConfig(t *testing.T, s *Stack, c Case, tl Timeline) loadgen.RunConfig {
	mix, err := loadgen.ParseMix([]byte(mixYAML))
	if err != nil {
		t.Fatal(err)
	}
	cfg := loadgen.RunConfig{Target: s.Target, Mix: mix, Seed: 1, Mode: loadgen.ModeOpen,
		Arrival:  loadgen.ArrivalConfig{Kind: loadgen.ArrivalPoisson, Rate: tl.Rate},
		Duration: tl.Load + c.ExtraLoad, RequestTimeout: requestTimeout, Drain: requestTimeout}
	if c.Retry {
		// The drain covers the waits of a retry chain whose attempts are answered at once (429, 503).
		cfg.Retry = retryPolicy
		cfg.Drain += time.Duration(retryPolicy.MaxAttempts-1) * retryPolicy.MaxWait
	}
	return cfg
}

// saveRecords writes every attempt's record of a run's load into dir (RecordsFileName), beside the processes' logs, for
// a look at single requests after the run.
func saveRecords(t *testing.T, dir string, recs []loadgen.Record) {
	raw, err := json.Marshal(recs)
	if err == nil {
		err = os.WriteFile(filepath.Join(dir, RecordsFileName), raw, 0o644)
	}
	if err != nil {
		t.Errorf("saving the load's records: %v", err)
	}
}

// startCaseStack starts a stack for c in mode: base's options, its logs under base.Dir/<case>/<mode>[/sub], adjusted by
// adjust (nil: none), and waits for the EPP's first scrapes unless c.NoSettle.
func startCaseStack(t *testing.T, c Case, mode Mode, base StackOptions, sub string, adjust func(*StackOptions)) (StackOptions, *Stack) {
	t.Helper()
	opts := base
	opts.Mode = mode
	opts.Dir = filepath.Join(base.Dir, c.Name, string(mode), sub)
	if adjust != nil {
		adjust(&opts)
	}
	s := StartStack(t, opts)
	if !c.NoSettle {
		if err := s.WaitFresh(t.Context(), time.Minute); err != nil {
			t.Fatalf("before the load: %v", err)
		}
	}
	return opts, s
}

// runBaseline runs c's load with no fault on the stack c.Baseline makes of base and returns its records and its
// decision traces (nil when none was saved; what could be read of them otherwise), for b to be measured over the
// window the fault has in the case's run. The run must end as any: every request answered once with 200, or 429 or
// 503 with Retry-After, and nothing left in the EPP; b.Failures lists what did not.
func runBaseline(t *testing.T, c Case, mode Mode, tl Timeline, base StackOptions, b *Baseline) ([]loadgen.Record, map[string]tracedDecision) {
	opts, s := startCaseStack(t, c, mode, base, "baseline", c.Baseline)
	res, err := loadgen.Run(t.Context(), loadConfig(t, s, c, tl))
	if err != nil {
		t.Fatal(err)
	}
	saveRecords(t, opts.Dir, res.Records)
	b.Outcomes = map[Outcome]int{}
	if n := MissingFinals(res.Records); n > 0 {
		b.Outcomes[OutcomeLost] = n
	}
	for _, rec := range res.Records {
		if rec.Final {
			b.Outcomes[Classify(rec)]++
		}
	}
	if n := b.Outcomes[OutcomeLost] + b.Outcomes[OutcomeHung] + b.Outcomes[OutcomeOther]; n > 0 {
		b.Failures = append(b.Failures, fmt.Sprintf("the baseline run, with no fault, had %d answers other than 200, 429 and 503 with Retry-After: %v", n, b.Outcomes))
	}
	if err := s.WaitDrained(t.Context(), drainTimeout); err != nil {
		b.Failures = append(b.Failures, "after the baseline's load: "+err.Error())
	}
	return res.Records, keepDecisions(t, s, opts.Dir, true)
}

// keepDecisions saves the decision traces of s's live replicas into dir and, with read, reads them back keyed by
// request ID (nil when none was saved or without read). The traces explain; a replica whose trace cannot be had only
// leaves its requests unexplained, so its error is logged, not failed.
func keepDecisions(t *testing.T, s *Stack, dir string, read bool) map[string]tracedDecision {
	saved, err := s.SaveDecisions(t.Context())
	if err != nil {
		t.Logf("saving the decision traces: %v", err)
	}
	if !read || len(saved) == 0 {
		return nil
	}
	decisions, err := loadDecisions(dir, saved)
	if err != nil {
		t.Logf("reading the decision traces: %v", err)
	}
	return decisions
}

// collect classifies every final answer (the load's and the bursts') and
// measures the fault's window into res.
func (r *Run) collect(c Case, main *loadgen.Result, res *Result) (fault, end time.Duration) {
	expect := c.Expect
	if expect == nil {
		expect = Designed
	}
	res.Outcomes = map[Outcome]int{}
	res.Other = map[string]int{}
	all := main.Records
	classify := func(recs []loadgen.Record, disconnect bool) {
		missing := MissingFinals(recs)
		res.Outcomes[OutcomeLost] += missing
		res.Unexpected += missing
		for _, rec := range recs {
			if !rec.Final {
				continue
			}
			res.Requests++
			o := Classify(rec)
			if disconnect && o == OutcomeHung {
				o = OutcomeDisconnected
			}
			res.Outcomes[o]++
			if o == OutcomeOther {
				res.Other[otherKey(rec)]++
			}
			if o == OutcomeHung || o == OutcomeLost || o != OutcomeDisconnected && !expect(r, rec, o) {
				res.Unexpected++
				if len(res.Examples) < 5 {
					res.Examples = append(res.Examples, fmt.Sprintf("%s %s at %v: status %d %q", rec.Class, o, rec.Start.Round(time.Millisecond), rec.Status, rec.Error))
				}
			}
		}
	}
	classify(main.Records, false)
	for _, b := range r.bursts {
		br := <-b.done
		if br == nil {
			res.CheckError = "a burst did not run (invalid configuration)"
			continue
		}
		// The burst's times on the load's clock.
		offset := br.Started.Sub(main.Started)
		for i := range br.Records {
			br.Records[i].Start += offset
		}
		classify(br.Records, b.disconnect)
		all = append(all, br.Records...)
	}

	// The fault's window ends at its clear, or with the load for a fault that is never cleared or whose faulty
	// endpoint is named in Clear.
	fault, end = r.At("fault"), r.At("clear")
	if c.Clear == nil || r.leave.After(r.marks["clear"]) {
		end = main.Config.Duration
	}
	if r.faulty != "" {
		res.FaultAt = r.leave
		l := TrafficLeft(all, r.faulty, r.leave.Sub(r.started), end, c.ProbeGap, c.LeaveBySend)
		res.Leave = &l
		if (c.MustLeave || c.MustLeaveOnFull && r.Timeline == FullTimeline) && !l.Left {
			res.CheckError = fmt.Sprintf("traffic never left %s: it still got requests in the last part of the fault's window (%.0f%% of them)",
				r.faulty, 100*l.Share)
		}
	}
	res.CriticalBefore = p99(CriticalTTFT(main.Records, criticalClass, 0, fault))
	during := CriticalTTFT(main.Records, criticalClass, fault, end)
	res.CriticalDuringP50, res.CriticalDuring, res.CriticalDuringN = p50(during), p99(during), len(during)
	res.CriticalUnavailable = countUnavailable(main.Records, criticalClass, fault, end)
	if c.Retry {
		retries := RetriesIn(main.Records, criticalClass, fault, end)
		res.Retries = &retries
	}
	return fault, end
}

// measure sets b's Critical figures from its run's records over [from, to), the case run's fault window, and with
// retry what its clients' retries did.
func (b *Baseline) measure(recs []loadgen.Record, from, to time.Duration, retry bool) {
	window := CriticalTTFT(recs, criticalClass, from, to)
	b.CriticalP50, b.CriticalP99, b.CriticalN = p50(window), p99(window), len(window)
	b.CriticalUnavailable = countUnavailable(recs, criticalClass, from, to)
	if retry {
		retries := RetriesIn(recs, criticalClass, from, to)
		b.Retries = &retries
	}
}

// countUnavailable counts the requests of class first sent in [from, to) whose final answer was 503 with
// Retry-After: not in the TTFT figures, which count answered requests only, though each waits at least its
// Retry-After for an answer.
func countUnavailable(recs []loadgen.Record, class string, from, to time.Duration) int {
	n := 0
	for _, r := range recs {
		if r.Class == class && r.Final && Classify(r) == OutcomeUnavailable && firstSentIn(r, from, to) {
			n++
		}
	}
	return n
}

func p50(sorted []time.Duration) time.Duration { return loadgen.Percentile(sorted, 50) }
func p99(sorted []time.Duration) time.Duration { return loadgen.Percentile(sorted, 99) }

// otherKey groups answers of class other for the report: status and error
// code, or how the stream ended.
func otherKey(r loadgen.Record) string {
	if r.Status >= 200 && r.Status < 300 {
		return fmt.Sprintf("%d, stream cut", r.Status)
	}
	if code := ErrorCode(r); code != "" {
		return fmt.Sprintf("%d %s", r.Status, code)
	}
	return fmt.Sprintf("%d", r.Status)
}

// Designed accepts admission's designed answers: 200, 429 and 503 with
// Retry-After.
func Designed(_ *Run, _ loadgen.Record, o Outcome) bool {
	return o == OutcomeOK || o == OutcomeShed || o == OutcomeUnavailable
}

// Result is what the clients saw in one case run, and the checks made after
// it.
type Result struct {
	Case  string `json:"case"`
	Mode  Mode   `json:"mode"`
	Fault string `json:"fault"`
	// Requests counts the final answers (the load's and the bursts').
	Requests int             `json:"requests"`
	Outcomes map[Outcome]int `json:"outcomes"`
	// Other breaks the answers of class other down by status and code.
	Other map[string]int `json:"other,omitempty"`
	// Unexpected counts the answers the case does not allow (hung and lost
	// ones always), with a few Examples.
	Unexpected int      `json:"unexpected"`
	Examples   []string `json:"examples,omitempty"`
	// Faulty is the faulty endpoint ("" when the fault is not an
	// endpoint's) and Leave how traffic left it.
	Faulty string `json:"faulty,omitempty"`
	Leave  *Leave `json:"leave,omitempty"`
	// FaultAt is when the fault on Faulty began, by the wall clock: what
	// the processes' logs (an ejection's time) are read against.
	FaultAt time.Time `json:"fault_at,omitzero"`
	// Critical TTFT p99 before the fault and during it, its p50 during it,
	// and how many Critical requests succeeded during it.
	CriticalBefore    time.Duration `json:"critical_ttft_p99_before_ns"`
	CriticalDuring    time.Duration `json:"critical_ttft_p99_during_ns"`
	CriticalDuringP50 time.Duration `json:"critical_ttft_p50_during_ns"`
	CriticalDuringN   int           `json:"critical_during"`
	// CriticalUnavailable counts the Critical requests sent during the fault answered 503 with Retry-After.
	CriticalUnavailable int `json:"critical_unavailable_during,omitempty"`
	// Retries is what the clients' retries did for the requests first sent during the fault (Case.Retry); nil when
	// they do not retry.
	Retries *Retries `json:"retries_during,omitempty"`
	// Baseline is the same load's run with no fault (Case.Baseline); nil
	// without one.
	Baseline *Baseline `json:"baseline,omitempty"`
	// Slowest are the slowest Critical requests of the fault's window, each with its EPP decision, for a case with a
	// baseline.
	Slowest []SlowRequest `json:"slowest_critical,omitempty"`
	// AboveSeats counts the window's attempts placed above an endpoint's seats, for a case whose run and baseline
	// were traced.
	AboveSeats *AboveSeats `json:"above_seats,omitempty"`
	// Marks are the instants of the case's named events (Run.Mark: "fault",
	// "clear", "kill"), from the start of the load, as the load's records
	// (RecordsFileName) count time.
	Marks map[string]time.Duration `json:"marks_ns,omitempty"`
	// Leak describes a queue entry or reservation left in the EPP after
	// the load; CheckError a failed case check.
	Leak       string `json:"leak,omitempty"`
	CheckError string `json:"check_error,omitempty"`
	// EPPLogBytesPerRequest is the EPP's log output during the load per
	// request.
	EPPLogBytesPerRequest float64 `json:"epp_log_bytes_per_request"`
}

// Baseline is what a case's baseline run (Case.Baseline) measured over the window the fault has in the case's run.
type Baseline struct {
	// Name says what the baseline runs; Target is the most the case's Critical TTFT over the baseline's may be (0:
	// none).
	Name   string  `json:"name"`
	Target float64 `json:"target,omitempty"`
	// Outcomes are the baseline's final answers, which must all be designed ones.
	Outcomes map[Outcome]int `json:"outcomes"`
	// Critical TTFT p50 and p99 over the fault's window, how many
	// Critical requests succeeded in it, and how many were answered 503 with
	// Retry-After.
	CriticalP50         time.Duration `json:"critical_ttft_p50_ns"`
	CriticalP99         time.Duration `json:"critical_ttft_p99_ns"`
	CriticalN           int           `json:"critical"`
	CriticalUnavailable int           `json:"critical_unavailable,omitempty"`
	// Retries is what the clients' retries did over the window; it counts nothing when they do not retry.
	Retries *Retries `json:"retries,omitempty"`
	// AboveSeats is Result.AboveSeats over the same window of the baseline run.
	AboveSeats *AboveSeats `json:"above_seats,omitempty"`
	// Failures lists why the baseline run fails the case: answers other than designed ones, a leak, a run that did
	// not complete.
	Failures []string `json:"failures,omitempty"`
}

// Failures lists why the run fails: answers the case does not allow (hung
// and lost ones included), a leak, a failed case check.
func (r Result) Failures() []string {
	var out []string
	if r.Unexpected > 0 {
		out = append(out, fmt.Sprintf("%d unexpected answers, e.g. %v", r.Unexpected, r.Examples))
	}
	if r.Leak != "" {
		out = append(out, "leak: "+r.Leak)
	}
	if r.CheckError != "" {
		out = append(out, "check: "+r.CheckError)
	}
	if r.Baseline != nil {
		for _, f := range r.Baseline.Failures {
			out = append(out, "baseline: "+f)
		}
	}
	return out
}

// sortedKeys returns m's keys in order.
func sortedKeys(m map[string]int) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// Predicates cases build their Expect from.

// routedToFaulty accepts, besides designed answers, whatever the faulty
// endpoint itself answered (its 500s, a stream it cut by dying, the data
// plane's 502 when it refused the connection).
func routedToFaulty(r *Run, rec loadgen.Record, o Outcome) bool {
	return Designed(r, rec, o) || o == OutcomeOther && r.faulty != "" && RoutedTo(rec, r.faulty)
}

// eppUnavailable reports the data plane's answer when the EPP is gone
// (fail-closed).
func eppUnavailable(rec loadgen.Record) bool {
	return rec.Status == http.StatusInternalServerError && ErrorCode(rec) == "endpoint_picker_unavailable"
}

// cutAt reports a stream that was in flight at instant at and cut.
func cutAt(rec loadgen.Record, at time.Duration) bool {
	return rec.Status == http.StatusOK && rec.Error != "" && rec.Start <= at && rec.Start+rec.E2E >= at
}

// stalenessWindow is the target for traffic to leave a faulty endpoint: the
// default metrics staleness threshold of Sluice admission, after which an
// endpoint that stopped answering its scrapes gets nothing.
var stalenessWindow = flowcontrol.DefaultMetricsStalenessThreshold

// errBurstNotWithdrawn is a disconnect burst that left no trace in the EPP.
var errBurstNotWithdrawn = errors.New("no queued request was withdrawn (sluice_flowcontrol_cancelled_total did not grow): the burst never waited in the EPP")
