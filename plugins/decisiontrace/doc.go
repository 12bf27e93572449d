// Package decisiontrace records why the EPP sent a request where it did: the
// request's admission (band, wait, outcome), each scheduling profile's
// candidates, what every filter removed, every scorer's score and the weighted
// total per endpoint, the endpoint picked, and how the request ended (routed,
// or answered by the EPP itself with a status and shed reason). It is the
// EPP's opt-in decision trace; nothing of it runs unless an operator turns it
// on.
//
// A Recorder keeps the last Size records in a fixed ring, serves them as JSON
// (ServeHTTP, on the EPP's metrics port) and logs each one at verbosity
// LogLevel. Per request, a Trace travels in the request's context from the
// proxy's first message to the EPP's routing answer: the hooks that see the
// decision (admission, the scheduler's filters, scorers and picker) add to it
// through FromContext, and the runner commits it when the EPP answers.
//
// Who decides what is traced: the operator, with the Recorder's Config. A
// client can at most opt a request in when Config.Header names a header, and
// then only within the rate the operator allows (Config.Rate); it never reads
// a record, which holds no prompt, response or header, only the routing
// decision.
//
// It is pure: plain inputs (endpoint names, scores), time from an injected
// clock, no Gateway API Inference Extension import (plugins/ and runner/ adapt
// the EPP's hooks to it).
//
// Concurrency: a Recorder and a Trace are safe for concurrent use. A committed
// Record is never modified again.
package decisiontrace
