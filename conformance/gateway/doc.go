// Package gateway runs upstream's Gateway API Inference Extension conformance
// suite (sigs.k8s.io/gateway-api-inference-extension/conformance v1.5.0, its
// only profile: Gateway) unchanged, with the EPP image in upstream's
// manifests replaced by Sluice's.
//
// Upstream's suite applies resources/base.yaml from the conformance module's
// embedded file system; its five EPP Deployments run
// registry.k8s.io/gateway-api-inference-extension/epp:v1.5.0-rc.1 with the
// arguments and the EndpointPickerConfig (plugins-config) that the Gateway
// tests rely on. Manifests serves the same file system with only those five
// image lines changed (VerifyPatched proves it line by line), and the
// profile test (build tag "gateway", run by `make conformance-gateway`)
// hands it to upstream's RunConformanceWithOptions with upstream's default
// options and flags, so upstream's tests, timeouts and report are used as
// they are. It needs a real cluster with a Gateway implementation; without
// one, `make test` builds the test binary and checks the patched manifests.
//
// The EPP side of the same manifests, the arguments, the
// EndpointPickerConfig and the RBAC they give the EPP, also runs locally:
// the EPP profile (package conformance, group GatewayProfileManifest)
// starts each implementation exactly as those Deployments do, under that
// Role, against a real API server.
package gateway
