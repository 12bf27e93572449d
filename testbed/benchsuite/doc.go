// Package benchsuite is Sluice's benchmark suite: declarative scenarios, each
// run against three contenders on the same fleet in the same session, and a
// report whose every figure is a ratio computed within that session.
//
// # Pieces
//
//   - Scenario files (LoadScenario, LoadScenarios): one YAML file per
//     scenario, bench/scenarios/<name>/scenario.yaml, with the files it
//     names beside it. The format is documented on ScenarioFile. A Scenario
//     is plain data (fleet string, parsed loadgen.Mix, arrival process,
//     duration, seed, retry policy, objectives bytes) so any engine can run
//     it.
//   - Contenders: round-robin (the data plane with no EPP), upstream-default
//     (upstream v1.5.0's default scheduling profile in the Sluice EPP binary)
//     and sluice (Sluice's profile and admission policy), plus any extras a
//     scenario declares. A Contender is a router kind, EndpointPickerConfig
//     bytes and flow-control policy bytes.
//   - Engine runs one scenario against one contender and returns a
//     RunResult: every loadgen.Record, the summary, fleet and EPP counters and
//     queue-depth samples. RealTime is the engine of real processes on
//     loopback; Virtual runs the same scenario as a deterministic
//     discrete-event simulation (package virtualbench) in seconds. An engine
//     that cannot run a contender answers SkippedError: the suite records
//     the reason, and a skipped run is not a failure.
//   - RunScale is the scale study (virtual time only): round-robin,
//     upstream's default and Sluice on mixed fleets of growing size at the
//     same load per server, reporting routing quality and the EPP's cost per
//     decision.
//   - Figures, ratios and targets (Figures, Ratio, Target.Evaluate) are pure
//     functions of RunResults. WriteReport renders Markdown and WritePlots
//     SVG and PNG charts from a SuiteResult.
//   - Suite runs scenarios one after the other, writes the raw JSON of every
//     run as it finishes, and reports progress. A scenario with interleave
//     runs its contenders in one load instead (InterleavingEngine: RealTime
//     starts every contender's processes at once and deals the requests among
//     them in turns), so load swings on a shared machine hit them alike.
//   - CompareRuns compares two suites' output folders figure by figure (the
//     regression rule "no figure worse by more than 5%" is across two runs,
//     before and after a change): bench --compare.
//
// # Invariants
//
//   - Every figure of a report compares runs of the same session: ratios
//     never mix runs of different Suite.Run calls. CompareRuns, which reads
//     two sessions, reports moves of a figure, not ratios between contenders.
//   - A virtual run is deterministic: the same scenario and contender give
//     the same records, samples and counters (only wall-clock costs vary).
//   - Every real-time run gets a fresh fleet: a fleet that served the same
//     prompts before would answer them from its prefix cache and favour
//     whoever runs later.
//   - Every process RealTime starts is stopped before its Run returns, on
//     success, error or cancellation; if the suite's own process dies, its
//     children get SIGTERM from the kernel (Linux).
//   - Traffic stays on loopback: processes bind 127.0.0.1 and loadgen only
//     dials loopback addresses.
//
// # Concurrency
//
// Scenario, Contender and RunResult values are not modified after they are
// built and may be shared. An Engine runs one scenario at a time; Suite.Run
// calls it sequentially because runs share the machine's CPUs and must not
// disturb one another (Virtual's runs are independent and may run
// concurrently, but wall-clock EPP costs are then inflated). An interleaved
// scenario's contenders run at once by design: each is disturbed by the
// others alike, which is what makes their ratios comparable on a loaded
// machine. Progress is called from many goroutines.
package benchsuite
