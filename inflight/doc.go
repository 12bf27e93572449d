// Package inflight counts, per endpoint, the requests the EPP sent there that have not finished yet, and scores
// endpoints by that count: least outstanding requests, as Envoy's LEAST_REQUEST balancer does.
//
// Scraped metrics (waiting and running requests, KV use) are up to one refresh interval old, so every scorer that
// reads them ranks the endpoints the same way for a whole interval and sends every request of that interval to the
// same "best" endpoint: on a uniform fleet this herding makes the tail worse than round-robin's. The EPP's own count
// changes with every request it routes and every response that ends, so ranking by it spreads a burst at once and
// sends more work where work finishes faster (a faster GPU, shorter requests).
//
// Tracker is pure bookkeeping: time comes in as arguments, no I/O, no goroutines. A request whose end the EPP never
// sees (the proxy dropped the stream) stops counting after the tracker's TTL, so a lost completion cannot mark an
// endpoint busy for ever. Requests are counted in start order and expire in that order.
//
// # Concurrency
//
// A Tracker is safe for concurrent use; one mutex guards it, held for a map update per call (Counts: one lookup per
// endpoint).
package inflight
