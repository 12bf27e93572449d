// Package rewritecontroller reconciles the InferenceModelRewrite objects
// (upstream's API, inference.networking.x-k8s.io/v1alpha2, served unchanged)
// of the InferencePool an EPP serves: it puts the rules of the accepted ones
// in force in the EPP's model selection (a modelrewrite.Table handed to a
// Target), honours the operator's clear-guardrail annotation, and writes
// every such object's status.
//
// # Decision
//
// An object belongs to the pool when it lives in the pool's namespace and its
// poolRef names the pool's group (defaulted) and name; objects of other pools
// are never written. Each is validated with modelrewrite.Validate:
// Accepted=True/Accepted, or Accepted=False with a closed-set reason
// (InvalidPoolRef, PoolNotFound, InvalidMatch, InvalidTarget, InvalidWeight,
// MixedWeights) and a message naming the offending field. Every condition
// carries the generation it describes (observedGeneration). The accepted
// objects form the Table, with the API's precedence across objects (see
// modelrewrite.NewTable); a rejected or deleted object never keeps effect.
//
// With the guardrail on, an object with a tripped target gets
// GuardrailTripped=True/ErrorRatioExceeded, whose message names the rule, the
// target, both error ratios and the kubectl command that clears it (a new
// value of modelrewrite.ClearGuardrailAnnotation); once cleared it reads
// GuardrailTripped=False/NoTargetDiverted. Objects that never tripped carry
// no such condition.
//
// # Hot install
//
// If the CRD is absent when the EPP starts, Setup polls discovery and starts
// the watch once the CRD appears: no restart (crds/internal/hotinstall,
// which the FlowControlPolicy reconciler uses too). The rewrites are read through
// a cache of their own, restricted to the pool's namespace, so the manager's
// cache needs no entry for a type that may not exist yet.
//
// # Invariants
//
//   - Every reconcile recomputes everything from the cache (level-triggered):
//     all events, and guardrail trips, map to one request, the pool.
//   - Status is written only when it changes, so the reconciler's own writes
//     converge instead of looping.
//
// # Concurrency
//
// Reconcile calls are serialised by a mutex. Like the manager's other
// controllers, the reconciler runs on the leader only; followers are not
// ready and serve no traffic (upstream's readiness), and a new leader
// rebuilds the rules on its first reconcile. Guardrail trips are the
// leader's own.
//
// # RBAC
//
// get/list/watch on inferencemodelrewrites and update on
// inferencemodelrewrites/status (inference.networking.x-k8s.io), get/list/
// watch on inferencepools; see examples/modelrewrite-rbac.yaml.
package rewritecontroller
