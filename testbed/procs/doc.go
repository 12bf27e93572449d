// Package procs runs the test bed's child processes (the simulated fleet,
// the EPP, the data plane) for the real-time benchmark suite and the chaos
// suite: each with its output in a log file, stopped with SIGTERM (killed
// after StopGrace), killed outright with SIGKILL, or restarted with the same
// command line; readiness checks (an HTTP 200, a TCP accept) that fail fast
// when the process exits, with the end of its log; blocks of free loopback
// ports; and the CPU time a process has used (Linux, from /proc).
//
// # Invariants
//
//   - Every Process is reaped: a goroutine waits for it, so Exited, Stop and
//     Kill never leave a zombie, and Stop and Kill return only once it has
//     exited.
//   - On Linux a child gets SIGTERM when the thread that started it exits,
//     so a killed suite leaves no fleet behind.
//
// # Concurrency
//
// A Process's methods are safe for concurrent use; Stop and Kill may race
// (whichever signal lands first ends it).
package procs
