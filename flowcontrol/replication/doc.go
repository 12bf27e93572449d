// Package replication holds the decisions that let several EPP replicas of one InferencePool act as one without a
// coordinator: who the replicas are (Membership: a static peer list, each peer live while it is heard from) and which
// replica owns which endpoint (Owner, Partition: rendezvous hashing over the live replicas, so a replica that leaves
// moves only its own endpoints, and every replica that sees the same live set computes the same owners).
//
// Replicas that own shares also exchange summaries (Exchange, Summary): every DefaultExchangeInterval each tells
// the others its Critical arrival rate, how fast its seats free and how many it has, how many Critical requests wait
// at it, which of its endpoints have idle seats, and how many of its requests run on the others' endpoints. From the
// live peers' latest summaries (Pool) admission sizes the Critical seat reserve for the whole pool and keeps its part
// of it (ReserveShare), and sends a Critical request that would wait on its own endpoints to a peer's idle seat
// (Take); the owner counts it from the next summary on. A summary also carries the prompt blocks the sender's prefix
// index inserted since its last one (Prefix), so that every replica's index holds what any replica routed, and a
// request routed to a peer's endpoint for prefix affinity is counted there like one sent to an idle seat (SentTo),
// and the smallest slot limit the sender learned on its endpoints (PoolSlots), which every replica takes for the
// pool's, and the most any of its endpoints was seen running at once (PoolRunning, wire version 5), which until a slot
// limit is learned stands for the seats of an endpoint that has not queued yet, and (wire version 6) the places it
// would leave idle that a peer's waiting request of any band may take (Spare, TakeSpare; only a request of a tenant
// under its share when SpareProtected) and how many requests of tenants under their share wait at it
// (ProtectedWaiting). Every few summaries carry the sender's Demand (its tenants' rates per band, at most a bound per
// band, its drain rate, and whether an endpoint of its own is not seat-bound), kept until the next one; Pool sums the
// live peers' (Pool.Demand), so each replica judges a tenant under its share over the pool. Summaries travel in a compact, versioned wire form (AppendVersion, ParseSummary;
// each peer is sent the newest version it sent, WireVersion); nothing on the request path waits for one.
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
//   - A peer's idle seats (and its spare places, numbered as the idle seats they are) in one summary are offered in
//     turn to the peers it acknowledges, each seat to one of them, and a replica does not take again a seat it took
//     until the owner acknowledges the summary that told of it; so two replicas never send a request to the same idle
//     seat from the same summary.
//   - ReserveShare's parts, over replicas that agree on the figures, add up to the pool's reserve.
//   - A peer silent for the timeout drops out of Pool and offers nothing: with no live peer a replica decides alone.
//   - Pool.Demand counts only the peers that sent one (DemandPeers): a replica of a release from before wire version 4
//     sends none, and its tenants are not counted in the pool's demand nor its drain in the pool's drain.
//   - View.Owned returns every endpoint when this replica's share is empty (more replicas than endpoints), so no
//     replica is left with nothing to route to; those endpoints are then shared, not partitioned.
//
// # Concurrency
//
// Owner, Partition, ParsePeers and ParseSummary are safe for concurrent use, and so is an Exchange. A Membership is
// not: its owner serialises Heard, SetPeers and Live. A View is a Membership behind a mutex, for the EPP: peer probes
// call Heard, the peer list's source calls SetPeers, and admission asks Owned on every pool snapshot.
package replication
