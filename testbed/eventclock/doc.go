// Package eventclock is a virtual clock for discrete-event simulation: time moves only when its owner takes the next
// event (Next) or steps it (Step, AdvanceTo), and timers are events. It implements
// clock.WithTickerAndDelayedExecution (k8s.io/utils/clock), so code written against an injected clock (Sluice
// admission, the EPP's plugins) runs unchanged in virtual time, its timer callbacks on the caller's goroutine.
//
// # Invariants
//
//   - Events fire in (time, scheduling order): events at the same instant fire in the order they were scheduled, so
//     a simulation is a deterministic function of its inputs.
//   - Time never moves backwards; an event scheduled in the past fires at the current time.
//   - A cancelled event (a stopped timer) never fires.
//
// # Concurrency
//
// A Clock is not safe for concurrent use: one goroutine schedules, takes and fires events. Sleep panics, because it
// would block the only goroutine that moves time.
package eventclock
