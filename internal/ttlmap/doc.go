// Package ttlmap is a map whose entries expire a fixed time after they were stored: the bookkeeping the EPP keeps per
// request ID between two hooks (a flow-control decision waiting for its response, a request counted in flight, a
// routed prompt waiting for its usage report), when the second hook may never run.
//
// Time is an argument: every method that can expire entries takes now, so the owner decides which clock it reads
// (the wall clock in the EPP, a virtual one in the benchmark engine, fixed instants in tests). Every entry lives for
// the same ttl, so insertion order is expiry order and expiring is a pop from the front: O(1) per expired entry, no
// scan. An entry stored again moves to the back with a new expiry.
//
// Expired entries are removed by the next call that takes now (Put, Get, Take, Expire), each handed to the map's
// onExpire callback first, so an owner that counts entries elsewhere (requests per endpoint) can uncount them.
// A bound on the number of entries is the owner's policy (drop the oldest, or refuse the new one): Len and
// DropOldest make either a few lines.
//
// Concurrency: a Map is not safe for concurrent use. Its owner guards it with its own lock, the same that guards what
// onExpire touches; onExpire runs under that lock and must not call back into the Map.
package ttlmap
