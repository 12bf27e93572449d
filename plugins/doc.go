// Package plugins adapts Sluice's pure decision packages (flowcontrol, lora,
// prefixcache, modelrewrite) to the plugin interfaces of the Gateway API
// Inference Extension (GIE) v1.5.0 Endpoint Picker.
//
// It is the only package that imports upstream plugin interfaces. Each adapter
// is thin: it declares its upstream interfaces with `var _` checks, parses its
// parameters (apiConfig -> applyDefaults -> validate -> Config) and translates
// upstream types into the plain inputs of the logic it wraps.
//
// Two commands are not plugins but the EPP binary's features around them:
// FlowControlCommand (Sluice admission) and ModelRewriteCommand, whose
// ModelRewrite chooses each request's model (InferenceModelRewrite) through
// the runner's ModelSelector seam, which cmd/epp connects.
//
// Plugin types are registered under Sluice's own names ("sluice-…") through a
// Registry, which refuses duplicate type names; upstream's global registry
// silently overwrites them, so a Registry is filled first and installed once.
//
// Time: Sluice's plugins read the wall clock, unless they are loaded through a
// ClockHandle, which names their clock (the virtual-time benchmark engine in
// testbed/virtualbench loads configurations through one; nothing of it is in
// the EPP image).
//
// Concurrency: a Registry is safe for concurrent use. Install must be called
// before the EPP configuration is loaded.
package plugins
