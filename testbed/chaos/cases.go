package chaos

import (
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/sluice-gw/sluice/outlier"
	"github.com/sluice-gw/sluice/testbed/loadgen"
	"github.com/sluice-gw/sluice/testbed/simulator"
)

// Case is one fault, injected mid-load.
type Case struct {
	Name string
	// Fault says what is done, for the report.
	Fault string
	// Modes are the modes the case applies to.
	Modes []Mode
	// Smoke puts the case's static-mode run in `make test`, which runs a
	// few cases to stay quick; `make chaos` runs them all.
	Smoke bool
	// Stack adjusts the stack (fail-open data plane, faults at start).
	Stack func(o *StackOptions)
	// NoSettle starts the load as soon as the EPP reports ready, before its
	// first scrapes.
	NoSettle bool
	// ExtraLoad lengthens the load beyond the timeline's, for a case whose
	// Clear takes long.
	ExtraLoad time.Duration
	// FaultAt, when set, replaces the timeline's: a fault whose timing is
	// part of the case.
	FaultAt time.Duration
	// Inject runs at FaultAt (the case's or the timeline's), Clear (if set) at the timeline's ClearAt
	// (or at once if Inject ran past it). Both run on the test goroutine.
	Inject, Clear func(r *Run)
	// Expect reports whether an answer is acceptable under the fault; nil
	// accepts admission's designed answers only. Hung and lost answers never
	// are.
	Expect func(r *Run, rec loadgen.Record, o Outcome) bool
	// MustLeave fails the case when requests still reached the faulty
	// endpoint at the end of the fault's window: the fault takes it out of
	// the pool, so the EPP must stop routing there (how fast is reported,
	// not asserted).
	MustLeave bool
	// MustLeaveOnFull is MustLeave on the full timeline only, for a fault the EPP learns of from the faulty
	// endpoint's own answers (sluice-outlier-filter ejects a server after 2-5 consecutive 5xx): the short
	// timeline's fault window (1.5 s at 6 requests/s) may hold too few of them, the full one's (10 s) many more.
	MustLeaveOnFull bool
	// ProbeGap, when set, tells probes apart in the time-to-leave (Leave.Probes): an attempt at least this long
	// after the previous one to the faulty endpoint, as an outlier detector lets one through when an ejection ends.
	ProbeGap time.Duration
	// LeaveBySend times the attempts to the faulty endpoint by when they were sent, not by their first byte back:
	// a slow endpoint's first byte comes seconds after it was routed there.
	LeaveBySend bool
	// Check makes the case's own checks once the load is over.
	Check func(r *Run) error
	// Baseline, when set, first runs the same load with no fault on a stack it adjusts (StackOptions as the
	// suite's, without the case's Stack): the report sets the Critical TTFT of the fault's window against the same
	// window of that run, measured minutes apart rather than in another session. BaselineName says what it runs
	// ("one EPP replica") and BaselineTarget is the most the ratio may be, for the report (0: none).
	Baseline       func(o *StackOptions)
	BaselineName   string
	BaselineTarget float64
	// Retry makes the load's clients retry a 429 or 503 that carries Retry-After, as an SDK that honours it does
	// (retryPolicy), in the case's run and its baseline alike: what such an answer costs a client is then measured
	// (Result.Retries) rather than assumed. Outcomes are each request's final answer.
	Retry bool
}

// retryPolicy is the clients' policy under Case.Retry: three attempts, each wait as Retry-After says up to 5 s.
var retryPolicy = loadgen.RetryPolicy{MaxAttempts: 3, MaxWait: 5 * time.Second}

// Fleet shape of every case: a10g-like servers with 4 slots each (three
// serve about 19 chat requests a second at the load's sizes), so a fault is
// visible at a load that leaves the machine's CPUs mostly idle.
var serverArgs = []string{"--profile=a10g", "--max-num-seqs=4"}

// sigtermLimit bounds an EPP's exit after SIGTERM: admission's shutdown
// grace (10s) and the gRPC servers' drain of responses in flight.
const sigtermLimit = 45 * time.Second

// Cases is the chaos suite: one fault at a time, mid-load.
func Cases() []Case {
	both := []Mode{Static, Kubernetes}
	kube := []Mode{Kubernetes}
	return []Case{
		{
			Name:   "server-killed",
			Smoke:  true,
			Fault:  "server 0 killed (SIGKILL) mid-stream; restarted, empty, at the clear",
			Modes:  both,
			Inject: func(r *Run) { r.Faulty(0); r.Stack.KillServer(0) },
			Clear:  func(r *Run) { r.Stack.RestartServer(0) },
			Expect: routedToFaulty,
		},
		{
			Name:   "metrics-hang",
			Fault:  "server 0's /metrics hangs (scrapes time out); it keeps serving",
			Modes:  both,
			Inject: func(r *Run) { r.Faulty(0); r.Stack.SetFaults(0, simulator.Faults{MetricsDelay: time.Hour}) },
			Clear:  func(r *Run) { r.Stack.SetFaults(0, simulator.Faults{}) },
		},
		{
			Name:  "server-500s",
			Fault: "server 0 answers every inference request 500; its metrics stay healthy",
			Modes: both,
			// The outlier filter ejects it after its 2nd 500 in a row (the other servers answer meanwhile), then
			// lets one request through when each ejection ends (1 s, 2 s, 3 s, ...): on the full timeline the last
			// of those comes before the window's last second. Those probes are told apart by the shortest
			// ejection's gap.
			MustLeaveOnFull: true,
			ProbeGap:        outlier.DefaultBaseEjectionTime,
			Inject:          func(r *Run) { r.Faulty(0); r.Stack.SetFaults(0, simulator.Faults{ErrorRate: 1}) },
			Clear:           func(r *Run) { r.Stack.SetFaults(0, simulator.Faults{}) },
			Expect:          routedToFaulty,
		},
		{
			Name:  "server-slow-10x",
			Fault: "server 0 serves 10x slower (every engine step); its metrics stay fresh",
			Modes: both,
			// The outlier filter ejects it once all its streams sent nothing for 4x its usual gap with no prompt sent
			// there to explain it (or 7 of the last 13 gaps of a stream of it were 4x its usual gap), then lets one
			// request through as each ejection ends (1 s, 2 s, ...), ejected again as its streams are still slow: told
			// apart by the shortest ejection's gap, on the full timeline.
			MustLeaveOnFull: true,
			ProbeGap:        outlier.DefaultBaseEjectionTime,
			LeaveBySend:     true,
			Inject:          func(r *Run) { r.Faulty(0); r.Stack.SetFaults(0, simulator.Faults{Slowdown: 10}) },
			Clear:           func(r *Run) { r.Stack.SetFaults(0, simulator.Faults{}) },
		},
		{
			Name: "pod-flapping",
			Fault: "server 0 flaps in and out of the pool every 300 ms (Kubernetes: pod Ready/NotReady; static: " +
				"endpoints file)",
			Modes: both,
			// No time-to-leave: the server comes back every other period, by design.
			Inject: func(r *Run) {
				in := false
				for time.Until(r.began.Add(r.ClearAt)) > 0 {
					r.Stack.SetInPool(0, in)
					in = !in
					if loadgen.Sleep(r.ctx, 300*time.Millisecond) != nil {
						return
					}
				}
			},
			Clear: func(r *Run) { r.Stack.SetInPool(0, true) },
		},
		{
			Name:      "pod-deleted",
			MustLeave: true,
			Fault:     "server 0 leaves the pool for good (Kubernetes: pod deleted; static: removed from the endpoints file); it finishes what it serves",
			Modes:     both,
			Inject:    func(r *Run) { r.Faulty(0); r.Stack.DeleteFromPool(0) },
		},
		{
			Name:      "pool-edited",
			MustLeave: true,
			Fault:     "the InferencePool's selector is edited to leave server 0 out; restored at the clear",
			Modes:     kube,
			Inject:    func(r *Run) { r.Faulty(0); r.Stack.SelectPool(func(i int) bool { return i != 0 }) },
			Clear:     func(r *Run) { r.Stack.SelectPool(nil) },
		},
		{
			Name:  "epp-sigterm",
			Smoke: true,
			Fault: "a burst of 60 Standard requests queues in the EPP, which then gets SIGTERM; restarted once it has exited",
			Modes: both,
			Inject: func(r *Run) {
				r.Burst(60, 0, false)
				if err := r.Stack.WaitQueued(r.ctx, 1, 30*time.Second); err != nil {
					r.T.Fatalf("no request queued in the EPP: %v", err)
				}
				r.Mark("term")
				if err := r.Stack.TerminateEPP(sigtermLimit); err != nil {
					r.T.Errorf("the EPP's exit after SIGTERM: %v", err)
				}
				r.Mark("down")
				r.Stack.RestartEPP()
			},
			// Queued requests are dispatched or answered 503 + Retry-After; requests that arrive once the EPP has
			// stopped serving, or that had not reached it yet (a burst request still connecting), get the data
			// plane's fail-closed 500 until it is back (one replica here). A request the EPP held and dropped would
			// be another 500 (its stream broken, not refused) and fails the case.
			Expect: func(r *Run, rec loadgen.Record, o Outcome) bool {
				term := r.At("term")
				return Designed(r, rec, o) || eppUnavailable(rec) && rec.Start >= term ||
					eppUnavailable(rec) && rec.Start+rec.E2E >= term && strings.Contains(rec.Error, "connect: connection refused")
			},
		},
		eppKilled(false),
		eppKilled(true),
		replicaKilled(2),
		replicaKilled(3),
		{
			Name:      "apiserver-restart",
			MustLeave: true,
			Fault:     "the API server is stopped; restarted at the clear, after which server 0's pod is deleted (resync)",
			Modes:     kube,
			ExtraLoad: 12 * time.Second, // the API server takes up to ~10 s to start again
			Inject:    func(r *Run) { r.Stack.opts.Cluster.API.Stop(r.T) },
			Clear: func(r *Run) {
				r.Stack.opts.Cluster.API.Restart(r.T)
				r.Faulty(0)
				r.Stack.DeleteFromPool(0)
			},
		},
		{
			Name:  "client-disconnects",
			Smoke: true,
			Fault: "20 Standard requests with long answers take the free seats; then 60 clients send Standard " +
				"requests at once and disconnect after 0.5 s, while queued",
			Modes: both,
			// A seat that frees while the burst waits goes to its head, whose client leaves a few ms later and frees
			// it for the next. None is then withdrawn. Holders whose answers outlast the wait keep every seat taken;
			// four waiting leave a margin while admission still learns the servers' seats.
			Inject: func(r *Run) {
				r.Hold(20)
				if err := r.Stack.WaitQueued(r.ctx, 4, 30*time.Second); err != nil {
					r.T.Fatalf("the long answers left seats free: fewer than four requests queued in the EPP: %v", err)
				}
				r.Burst(60, 500*time.Millisecond, true)
			},
			Check: func(r *Run) error {
				page, err := r.Stack.EPPMetrics(r.ctx)
				if err != nil {
					return err
				}
				if page.Sum("sluice_flowcontrol_cancelled_total") < 1 {
					return errBurstNotWithdrawn
				}
				return nil
			},
		},
		{
			Name: "epp-first-seconds",
			Fault: "the load starts as soon as the EPP reports ready, while every server's /metrics hangs; " +
				"the hang ends 1.5 s into the load (the first scrapes land)",
			Modes:    both,
			Smoke:    true,
			Stack:    func(o *StackOptions) { o.ServerArgs = append(o.ServerArgs, "--fault-metrics-delay=1h") },
			NoSettle: true,
			// First scrapes that land 1.5 s late, well within admission's warm-up (--flow-control-warmup, 5 s),
			// whatever the timeline.
			FaultAt: 1500 * time.Millisecond,
			Inject: func(r *Run) {
				for i := range r.Stack.Servers {
					r.Stack.SetFaults(i, simulator.Faults{})
				}
			},
			// Nothing that arrived before the first scrapes could land is turned away for want of metrics: no 503.
			Expect: func(r *Run, rec loadgen.Record, o Outcome) bool {
				return o == OutcomeOK || o == OutcomeShed || o == OutcomeUnavailable && rec.Start >= r.At("fault")
			},
		},
	}
}

// replicaKilled is one of replicas EPP replicas sharing the endpoints killed mid-load: the survivors take its
// endpoints over once its connection fails (or after --peer-timeout) and the data plane stops sending it streams once
// its connection fails. Streams in flight through the dead replica are cut. A request the dead replica held, or whose
// stream the data plane opened to it before its connection failed, gets the gateway's answer to a failed EPP, 503
// with Retry-After (examples/envoy/epp-failure-503.yaml), which the clients retry; nothing may hang or be lost. With
// three, the survivors still have a live peer when they adopt the dead one's endpoints.
func replicaKilled(replicas int) Case {
	name, of := "replica-killed", "two"
	if replicas != 2 {
		name, of = fmt.Sprintf("replica-killed-of-%d", replicas), fmt.Sprint(replicas)
	}
	return Case{
		Name:  name,
		Smoke: replicas == 2,
		Fault: "one of " + of + " EPP replicas sharing the endpoints (--peers) is killed (SIGKILL); the survivors take over its endpoints; " +
			"the data plane answers the dead replica's requests 503 with Retry-After (epp-failure-503.yaml), which the clients retry",
		Modes: []Mode{Static, Kubernetes},
		Stack: func(o *StackOptions) { o.EPPReplicas, o.EPPFailureRetryAfter = replicas, time.Second },
		// Issue 22: Critical within 1.5x of one replica during the takeover.
		Baseline:       func(o *StackOptions) { o.EPPReplicas = 1 },
		BaselineName:   "one EPP replica",
		BaselineTarget: 1.5,
		// A 503 from the dead replica is recovered by the client's retry, which the survivors serve.
		Retry: true,
		Inject: func(r *Run) {
			r.Mark("kill")
			r.Stack.KillReplica(replicas - 1)
		},
		Expect: func(r *Run, rec loadgen.Record, o Outcome) bool {
			return Designed(r, rec, o) || cutAt(rec, r.At("kill"))
		},
		// A retry sent a second or more after the kill reaches a survivor (the data plane stopped opening streams
		// to the dead replica within 130 ms of it): the survivor serves it or sheds it with 429, never 503.
		Check: func(r *Run) error { return retriedUnavailable(r.Records(), r.At("kill")+time.Second) },
	}
}

// retriedUnavailable fails when an attempt after the first, sent at or after since, was answered 503.
func retriedUnavailable(recs []loadgen.Record, since time.Duration) error {
	for _, rec := range recs {
		if rec.Attempt > 1 && rec.Start >= since && rec.Status == http.StatusServiceUnavailable {
			return fmt.Errorf("request %d's attempt %d, sent %v after the load began, was answered 503 by a surviving replica: %s",
				rec.Seq, rec.Attempt, rec.Start.Round(time.Millisecond), rec.Error)
		}
	}
	return nil
}

// eppKilled is the EPP killed with SIGKILL mid-load and restarted a second
// later, with the data plane failing open or closed.
func eppKilled(failOpen bool) Case {
	mode, during := "fail-closed", "the data plane answers 500"
	if failOpen {
		mode, during = "fail-open", "the data plane sends requests round-robin past it"
	}
	return Case{
		Name:  "epp-kill9-" + mode,
		Smoke: !failOpen,
		Fault: fmt.Sprintf("the EPP is killed (SIGKILL) and restarted after 1 s; meanwhile %s", during),
		Modes: []Mode{Static, Kubernetes},
		Stack: func(o *StackOptions) { o.FailOpen = failOpen },
		Inject: func(r *Run) {
			r.Mark("kill")
			r.Stack.KillEPP()
			if loadgen.Sleep(r.ctx, time.Second) != nil {
				return
			}
			r.Stack.RestartEPP()
		},
		// Streams in flight through the EPP are cut (their response passes through it); requests the EPP held or
		// gets while it is down get the data plane's 500 when it fails closed.
		Expect: func(r *Run, rec loadgen.Record, o Outcome) bool {
			kill := r.At("kill")
			return Designed(r, rec, o) || cutAt(rec, kill) || !failOpen && eppUnavailable(rec) && rec.Start+rec.E2E >= kill
		},
	}
}
