// Package runnertest drives the Sluice EPP binary as a real process in tests:
// it starts the EPP on free loopback ports (stopped when the test ends,
// returned only once its readiness check passes), fakes model servers'
// metrics pages, and sends requests over ext_proc exactly as Envoy does.
package runnertest
