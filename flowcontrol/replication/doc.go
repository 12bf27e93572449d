// Package replication holds the decisions that let several EPP replicas of one InferencePool act as one without a
// coordinator: who the replicas are (Membership: a static peer list, each peer live while it is heard from) and which
// replica owns which endpoint (Owner, Partition: rendezvous hashing over the live replicas, so a replica that leaves
// moves only its own endpoints, and every replica that sees the same live set computes the same owners).
//
// It is pure decision logic: plain inputs, time passed in as arguments, no I/O, no dependency on the Gateway API
// Inference Extension. What carries peer messages and what acts on ownership live elsewhere; the design, and what
// the benchmark measured of each option, are in testbed/bench/scenarios/README.md ("EPP replicas").
//
// # Invariants
//
//   - Owner is a pure function of the key and the set of members (not their order): replicas that agree on the
//     live set agree on every owner.
//   - Owner: removing a member moves only the keys it owned; adding one moves only keys to it. Partition trades a
//     little of that for balance: no member owns more than its even share rounded up.
//   - A replica always counts itself live: with every peer gone it owns every endpoint and decides alone.
//   - View.Owned returns every endpoint when this replica's share is empty (more replicas than endpoints), so no
//     replica is left with nothing to route to; those endpoints are then shared, not partitioned.
//
// # Concurrency
//
// Owner, Partition and ParsePeers are safe for concurrent use. A Membership is not: its owner serialises Heard,
// SetPeers and Live. A View is a Membership behind a mutex, for the EPP: peer probes call Heard, the peer list's
// source calls SetPeers, and admission asks Owned on every pool snapshot.
package replication
