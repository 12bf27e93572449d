// Package outlier is passive outlier detection for an endpoint picker, after Envoy's (consecutive_5xx,
// base_ejection_time, max_ejection_percent), but decided where the endpoint is picked.
//
// A model server that answers every request with a 5xx answers at once, so it always looks the least loaded and
// every load scorer prefers it; its metrics stay healthy. Only the responses tell. The Detector counts each
// endpoint's consecutive 5xx responses and ejects the endpoint at either of two thresholds: Consecutive5xx (Envoy's
// rule), or the lower LocalConsecutive5xx while a peer is healthy, its latest response (within 10 s) a success (the
// failure is the endpoint's own: it is ejected a few failed requests sooner; once every endpoint fails, the full count
// applies again, and MaxEjectionPercent bounds what the local rule ejected at the start of a pool-wide failure). An ejection lasts the base ejection time times the number of times the endpoint was
// ejected in a row (capped). Once the ejection ends the endpoint is picked again, and the first
// response decides: another 5xx ejects it again at once, for longer; any other status clears its record.
//
// A Pace ejects, through the same Detector, an endpoint that became slow: it times the gaps between the chunks of
// each streamed response (a token per engine step), learns each endpoint's usual gap, and, while most peers' pace is
// normal, reports an endpoint whose streams all fell silent for SlowFactor times its usual gap with no prefill of a
// prompt sent there (nor load of a LoRA adapter for one) to explain it, or one of whose streams had SlowGaps of its last 2·SlowGaps-1 gaps at SlowFactor
// times its usual gap, each gap less the prefills of the prompts sent there during it and the gap before. A slowed server answers successfully, so its slow ejections are kept apart from the 5xx records: they end as a 5xx ejection
// does, and a normal gap outside an ejection clears them.
//
// Eject applies the cap on the pool: of the candidates of one pick, at most MaxEjectionPercent of them (at least one
// when there are two or more) are left out, the longest-ejected first, and never all of them, so a fleet-wide failure
// (a bad rollout, a broken dependency) degrades to the plain pick instead of refusing every request.
//
// The package is pure bookkeeping: time comes in as arguments, no I/O, no goroutines, no upstream imports. A
// Detector and a Pace are safe for concurrent use; one mutex guards each (a Pace's is taken before its Detector's).
package outlier
