// Package crds defines Sluice's Kubernetes API, group sluice.dev, version v1alpha1: the FlowControlPolicy custom
// resource that configures priority-aware admission (package flowcontrol) for one InferencePool.
//
// The Go types are the source of truth: controller-gen generates zz_generated.deepcopy.go and the CRD manifest in
// manifests/ from them (`make generate`; `make verify-generate` fails when either is stale).
//
// # Invariants
//
//   - FlowControlPolicySpec mirrors flowcontrol.APIConfig field for field, with the same JSON names, so a spec
//     without its poolRef is a valid flowcontrol JSON configuration. Band, priority-mapping, endpoint and tenant
//     types are converted to their flowcontrol counterparts by Go struct conversion, so a field added to one side
//     only does not compile; the top level is checked by a test.
//   - Every optional field has a server-side default equal to flowcontrol's, so a stored object shows the policy
//     actually in force, and ToConfig of a minimal object equals flowcontrol.DefaultConfig(). The three band types
//     differ only in those defaults, which is why there are three.
//   - The schema (OpenAPI bounds and CEL rules) rejects everything ToConfig rejects, so a policy accepted by the API
//     server converts. ToConfig still validates fully, because objects can bypass the current schema (stored under
//     an older CRD, or kept by CEL ratcheting) and the reconciler must report them as InvalidSpec.
//   - Durations are metav1.Duration strings restricted to what time.ParseDuration accepts and positive, so a stored
//     object always decodes.
//
// # Concurrency
//
// The types are plain data with no internal synchronisation. ToConfig only reads its receiver.
//
// +kubebuilder:object:generate=true
// +groupName=sluice.dev
// +versionName=v1alpha1
package crds
