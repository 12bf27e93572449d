// Package apitest runs the tests of crds/ and its sub-packages against a real kube-apiserver and etcd (envtest),
// started once per test binary with the CRDs the package needs.
//
// The binaries come from KUBEBUILDER_ASSETS (hack/envtest-binaries.sh prints the directory; `make envtest` builds
// them once). When it is unset, tests that need the server fail with instructions, or are skipped under -short, so
// that a plain `go test -short` stays usable on machines without the binaries and a full run never passes by
// silently testing nothing.
//
// Main and Config are not safe for concurrent use with each other: Main sets the package state before any test runs.
package apitest
