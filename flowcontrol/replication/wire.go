package replication

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// The wire form of a Summary, what replicas send one another: a version byte, then the fields in order, strings as
// a uvarint length and bytes, counts as uvarints, rates as float32 bits, block hashes as 8 bytes. A summary of a
// replica owning 12 endpoints with every seat busy is about 30 bytes plus the names of its peers. Version 2 adds the
// prefix inserts after the acknowledgements, version 3 the pool's slot limit after them, version 4 the demand after
// it (a flags byte, demand present and drain settled; with demand, the drain rate and the tenants, each a band byte,
// its name, three rates and the span they average over), version 5 the most the sender's endpoints have run after it,
// version 6 the spare places after that (a list as Idle's: one byte while the sender has none to offer), a flags byte
// (the places are for requests of tenants under their share only) and the sender's waiting requests of such tenants,
// version 7 one more demand flag (some endpoint of the sender is not seat-bound: Demand.Unseated), and version 8 the
// KV size of the requests Sent counts after everything else (a uvarint of tokens per entry of Sent, in its order).
// Every version is read; a replica sends each peer the newest
// version that peer has sent (Exchange.WireVersion), so that during a rolling upgrade replicas of different releases
// still exchange what both read: replicas from before prefix sharing refuse anything but version 1, those from before the slot limit anything
// beyond 2, those from before the demand anything beyond 3 (they are sent version 3 and send no demand: Pool.Demand),
// those from before the most run anything beyond 4 (they are sent version 4 and report none: Pool.PoolRunning counts
// the peers that do), those from before the spare places anything beyond 5 (they are sent version 5, offer none and
// take none), those from before the unseated flag anything beyond 6 (they are sent version 6, and their seats' free
// rate is taken as all they drain, as they take it themselves), those from before the KV sizes anything beyond 7
// (they are sent version 7; their requests on a replica's endpoints are of unknown size there, whose KV room is then
// not counted, as before).

const (
	// WireVersion is the newest wire version, the one this release sends its peers of the same release.
	WireVersion         = 8
	wireVersionSentKV   = 8 // with the KV size of the requests Sent counts
	wireVersionUnseated = 7 // with the demand's unseated flag, without the KV sizes
	wireVersionSpare    = 6 // with the spare places, without the unseated flag
	wireVersionRunning  = 5 // with the most the sender's endpoints have run, without the spare places
	wireVersionDemand   = 4 // with the demand, without the most run
	wireVersionSlots    = 3 // with the pool's slot limit, without the demand
	wireVersionPrefix   = 2 // with prefix inserts, without the pool's slot limit
	wireVersionSeats    = 1 // without prefix inserts
	hashBytes           = 8
)

// maxWireHashes bounds the block hashes a received summary may carry, over all its pods: 32 KiB.
const maxWireHashes = 1 << 12

// maxWireTenants bounds the tenants a received summary's demand may list: a sender lists at most
// flowcontrol.MaxSummaryTenants per band.
const maxWireTenants = 1 << 8

// maxWireBand bounds a tenant's band: flowcontrol's bands number 3, a few more leave room without allowing garbage.
const maxWireBand = 15

// Flags of the demand (version 4).
const (
	demandPresent = 1 << iota
	demandSettled
	demandUnseated // version 7
)

// Flags of the spare places (version 6).
const spareProtected = 1

// maxWireEntries bounds each list a received summary may hold: a corrupt or hostile length cannot allocate much.
const maxWireEntries = 1 << 16

// maxWireSeats bounds a received summary's seat count, its Critical requests waiting, its pool slot limit and most run,
// and the seats of each of its endpoint lists summed: admission walks them seat by seat under its lock (Exchange.Take,
// the reserve's sizing), so a corrupt or hostile count must not make that walk long.
const maxWireSeats = 1 << 16

// AppendBinary appends s's wire form, in the newest version, to b.
func (s Summary) AppendBinary(b []byte) ([]byte, error) {
	return s.AppendVersion(b, WireVersion)
}

// AppendVersion appends s's wire form in version v (1 to WireVersion) to b: what an older version has no field for
// (prefix inserts before 2, the pool's slot limit before 3) is left out.
func (s Summary) AppendVersion(b []byte, v byte) ([]byte, error) {
	if v < wireVersionSeats || v > WireVersion {
		return b, fmt.Errorf("summary version %d, want 1 to %d", v, WireVersion)
	}
	b = append(b, v)
	b = appendString(b, s.From)
	b = binary.AppendUvarint(b, s.Seq)
	b = binary.BigEndian.AppendUint32(b, math.Float32bits(float32(s.CriticalRate)))
	b = binary.BigEndian.AppendUint32(b, math.Float32bits(float32(s.SeatFrees)))
	b = binary.AppendUvarint(b, uint64(max(0, s.Seats)))
	b = binary.AppendUvarint(b, uint64(max(0, s.CriticalWaiting)))
	for _, list := range [][]EndpointCount{s.Idle, s.Sent} {
		b = appendCounts(b, list)
	}
	b = binary.AppendUvarint(b, uint64(len(s.Acks)))
	for _, a := range s.Acks {
		b = appendString(b, a.Peer)
		b = binary.AppendUvarint(b, a.Seq)
	}
	if v < wireVersionPrefix {
		return b, nil
	}
	b = binary.AppendUvarint(b, uint64(len(s.Prefix)))
	for _, p := range s.Prefix {
		b = appendString(b, p.Pod)
		b = binary.AppendUvarint(b, uint64(len(p.Hashes)))
		for _, h := range p.Hashes {
			b = binary.BigEndian.AppendUint64(b, h)
		}
	}
	if v < wireVersionSlots {
		return b, nil
	}
	b = binary.AppendUvarint(b, uint64(max(0, s.PoolSlots)))
	if v < wireVersionDemand {
		return b, nil
	}
	b = appendDemand(b, s.Demand, v)
	if v < wireVersionRunning {
		return b, nil
	}
	b = binary.AppendUvarint(b, uint64(max(0, s.PoolRunning)))
	if v < wireVersionSpare {
		return b, nil
	}
	b = appendCounts(b, s.Spare)
	flags := byte(0)
	if s.SpareProtected {
		flags |= spareProtected
	}
	b = append(b, flags)
	b = binary.AppendUvarint(b, uint64(max(0, s.ProtectedWaiting)))
	if v < wireVersionSentKV {
		return b, nil
	}
	for i := range s.Sent {
		tokens := 0
		if i < len(s.SentTokens) {
			tokens = min(max(0, s.SentTokens[i]), math.MaxInt32)
		}
		b = binary.AppendUvarint(b, uint64(tokens))
	}
	return b, nil
}

// appendCounts appends a list of endpoint counts: its length, then each endpoint's name and count.
func appendCounts(b []byte, list []EndpointCount) []byte {
	b = binary.AppendUvarint(b, uint64(len(list)))
	for _, e := range list {
		b = appendString(b, e.Endpoint)
		b = binary.AppendUvarint(b, uint64(max(0, e.N)))
	}
	return b
}

// appendDemand appends version 4's demand, in version v: a flags byte, and with demand its drain rate and tenants.
func appendDemand(b []byte, d *Demand, v byte) []byte {
	if d == nil {
		return append(b, 0)
	}
	flags := byte(demandPresent)
	if d.Settled {
		flags |= demandSettled
	}
	if d.Unseated && v >= wireVersionUnseated {
		flags |= demandUnseated
	}
	b = append(b, flags)
	b = appendRate(b, d.Drain)
	b = binary.AppendUvarint(b, uint64(len(d.Tenants)))
	for _, t := range d.Tenants {
		b = append(b, t.Band)
		b = appendString(b, t.Tenant)
		b = appendRate(appendRate(appendRate(appendRate(b, t.Cost), t.Requests), t.Weight), t.Span)
	}
	return b
}

func appendRate(b []byte, r float64) []byte {
	return binary.BigEndian.AppendUint32(b, math.Float32bits(float32(r)))
}

func appendString(b []byte, s string) []byte {
	return append(binary.AppendUvarint(b, uint64(len(s))), s...)
}

// ParseSummary reads a summary's wire form. Anything else, truncated or with bytes left over, is an error.
func ParseSummary(b []byte) (Summary, error) {
	r := reader{b: b}
	v := r.byte()
	if r.err == nil && (v < wireVersionSeats || v > WireVersion) {
		return Summary{}, fmt.Errorf("summary version %d, want 1 to %d", v, WireVersion)
	}
	s := Summary{Version: v}
	s.From = r.string()
	s.Seq = r.uvarint()
	s.CriticalRate = float64(math.Float32frombits(r.uint32()))
	s.SeatFrees = float64(math.Float32frombits(r.uint32()))
	s.Seats = r.count()
	s.CriticalWaiting = r.count()
	s.Seats = r.seats(s.Seats)
	s.CriticalWaiting = r.seats(s.CriticalWaiting)
	for _, list := range []*[]EndpointCount{&s.Idle, &s.Sent} {
		*list = r.counts()
	}
	for range r.entries() {
		s.Acks = append(s.Acks, Ack{Peer: r.string(), Seq: r.uvarint()})
	}
	if v >= wireVersionPrefix {
		total := 0
		for range r.entries() {
			p := BlockInserts{Pod: r.string()}
			n := r.count()
			if total += n; total > maxWireHashes {
				r.err = cmpErr(r.err, fmt.Errorf("more than %d block hashes", maxWireHashes))
			}
			for range r.hashes(n) {
				p.Hashes = append(p.Hashes, r.uint64())
			}
			s.Prefix = append(s.Prefix, p)
		}
	}
	if v >= wireVersionSlots {
		s.PoolSlots = r.seats(r.count())
	}
	if v >= wireVersionDemand {
		s.Demand = r.demand(v)
	}
	if v >= wireVersionRunning {
		s.PoolRunning = r.seats(r.count())
	}
	if v >= wireVersionSpare {
		s.Spare = r.counts()
		if flags := r.byte(); flags&^spareProtected != 0 {
			r.err = cmpErr(r.err, fmt.Errorf("unknown spare flags %#x", flags))
		} else {
			s.SpareProtected = flags&spareProtected != 0
		}
		s.ProtectedWaiting = r.seats(r.count())
	}
	if v >= wireVersionSentKV && len(s.Sent) > 0 {
		s.SentTokens = make([]int, len(s.Sent))
		for i := range s.SentTokens {
			s.SentTokens[i] = r.count()
		}
	}
	switch {
	case r.err != nil:
		return Summary{}, r.err
	case len(r.b) > 0:
		return Summary{}, fmt.Errorf("summary has %d bytes left over", len(r.b))
	case !(s.CriticalRate >= 0) || !(s.SeatFrees >= 0) || math.IsInf(s.CriticalRate, 0) || math.IsInf(s.SeatFrees, 0):
		return Summary{}, fmt.Errorf("summary rates %v, %v are not finite and non-negative", s.CriticalRate, s.SeatFrees)
	}
	return s, nil
}

var errTruncated = errors.New("summary is truncated")

// counts reads a list of endpoint counts, whose counts sum to at most maxWireSeats.
func (r *reader) counts() []EndpointCount {
	var list []EndpointCount
	total := 0
	for range r.entries() {
		e := EndpointCount{Endpoint: r.string(), N: r.count()}
		total += e.N
		r.seats(total)
		list = append(list, e)
	}
	return list
}

// demand reads version 4's demand, in version v: nil when the summary carries none.
func (r *reader) demand(v byte) *Demand {
	flags := r.byte()
	if r.err != nil || flags&demandPresent == 0 {
		if flags&^demandPresent != 0 {
			r.err = cmpErr(r.err, fmt.Errorf("demand flags %#x without demand", flags))
		}
		return nil
	}
	known := byte(demandPresent | demandSettled)
	if v >= wireVersionUnseated {
		known |= demandUnseated
	}
	if flags&^known != 0 {
		r.err = cmpErr(r.err, fmt.Errorf("unknown demand flags %#x", flags))
	}
	d := &Demand{Settled: flags&demandSettled != 0, Unseated: flags&demandUnseated != 0, Drain: r.rate()}
	n := r.count()
	if n > maxWireTenants {
		r.err = cmpErr(r.err, fmt.Errorf("demand of %d tenants, more than %d", n, maxWireTenants))
		return nil
	}
	for range n {
		t := TenantDemand{Band: r.byte(), Tenant: r.string(), Cost: r.rate(), Requests: r.rate(), Weight: r.rate(),
			Span: r.rate()}
		if t.Band > maxWireBand {
			r.err = cmpErr(r.err, fmt.Errorf("demand of band %d", t.Band))
		}
		d.Tenants = append(d.Tenants, t)
	}
	return d
}

// rate reads a rate: a finite, non-negative float32.
func (r *reader) rate() float64 {
	v := float64(math.Float32frombits(r.uint32()))
	if !(v >= 0) || math.IsInf(v, 0) {
		r.err = cmpErr(r.err, fmt.Errorf("rate %v is not finite and non-negative", v))
		return 0
	}
	return v
}

// reader reads the wire form; its first error sticks and every later read returns zero.
type reader struct {
	b   []byte
	err error
}

func (r *reader) byte() byte {
	if r.err != nil || len(r.b) < 1 {
		r.err = cmpErr(r.err, errTruncated)
		return 0
	}
	v := r.b[0]
	r.b = r.b[1:]
	return v
}

func (r *reader) uint32() uint32 {
	if r.err != nil || len(r.b) < 4 {
		r.err = cmpErr(r.err, errTruncated)
		return 0
	}
	v := binary.BigEndian.Uint32(r.b)
	r.b = r.b[4:]
	return v
}

func (r *reader) uint64() uint64 {
	if r.err != nil || len(r.b) < hashBytes {
		r.err = cmpErr(r.err, errTruncated)
		return 0
	}
	v := binary.BigEndian.Uint64(r.b)
	r.b = r.b[hashBytes:]
	return v
}

// hashes returns n when the reader holds n hashes, 0 after an error or when it is shorter (then an error).
func (r *reader) hashes(n int) int {
	if r.err != nil || len(r.b)/hashBytes < n {
		r.err = cmpErr(r.err, errTruncated)
		return 0
	}
	return n
}

func (r *reader) uvarint() uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.err = errTruncated
		return 0
	}
	r.b = r.b[n:]
	return v
}

// count reads a uvarint that must fit an int32.
func (r *reader) count() int {
	v := r.uvarint()
	if v > math.MaxInt32 {
		r.err = cmpErr(r.err, fmt.Errorf("count %d is out of range", v))
		return 0
	}
	return int(v)
}

// seats checks that a seat count read is at most maxWireSeats, and returns it.
func (r *reader) seats(n int) int {
	if n > maxWireSeats {
		r.err = cmpErr(r.err, fmt.Errorf("%d seats, more than %d", n, maxWireSeats))
		return 0
	}
	return n
}

// entries reads a list length, at most maxWireEntries.
func (r *reader) entries() int {
	n := r.count()
	if n > maxWireEntries {
		r.err = cmpErr(r.err, fmt.Errorf("list of %d entries, more than %d", n, maxWireEntries))
		return 0
	}
	return n
}

func (r *reader) string() string {
	n := r.count()
	if r.err != nil || len(r.b) < n {
		r.err = cmpErr(r.err, errTruncated)
		return ""
	}
	s := string(r.b[:n])
	r.b = r.b[n:]
	return s
}

// cmpErr keeps the first error.
func cmpErr(first, next error) error {
	if first != nil {
		return first
	}
	return next
}
