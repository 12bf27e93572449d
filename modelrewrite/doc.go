// Package modelrewrite decides which model a request is sent to when
// InferenceModelRewrite objects (group inference.networking.x-k8s.io,
// v1alpha2) apply to its InferencePool. It serves the upstream API unchanged
// and adds what the upstream v1.5.0 Endpoint Picker does not do:
//
//   - Sticky splitting. A request that carries a session key (see
//     SessionKeys) always gets the same target while the weights stay the
//     same, and a weight change moves only the minimal share of sessions.
//     Targets are chosen by weighted rendezvous hashing: every target gets the
//     score w / -ln(u), where u in (0,1) is a hash of (session key, target
//     model), and the highest score wins. Raising one target's weight raises
//     only that target's score, so a session either stays where it is or moves
//     to the target that gained weight; with two targets, 90/10 -> 80/20 moves
//     exactly the 10% of sessions that the new weights require. Because the
//     hash depends on the target's model name and not on its position,
//     reordering targets or adding unrelated rules moves nobody. Requests
//     without a key draw the hash input from an injected random source and get
//     the same weighted split in expectation.
//   - Exact precedence as the API text specifies it (see NewTable): an Exact
//     model match beats a generic rule (a rule with no matches), then the
//     oldest object by creation timestamp wins, then the first rule in list
//     order; ties on the timestamp are broken by namespace and name, so the
//     answer never depends on map order or on the order objects arrived in.
//   - Validation with closed-enum reasons (Reason) for the status reconciler:
//     Rewrite.Validate for the plain spec, Validate for an API object
//     including its pool reference.
//   - An opt-in guardrail (Guardrail): when a canary target's error ratio
//     exceeds the stable target's by a margin over a sliding time window, the
//     canary's share goes to the stable target until an operator clears it.
//   - Per-rule, per-target signals behind the Recorder interface (metrics.go).
//
// # Layers
//
// The decision core (rewrite.go, table.go, split.go, decide.go, session.go,
// guardrail.go) works on plain Go types and imports no Gateway API Inference
// Extension package. convert.go alone imports the upstream API types package
// to turn an InferenceModelRewrite into a Rewrite and to validate it.
//
// # Invariants
//
//   - A Table is immutable after NewTable returns. The same Table, Request and
//     session key always yield the same Decision (given the same tripped
//     guardrail state); only keyless requests consume the random source.
//   - A Decision always names a model: the rewritten target, the stable target
//     when the guardrail diverted the request, or the incoming model when no
//     rule matched or the matching rule has no targets. No request is dropped
//     or left without a model by this package.
//   - Metric labels are never taken from client input: the rule labels come
//     from the Table (operator-written objects) and are capped in number by
//     the Prometheus recorder.
//
// # Concurrency
//
// Table is safe for concurrent use without locks; swap whole Tables (for
// example through an atomic.Pointer) when objects change. Guardrail and
// PrometheusRecorder are safe for concurrent use. The rand.Source passed to
// Table.Decide must be safe for concurrent use if it is shared; nil selects
// the goroutine-safe global generator of math/rand/v2.
package modelrewrite
