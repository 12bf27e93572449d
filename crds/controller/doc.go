// Package controller reconciles the FlowControlPolicy objects of the InferencePool an EPP serves: it decides which
// policy is in force, writes every such policy's Accepted condition and observedGeneration, and hands the
// configuration in force to a callback (the EPP applies it to its flowcontrol.Controller live).
//
// # Decision
//
// A policy belongs to the pool when its poolRef (group, kind, name) names it; policies of other pools are never
// written. If the pool does not exist, every policy is Accepted=False/PoolNotFound. Otherwise a policy whose spec
// does not convert (ToConfig fails: an object stored under an older schema or kept by CEL ratcheting) is
// Accepted=False/InvalidSpec with the conversion error as message; among the valid ones the oldest (creation time,
// then name) is Accepted=True/Accepted and the others Accepted=False/Conflicted. With no accepted policy the
// configuration in force is flowcontrol.DefaultConfig(): an invalid, conflicting or deleted policy never keeps
// effect.
//
// # Invariants
//
//   - Every reconcile recomputes the whole decision from the cache (level-triggered): all events map to one
//     request, the pool, so the order and coalescing of events do not matter.
//   - The callback is called only when the configuration in force changes, and first on the first reconcile.
//   - Conditions carry the generation they describe; status is written only when it changes, so the reconciler's
//     own status writes converge instead of looping.
//
// # Hot install
//
// The policies are read through a cache of their own, restricted to the pool's namespace and created once the API
// server serves FlowControlPolicies (package crds/internal/hotinstall): an EPP started with Sluice admission on a
// cluster without the CRD logs that once, keeps the policy it started with, and applies policies as soon as the CRD
// is installed, without a restart.
//
// # Concurrency
//
// Reconcile may be called concurrently; calls are serialised by a mutex (controller-runtime already never runs
// one request twice at a time). The callback runs on the reconciling goroutine and must not block for long.
//
// # RBAC
//
// The EPP's service account needs get/list/watch on flowcontrolpolicies.sluice.dev, update on
// flowcontrolpolicies/status, and get/list/watch on the pool's resource (inferencepools).
package controller
