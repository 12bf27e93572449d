// Package hotinstall starts a reconciler of a custom resource whose CRD may be installed, or whose RBAC granted,
// after the EPP started: Sluice's reconcilers of InferenceModelRewrites and FlowControlPolicies both use it, so
// turning a feature on against a cluster that lacks its CRD never stops the EPP, and installing the CRD later needs
// no restart.
//
// The objects are read through a cache of their own, restricted to one namespace, created only once the API server
// serves them: the manager's cache then needs no entry for a type that may not exist (such an entry makes the
// manager fail at creation, and an informer on a missing type never syncs and stops the manager).
//
// # Concurrency
//
// Start runs once per reconciler, during setup. The waiting runnable, when needed, runs under the manager like its
// other controllers (on the leader only when leader election is on) and calls start once, from its own goroutine.
package hotinstall
