// Package chaos is the chaos suite and the soak of issue 20: real processes
// (a simulated fleet of vllm-sim servers, the EPP with Sluice admission, the
// data plane that plays Envoy) on loopback, in static mode or in Kubernetes
// mode against a real API server (envtest).
//
// The suite runs load through the stack, injects one fault at a time
// mid-run (a server killed, hanging its /metrics, answering 500s or slowed
// 10x; a pod flapping, deleted, or left out by a pool edit; the EPP sent
// SIGTERM with requests queued, or killed and restarted; the API server
// stopped and restarted; a burst of client disconnects; the EPP's first
// seconds) and classifies every request's final answer: 200, 429 or 503 with
// Retry-After, other, lost, hung. A case fails on a lost or hung request,
// on an answer its fault does not make unavoidable, or on a queue entry or
// reservation left in the EPP after the load. It reports how long traffic
// took to leave the faulty endpoint and the Critical band's TTFT p99; those
// are figures, never assertions. A case with a baseline (Case.Baseline: one
// EPP replica, for the case that kills one of two) first runs the same load
// with no fault, and the report sets the fault window's Critical TTFT
// against the same window of that run.
//
// The soak offers three times the fleet's measured capacity for minutes
// with clients that honour Retry-After, probes with a new tenant and model
// per request, and checks that every request ends in exactly one designed
// answer, that the EPP's goroutines and RSS return to their baseline, and
// that no metric family keeps growing.
//
// `make test` runs the smoke cases (Case.Smoke) in static mode; `make chaos`
// and `make soak` run the rest and write their reports. Results are in
// README.md.
package chaos
