// Package fleettest is support for tests that run the EPP as a process: simulated vLLM servers and a data plane
// (the part Envoy plays) on loopback addresses, each stopped when the test ends.
package fleettest
