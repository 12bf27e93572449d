// Package envteststart starts a controller-runtime envtest environment (a real kube-apiserver and etcd) so that a
// port taken by another process does not fail the tests that need it.
//
// envtest picks free ports for etcd and the API server, and another process can bind one of them before etcd does
// (the test packages run in parallel, and every EPP, simulator and client connection they start takes ports too).
// envtest retries a failed start itself, but on the ports it already picked, so one collision fails every retry.
// Start builds a fresh Environment, and so fresh ports, for each attempt.
package envteststart
