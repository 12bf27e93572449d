package replication

import (
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"
)

// TestExchangeOffersIdleSeatsInTurn: a peer's idle seats are offered to its acknowledged peers in turn, so from one
// summary no two replicas take the same seat; a replica does not take again what its owner has not yet counted, and
// takes again once the owner's next summary (acknowledging the one that told of the first) still shows idle seats.
func TestExchangeOffersIdleSeatsInTurn(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	a, c := NewExchange("a", time.Second), NewExchange("c", time.Second)
	b := Summary{From: "b", Seq: 7, Idle: []EndpointCount{{"b-ep1", 1}, {"b-ep2", 2}}, Acks: []Ack{{"a", 0}, {"c", 0}}}
	a.Heard(b, t0)
	c.Heard(b, t0)
	// Seats in order b-ep1, b-ep2, b-ep2; with Seq 7 seat i goes to peer (i+7) mod 2: seat 0 to c, 1 to a, 2 to c.
	for _, step := range []struct {
		x    *Exchange
		id   string
		want string
	}{
		{a, "a1", "b-ep2"},
		{a, "a2", ""}, // a's one offered seat is taken, and b has not counted it yet
		{c, "c1", "b-ep1"},
		{c, "c2", "b-ep2"},
		{c, "c3", ""},
	} {
		got, ok := step.x.Take(step.id, 0, t0)
		if got != step.want || ok != (step.want != "") {
			t.Fatalf("%s: took %q (%v), want %q", step.id, got, ok, step.want)
		}
	}
	// a's next summary tells of a1; b acknowledges it and still has an idle seat on b-ep1, offered to a this time.
	own := a.Next(Summary{}, t0)
	if own.Seq != 1 || !reflect.DeepEqual(own.Sent, []EndpointCount{{"b-ep2", 1}}) {
		t.Fatalf("a's summary %+v, want Seq 1 telling of one request on b-ep2", own)
	}
	a.Heard(Summary{From: "b", Seq: 8, Idle: []EndpointCount{{"b-ep1", 1}}, Acks: []Ack{{"a", own.Seq}, {"c", 0}}}, t0)
	if got, ok := a.Take("a3", 0, t0); !ok || got != "b-ep1" {
		t.Fatalf("took %q (%v), want b-ep1", got, ok)
	}
	if !a.Done("a1") || a.Done("a1") || !a.Sent("a3") {
		t.Fatal("Done or Sent do not follow the requests sent")
	}
	// b falls silent: nothing is offered, and a's pool has no live peer.
	if _, ok := a.Take("a4", 0, t0.Add(time.Second)); ok {
		t.Fatal("took a seat from a peer silent for the timeout")
	}
	if a.Pool(t0.Add(time.Second)).Live() {
		t.Fatal("a silent peer is live")
	}
}

// TestExchangeHeardKeepsTheNewest: an older summary (reordered) does not replace a newer one, and self is ignored.
func TestExchangeHeardKeepsTheNewest(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	x := NewExchange("a", time.Second)
	x.Heard(Summary{From: "b", Seq: 5, Seats: 5, Sent: []EndpointCount{{"a-ep", 2}}}, t0)
	x.Heard(Summary{From: "b", Seq: 4, Seats: 4}, t0)
	x.Heard(Summary{From: "a", Seq: 9, Seats: 9}, t0)
	p := x.Pool(t0)
	if p.Seats != 5 || p.Load["a-ep"] != 2 || !p.Live() {
		t.Fatalf("pool %+v, want b's Seq 5 alone", p)
	}
}

// TestReserveShareAddsUp: seeded random pools: the replicas' parts of a reserve add up to it, each near its share of
// the seats; and a part is computed without allocating.
func TestReserveShareAddsUp(t *testing.T) {
	seed := uint64(22)
	rng := rand.New(rand.NewPCG(seed, 0))
	for round := range 200 {
		n := 2 + rng.IntN(5)
		seats := make([]int, n)
		total := 0
		for i := range seats {
			seats[i] = rng.IntN(40)
			total += seats[i]
		}
		pool := rng.IntN(12)
		sum := 0
		for i := range n {
			p := Pool{seats: map[string]int{}}
			for j := range n {
				if j != i {
					p.seats[fmt.Sprintf("epp-%d", j)] = seats[j]
				}
			}
			part := p.ReserveShare(fmt.Sprintf("epp-%d", i), pool, seats[i])
			if total > 0 && (float64(part) < float64(pool*seats[i])/float64(total)-1 || float64(part) > float64(pool*seats[i])/float64(total)+1) {
				t.Fatalf("seed %d round %d: part %d of %d for %d of %d seats", seed, round, part, pool, seats[i], total)
			}
			sum += part
		}
		if total > 0 && sum != pool {
			t.Fatalf("seed %d round %d: parts add up to %d, want %d (seats %v)", seed, round, sum, pool, seats)
		}
	}
	// Every tenant-seat check calls it under the controller's lock.
	p := Pool{seats: map[string]int{"epp-0": 10, "epp-2": 12, "epp-3": 8}}
	if allocs := testing.AllocsPerRun(100, func() { p.ReserveShare("epp-1", 6, 11) }); allocs != 0 {
		t.Errorf("ReserveShare allocates %v times per call, want 0", allocs)
	}
}

func TestSummaryWireRoundTrip(t *testing.T) {
	for _, s := range []Summary{
		{From: "10.0.0.1:9003", Seq: 1},
		{From: "epp-0", Seq: 1 << 40, CriticalRate: 3.5, SeatFrees: 9.25, Seats: 48, CriticalWaiting: 2,
			Idle: []EndpointCount{{"10.0.1.1:8000", 1}, {"10.0.1.2:8000", 3}}, Sent: []EndpointCount{{"10.0.2.1:8000", 1}},
			SentTokens: []int{1 << 20}, Acks: []Ack{{"epp-1", 99}, {"epp-2", 7}}, PoolSlots: 4, PoolRunning: 4},
		{From: "epp-2", Seq: 3, Spare: []EndpointCount{{"10.0.3.1:8000", 1}, {"10.0.3.2:8000", 2}}, SpareProtected: true,
			ProtectedWaiting: 5},
		{From: "epp-1", Seq: 2, Prefix: []BlockInserts{{Pod: "default/vllm-0", Hashes: []uint64{1, 1 << 63, 42}},
			{Pod: "default/vllm-1", Hashes: []uint64{7}}}},
	} {
		wire, err := s.AppendBinary(nil)
		if err != nil {
			t.Fatal(err)
		}
		got, err := ParseSummary(wire)
		s.Version = WireVersion
		if err != nil || !reflect.DeepEqual(got, s) {
			t.Fatalf("%+v came back as %+v (%v)", s, got, err)
		}
		if _, err := ParseSummary(wire[:len(wire)-1]); err == nil {
			t.Fatalf("a truncated summary parsed")
		}
		if _, err := ParseSummary(append(wire, 0)); err == nil {
			t.Fatalf("a summary with a byte left over parsed")
		}
	}
}

// TestSummaryWireBoundsSeats: admission walks a peer's seats one by one under its lock, so a summary claiming more
// than maxWireSeats, in one count or summed over a list, is refused; so is one carrying more than maxWireHashes block
// hashes over all its pods.
func TestSummaryWireBoundsSeats(t *testing.T) {
	for _, tc := range []struct {
		name string
		s    Summary
		ok   bool
	}{
		{"at the bound", Summary{From: "b", Seats: maxWireSeats, Idle: []EndpointCount{{"e", maxWireSeats}}}, true},
		{"seats", Summary{From: "b", Seats: maxWireSeats + 1}, false},
		{"Critical waiting", Summary{From: "b", CriticalWaiting: maxWireSeats + 1}, false},
		{"pool slots", Summary{From: "b", PoolSlots: maxWireSeats + 1}, false},
		{"one idle endpoint", Summary{From: "b", Idle: []EndpointCount{{"e", 1<<31 - 1}}}, false},
		{"idle seats summed", Summary{From: "b", Idle: []EndpointCount{{"e1", maxWireSeats}, {"e2", 1}}}, false},
		{"sent summed", Summary{From: "b", Sent: []EndpointCount{{"e1", maxWireSeats}, {"e2", 1}}}, false},
		{"spare summed", Summary{From: "b", Spare: []EndpointCount{{"e1", maxWireSeats}, {"e2", 1}}}, false},
		{"protected waiting", Summary{From: "b", ProtectedWaiting: maxWireSeats + 1}, false},
		{"block hashes at the bound", Summary{From: "b", Prefix: []BlockInserts{{"ns/p", make([]uint64, maxWireHashes)}}}, true},
		{"block hashes summed", Summary{From: "b", Prefix: []BlockInserts{{"ns/p", make([]uint64, maxWireHashes)}, {"ns/q", []uint64{1}}}}, false},
	} {
		wire, err := tc.s.AppendBinary(nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ParseSummary(wire); (err == nil) != tc.ok {
			t.Errorf("%s: ParseSummary error %v, want ok %v", tc.name, err, tc.ok)
		}
	}
}

// TestExchangeSentExpires: a request sent to a peer whose end is never reported stops being counted after sentTTL.
func TestExchangeSentExpires(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	a := NewExchange("a", time.Hour)
	a.Heard(Summary{From: "b", Seq: 1, Idle: []EndpointCount{{"b-ep", 1}}, Acks: []Ack{{"a", 0}}}, t0)
	if _, ok := a.Take("lost", 0, t0); !ok {
		t.Fatal("took no seat")
	}
	if own := a.Next(Summary{}, t0.Add(sentTTL-time.Second)); len(own.Sent) != 1 || !a.Sent("lost") {
		t.Fatalf("before sentTTL the summary tells of %v, want the request", own.Sent)
	}
	if own := a.Next(Summary{}, t0.Add(sentTTL)); len(own.Sent) != 0 || a.Sent("lost") {
		t.Fatalf("after sentTTL the summary still tells of %v", own.Sent)
	}
}

// TestSummaryWireVersions: a summary written in an older version is that version's layout, which replicas of the
// older release read (each version's bytes are the next one's without the fields it adds), and reads back without what
// that version has no field for; a version beyond the newest is neither written nor read.
func TestSummaryWireVersions(t *testing.T) {
	s := Summary{From: "epp-0", Seq: 9, CriticalRate: 2, SeatFrees: 8, Seats: 12, CriticalWaiting: 1,
		Idle: []EndpointCount{{"10.0.1.1:8000", 2}}, Sent: []EndpointCount{{"10.0.2.1:8000", 1}}, Acks: []Ack{{"epp-1", 3}},
		Prefix: []BlockInserts{{Pod: "default/vllm-0", Hashes: []uint64{5}}}, PoolSlots: 4, PoolRunning: 3,
		Demand: &Demand{Drain: 6, Settled: true, Unseated: true, Tenants: []TenantDemand{{Band: 1, Tenant: "light", Cost: 2, Requests: 1, Weight: 1}}},
		Spare:  []EndpointCount{{"10.0.1.2:8000", 1}}, SpareProtected: true, ProtectedWaiting: 2, SentTokens: []int{680}}
	seated := *s.Demand
	seated.Unseated = false
	wire := map[byte][]byte{}
	for v := byte(wireVersionSeats); v <= WireVersion; v++ {
		b, err := s.AppendVersion(nil, v)
		if err != nil {
			t.Fatal(err)
		}
		wire[v] = b
		want := s
		want.Version = v
		if v < wireVersionSentKV {
			want.SentTokens = nil
		}
		if v < wireVersionUnseated {
			want.Demand = &seated
		}
		if v < wireVersionSpare {
			want.Spare, want.SpareProtected, want.ProtectedWaiting = nil, false, 0
		}
		if v < wireVersionRunning {
			want.PoolRunning = 0
		}
		if v < wireVersionDemand {
			want.Demand = nil
		}
		if v < wireVersionSlots {
			want.PoolSlots = 0
		}
		if v < wireVersionPrefix {
			want.Prefix = nil
		}
		if got, err := ParseSummary(b); err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("version %d came back as %+v (%v), want %+v", v, got, err, want)
		}
	}
	noPrefix := s
	noPrefix.Prefix = nil
	v3, _ := noPrefix.AppendVersion(nil, wireVersionSlots)
	noDemand := s
	noDemand.Demand = nil
	v4, _ := noDemand.AppendVersion(nil, wireVersionDemand)
	noSpare := s
	noSpare.Spare, noSpare.SpareProtected, noSpare.ProtectedWaiting = nil, false, 0
	v6, _ := noSpare.AppendVersion(nil, wireVersionSpare)
	noUnseated := s
	noUnseated.Demand = &seated
	v7, _ := noUnseated.AppendVersion(nil, wireVersionUnseated)
	noUnseated.SentTokens = nil
	v8, _ := noUnseated.AppendVersion(nil, wireVersionSentKV)
	for _, tc := range []struct {
		older, newer []byte
		added        int
	}{
		{wire[wireVersionSeats], v3, 2}, // an empty prefix list and the slot limit
		{wire[wireVersionPrefix], wire[wireVersionSlots], 1},
		{wire[wireVersionSlots], v4, 1},                        // the demand's flags: none
		{wire[wireVersionDemand], wire[wireVersionRunning], 1}, // the most run: 3, one byte
		{wire[wireVersionRunning], v6, 3},                      // no spare place, no flag, none waiting: 3 bytes
		{wire[wireVersionRunning], wire[wireVersionSpare], len(wire[wireVersionSpare]) - len(wire[wireVersionRunning])},
		{wire[wireVersionSpare], v7, 0},                         // the same bytes: version 7 adds a demand flag, clear here
		{wire[wireVersionUnseated], wire[wireVersionSentKV], 2}, // 680 tokens for the one request sent: two bytes
		{v7, v8, 1}, // a sender that did not size its request tells 0 tokens: one byte
	} {
		if !reflect.DeepEqual(tc.older[1:], tc.newer[1:len(tc.newer)-tc.added]) {
			t.Errorf("version %d is not version %d without its added fields:\n%x\n%x", tc.older[0], tc.newer[0], tc.older, tc.newer)
		}
	}
	if _, err := s.AppendVersion(nil, WireVersion+1); err == nil {
		t.Error("wrote a version beyond the newest")
	}
	if _, err := ParseSummary(append([]byte{WireVersion + 1}, wire[WireVersion][1:]...)); err == nil {
		t.Error("read a version beyond the newest")
	}
}

// TestSummaryWireDemand: version 4's demand reads back as written, absent as nil (the receiver keeps the last), and a
// demand with too many tenants, a band out of range, a rate that is not finite and non-negative, or unknown flags is
// refused.
func TestSummaryWireDemand(t *testing.T) {
	tenants := func(n int) []TenantDemand {
		var ts []TenantDemand
		for i := range n {
			ts = append(ts, TenantDemand{Band: 2, Tenant: fmt.Sprint("t", i), Cost: 1, Requests: 1, Weight: 1})
		}
		return ts
	}
	for _, tc := range []struct {
		name string
		d    *Demand
		ok   bool
	}{
		{"none", nil, true},
		{"no tenant, unsettled", &Demand{Drain: 0.5}, true},
		{"unseated", &Demand{Drain: 0.5, Unseated: true}, true},
		{"two tenants", &Demand{Drain: 9.5, Settled: true, Tenants: []TenantDemand{
			{Band: 1, Tenant: "heavy", Cost: 8, Requests: 4, Weight: 1, Span: 10}, {Band: 1, Tenant: "light", Cost: 2, Requests: 1, Weight: 2, Span: 2.5}}}, true},
		{"tenants at the bound", &Demand{Tenants: tenants(maxWireTenants)}, true},
		{"too many tenants", &Demand{Tenants: tenants(maxWireTenants + 1)}, false},
		{"band out of range", &Demand{Tenants: []TenantDemand{{Band: maxWireBand + 1, Tenant: "x", Weight: 1}}}, false},
		{"negative cost", &Demand{Tenants: []TenantDemand{{Band: 1, Tenant: "x", Cost: -1, Weight: 1}}}, false},
		{"NaN drain", &Demand{Drain: math.NaN()}, false},
		{"infinite weight", &Demand{Tenants: []TenantDemand{{Band: 1, Tenant: "x", Weight: math.Inf(1)}}}, false},
		{"negative span", &Demand{Tenants: []TenantDemand{{Band: 1, Tenant: "x", Weight: 1, Span: -1}}}, false},
	} {
		s := Summary{From: "epp-0", Seq: 3, PoolSlots: 4, Demand: tc.d}
		wire, err := s.AppendBinary(nil)
		if err != nil {
			t.Fatal(err)
		}
		got, err := ParseSummary(wire)
		if (err == nil) != tc.ok {
			t.Errorf("%s: ParseSummary error %v, want ok %v", tc.name, err, tc.ok)
			continue
		}
		s.Version = WireVersion
		if tc.ok && !reflect.DeepEqual(got, s) {
			t.Errorf("%s: %+v came back as %+v", tc.name, s, got)
		}
	}
	for _, flags := range []byte{demandSettled, 1 << 7, demandPresent | 1<<7} {
		b, _ := Summary{From: "epp-0", Seq: 1}.AppendVersion(nil, wireVersionSlots)
		b[0] = WireVersion
		b = append(b, flags)
		if flags&demandPresent != 0 {
			b = append(b, 0, 0, 0, 0, 0) // a drain of 0, no tenant
		}
		if _, err := ParseSummary(b); err == nil {
			t.Errorf("flags %#x read", flags)
		}
	}
	// Version 6 has no unseated flag: a version-6 summary with it is refused, as a release of version 6 refuses it.
	b, _ := Summary{From: "epp-0", Seq: 1, Demand: &Demand{Unseated: true}}.AppendVersion(nil, WireVersion)
	b[0] = wireVersionSpare
	if _, err := ParseSummary(b); err == nil {
		t.Error("version 6 read with the unseated flag")
	}
}

// TestExchangeDemand: the pool's demand sums the live peers' latest (a summary without demand keeps the last one's),
// tenants per band and name (what each counted, rate times span, over the longest span), drains and seat free rates; it is settled only if each peer's is, unseated if any peer's is, counts only the peers
// that sent one (an older release sends none), and goes with a peer that falls silent: the replica then decides alone.
func TestExchangeDemand(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	x := NewExchange("a", 100*time.Millisecond)
	x.Heard(Summary{From: "b", Seq: 1, Version: WireVersion, SeatFrees: 4, Demand: &Demand{Drain: 3, Settled: true, Tenants: []TenantDemand{
		{Band: 1, Tenant: "heavy", Cost: 8, Requests: 8, Weight: 1, Span: 10}, {Band: 1, Tenant: "light", Cost: 1, Requests: 1, Weight: 1, Span: 10}}}}, t0)
	x.Heard(Summary{From: "b", Seq: 2, Version: WireVersion, SeatFrees: 4}, t0.Add(10*time.Millisecond)) // no demand: the last holds
	// c's light tenant came later: its rate averages over 5 s, so the pool counted 10 + 10 over 10 s.
	x.Heard(Summary{From: "c", Seq: 1, Version: WireVersion, SeatFrees: 2, Demand: &Demand{Drain: 2, Tenants: []TenantDemand{
		{Band: 1, Tenant: "light", Cost: 2, Requests: 4, Weight: 1, Span: 5}, {Band: 2, Tenant: "light", Cost: 5, Requests: 1, Weight: 3, Span: 10}}}}, t0)
	x.Heard(Summary{From: "d", Seq: 1, SeatFrees: 100}, t0) // an older release: no demand
	p := x.Pool(t0.Add(20 * time.Millisecond))
	want := Demand{Drain: 5, Settled: false, Tenants: []TenantDemand{
		{Band: 1, Tenant: "heavy", Cost: 8, Requests: 8, Weight: 1, Span: 10}, {Band: 1, Tenant: "light", Cost: 2, Requests: 3, Weight: 1, Span: 10},
		{Band: 2, Tenant: "light", Cost: 5, Requests: 1, Weight: 3, Span: 10}}}
	if !reflect.DeepEqual(p.Demand, want) || p.DemandPeers != 2 || p.DemandSeatFrees != 6 {
		t.Fatalf("pool demand %+v from %d peers, seat frees %v; want %+v from 2, 6", p.Demand, p.DemandPeers, p.DemandSeatFrees, want)
	}
	x.Heard(Summary{From: "c", Seq: 2, Version: WireVersion, Demand: &Demand{Drain: 2, Settled: true, Unseated: true}}, t0.Add(20*time.Millisecond))
	if p := x.Pool(t0.Add(20 * time.Millisecond)); !p.Demand.Settled || !p.Demand.Unseated || len(p.Demand.Tenants) != 2 {
		t.Fatalf("with every peer's drain settled, c's endpoints not all seat-bound: %+v", p.Demand)
	}
	// b rolled back to a release before the demand: it sends version 3, and its last demand no longer holds.
	x.Heard(Summary{From: "b", Seq: 3, Version: wireVersionSlots, SeatFrees: 4}, t0.Add(30*time.Millisecond))
	if p := x.Pool(t0.Add(30 * time.Millisecond)); p.DemandPeers != 1 || len(p.Demand.Tenants) != 0 {
		t.Fatalf("b sending version 3: pool demand %+v from %d peers, want c's alone", p.Demand, p.DemandPeers)
	}
	if p := x.Pool(t0.Add(time.Second)); p.Live() || p.DemandPeers != 0 || len(p.Demand.Tenants) != 0 {
		t.Fatalf("every peer silent: pool %+v, want no demand", p)
	}
}

func TestExchangeWireVersion(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	x := NewExchange("a", time.Second)
	steps := []struct {
		heard Summary
		at    time.Duration
		want  byte
	}{
		{Summary{}, 0, wireVersionSeats}, // nothing heard
		{Summary{From: "b", Seq: 1, Version: wireVersionSeats}, 0, wireVersionSeats},
		{Summary{From: "b", Seq: 2, Version: wireVersionPrefix}, 0, wireVersionPrefix},
		{Summary{From: "b", Seq: 3, Version: wireVersionSeats}, 0, wireVersionPrefix},              // no inserts this time
		{Summary{From: "b", Seq: 1, Version: wireVersionSeats}, 2 * time.Second, wireVersionSeats}, // restarted, older
		{Summary{From: "b", Seq: 2, Version: WireVersion, PoolSlots: 6}, 2 * time.Second, WireVersion},
		{Summary{From: "b", Seq: 3, Version: WireVersion + 1}, 2 * time.Second, WireVersion},
		// a replica of this release, restarted: its first summary came in version 1 (it had not heard us yet), but it
		// declared what it reads, so both send the newest version from there on
		{Summary{From: "b", Seq: 1, Version: wireVersionSeats, Reads: WireVersion}, 4 * time.Second, WireVersion},
		{Summary{From: "b", Seq: 2, Version: wireVersionSeats, Reads: WireVersion + 1}, 4 * time.Second, WireVersion},
	}
	for i, step := range steps {
		x.Heard(step.heard, t0.Add(step.at))
		if got := x.WireVersion("b"); got != step.want {
			t.Fatalf("step %d: version %d, want %d", i, got, step.want)
		}
	}
	x.Heard(Summary{From: "c", Seq: 1, Version: WireVersion, PoolSlots: 4, Idle: []EndpointCount{{"c-ep", 2}}}, t0.Add(2*time.Second))
	x.Heard(Summary{From: "d", Seq: 1, Version: WireVersion, Idle: []EndpointCount{{"d-ep", 1}}}, t0.Add(2*time.Second))
	if p := x.Pool(t0.Add(2 * time.Second)); p.PoolSlots != 4 || p.IdleSeats != 3 {
		t.Fatalf("pool slot limit %d, idle seats %d; want the smallest reported, 4, and the 3 listed", p.PoolSlots, p.IdleSeats)
	}
}

// TestExchangePoolRunning: the pool's most run is the largest a live peer reported; a peer of a release from before
// wire version 5 reports none, and a silent peer's no longer counts.
func TestExchangePoolRunning(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	x := NewExchange("a", time.Second)
	for _, s := range []Summary{
		{From: "b", Seq: 1, Version: WireVersion, PoolRunning: 3},
		{From: "c", Seq: 1, Version: wireVersionDemand}, // older: none
		{From: "d", Seq: 1, Version: WireVersion, PoolRunning: 4},
	} {
		x.Heard(s, t0)
	}
	if p := x.Pool(t0); p.PoolRunning != 4 {
		t.Fatalf("pool's most run %d, want the largest reported, 4", p.PoolRunning)
	}
	x.Heard(Summary{From: "b", Seq: 2, Version: WireVersion, PoolRunning: 3}, t0.Add(1500*time.Millisecond))
	if p := x.Pool(t0.Add(1500 * time.Millisecond)); p.PoolRunning != 3 {
		t.Fatalf("pool's most run %d with d silent, want b's 3", p.PoolRunning)
	}
}

// Summaries cross the network from peers: any bytes parse to an error or to a summary that encodes back to them.
func FuzzParseSummary(f *testing.F) {
	wire, _ := Summary{From: "a", Seq: 3, Idle: []EndpointCount{{"e", 1}}, Acks: []Ack{{"b", 2}}}.AppendBinary(nil)
	f.Add(wire)
	f.Add([]byte{1, 200, 200, 200, 200, 200})
	wire, _ = Summary{From: "a", Seq: 4, Prefix: []BlockInserts{{"ns/p", []uint64{9, 1 << 60}}, {"ns/q", nil}}}.AppendBinary(nil)
	f.Add(wire)
	wire, _ = Summary{From: "a", Seq: 5, PoolSlots: 4}.AppendVersion(nil, wireVersionSeats)
	f.Add(wire)
	f.Add([]byte{wireVersionPrefix, 1, 'a', 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 4, 'n', 's', '/', 'p', 200, 200, 200, 200, 1})
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := ParseSummary(b)
		if err != nil {
			return
		}
		again, err := s.AppendVersion(nil, s.Version)
		if err != nil {
			t.Fatal(err)
		}
		if back, err := ParseSummary(again); err != nil || !reflect.DeepEqual(back, s) {
			t.Fatalf("%+v did not survive a round trip: %+v, %v", s, back, err)
		}
	})
}

// TestExchangeTakeSpare: a peer's spare places are taken by TakeSpare, not by Take (which takes idle seats, for
// Critical), in turn among the peers it acknowledges as idle seats are; places offered only to requests of tenants under
// their share (SpareProtected) are taken only for those; a place taken is not taken again before the owner acknowledges
// the summary that told of it; the peers' waiting requests of tenants under their share are summed in the pool.
func TestExchangeTakeSpare(t *testing.T) {
	// spareStep takes a place for one request: by TakeSpare (else Take), with its tenant under its share or not.
	type spareStep struct {
		spare, protected bool
		want             string
	}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name      string
		protected bool // b's places are for requests of tenants under their share only
		steps     []spareStep
	}{
		{name: "any request", steps: []spareStep{
			{false, false, ""},     // Take: b lists no idle seat
			{true, false, "b-ep2"}, // seats b-ep1, b-ep2, b-ep2, Seq 7: seat 0 to c, 1 to a, 2 to c
			{true, true, ""},       // a's one place is taken, and b has not counted it yet
		}},
		{name: "protected only", protected: true, steps: []spareStep{
			{true, false, ""}, // a tenant over its share takes none
			{true, true, "b-ep2"},
			{true, true, ""},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := NewExchange("a", time.Second)
			a.Heard(Summary{From: "b", Seq: 7, Spare: []EndpointCount{{"b-ep1", 1}, {"b-ep2", 2}}, SpareProtected: tc.protected,
				ProtectedWaiting: 3, Acks: []Ack{{"a", 0}, {"c", 0}}}, t0)
			a.Heard(Summary{From: "d", Seq: 1, ProtectedWaiting: 2}, t0)
			for i, step := range tc.steps {
				id := fmt.Sprint("r", i)
				var got string
				var ok bool
				if step.spare {
					got, ok = a.TakeSpare(id, 0, t0, step.protected)
				} else {
					got, ok = a.Take(id, 0, t0)
				}
				if got != step.want || ok != (step.want != "") {
					t.Fatalf("step %d: took %q (%v), want %q", i, got, ok, step.want)
				}
			}
			if got := a.Counts(); got != (Counts{SparePlace: 1}) {
				t.Fatalf("counts %+v, want one spare place", got)
			}
			if p := a.Pool(t0); p.ProtectedWaiting != 5 || p.IdleSeats != 0 {
				t.Fatalf("pool %+v, want 5 protected requests waiting at the peers and no idle seat", p)
			}
			// b acknowledges a's summary telling of the place taken, and offers one on b-ep1 to a this time.
			own := a.Next(Summary{}, t0)
			a.Heard(Summary{From: "b", Seq: 8, Spare: []EndpointCount{{"b-ep1", 1}}, Acks: []Ack{{"a", own.Seq}, {"c", 0}}}, t0)
			if got, ok := a.TakeSpare("again", 0, t0, false); !ok || got != "b-ep1" {
				t.Fatalf("took %q (%v) once b counted the first, want b-ep1", got, ok)
			}
		})
	}
}

// TestExchangeOneSeatOnePeerAcrossLists: a free seat a summary lists both as idle (for a peer's Critical request)
// and as a spare place (for a peer's waiting request) goes to one peer whichever list it is taken from, whatever the
// summary's turn.
func TestExchangeOneSeatOnePeerAcrossLists(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	free := map[string]int{"b-ep0": 1, "b-ep1": 1, "b-ep2": 1}
	for seq := uint64(1); seq <= 4; seq++ {
		summary := Summary{From: "b", Seq: seq, Idle: []EndpointCount{{"b-ep0", 1}, {"b-ep1", 1}},
			Spare: []EndpointCount{{"b-ep1", 1}, {"b-ep2", 1}}, Acks: []Ack{{"a", 0}, {"c", 0}}}
		takers := map[string]map[string]bool{} // endpoint: the replicas that took a seat there
		for _, self := range []string{"a", "c"} {
			for _, spare := range []bool{false, true} {
				x := NewExchange(self, time.Second)
				x.Heard(summary, t0)
				for i := range 3 {
					id := fmt.Sprint("r", i)
					var endpoint string
					var ok bool
					if spare {
						endpoint, ok = x.TakeSpare(id, 0, t0, true)
					} else {
						endpoint, ok = x.Take(id, 0, t0)
					}
					if !ok {
						break
					}
					if takers[endpoint] == nil {
						takers[endpoint] = map[string]bool{}
					}
					takers[endpoint][self] = true
				}
			}
		}
		for endpoint, by := range takers {
			if len(by) > free[endpoint] {
				t.Errorf("Seq %d: %s has %d free seat(s), taken by %v", seq, endpoint, free[endpoint], by)
			}
		}
	}
}

// TestExchangeCounts: requests sent to peers' endpoints count by how they went there, each once.
func TestExchangeCounts(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	a := NewExchange("a", time.Hour)
	a.Heard(Summary{From: "b", Seq: 1, Idle: []EndpointCount{{"b-ep", 1}}, Acks: []Ack{{"a", 0}}}, t0)
	if _, ok := a.Take("c1", 0, t0); !ok {
		t.Fatal("took no seat")
	}
	a.SentTo("c1", "b-ep", 0, ForPrefix, t0) // already recorded by Take: neither re-recorded nor counted again
	a.SentTo("p1", "b-ep", 0, ForPrefix, t0)
	a.SentTo("p1", "b-ep", 0, ForPrefix, t0)
	a.SentTo("l1", "b-ep", 0, ForAdapter, t0)
	if got := a.Counts(); got != (Counts{IdleSeat: 1, PrefixAffinity: 1, AdapterAffinity: 1}) {
		t.Fatalf("counts %+v, want one idle seat, one for prefix affinity and one for adapter affinity", got)
	}
	if own := a.Next(Summary{}, t0); len(own.Sent) != 1 || own.Sent[0].N != 3 {
		t.Fatalf("summary tells of %v, want 3 requests on b-ep", own.Sent)
	}
}

// TestExchangeSentTokens: a replica's summary tells, per peer's endpoint, the KV size its requests there reach at their
// ends; the owner sums them per endpoint over its peers (Pool.LoadTokens). A peer of the release before them (version
// 7: the rolling upgrade) tells none: its requests count in Load and, being of unknown size, in LoadUnsized.
func TestExchangeSentTokens(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	b := NewExchange("b", time.Second)
	b.SentTo("b1", "a-ep1", 680, ForPrefix, t0)
	b.SentTo("b2", "a-ep1", 1000, ForPrefix, t0)
	b.SentTo("b3", "a-ep2", 500, ForPrefix, t0)
	own := b.Next(Summary{}, t0)
	if !reflect.DeepEqual(own.Sent, []EndpointCount{{"a-ep1", 2}, {"a-ep2", 1}}) || !reflect.DeepEqual(own.SentTokens, []int{1680, 500}) {
		t.Fatalf("b tells %v with %v tokens, want a-ep1 2 (1680), a-ep2 1 (500)", own.Sent, own.SentTokens)
	}
	c := NewExchange("c", time.Second)
	c.SentTo("c1", "a-ep1", 700, ForPrefix, t0)
	c.SentTo("c2", "a-ep3", 700, ForPrefix, t0)
	older := c.Next(Summary{}, t0)
	for _, tc := range []struct {
		name            string
		cVersion        byte
		tokens, unsized map[string]int
	}{
		{name: "both tell sizes", cVersion: WireVersion,
			tokens: map[string]int{"a-ep1": 2380, "a-ep2": 500, "a-ep3": 700}, unsized: map[string]int{}},
		{name: "c of the release before", cVersion: wireVersionUnseated,
			tokens: map[string]int{"a-ep1": 1680, "a-ep2": 500}, unsized: map[string]int{"a-ep1": 1, "a-ep3": 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := NewExchange("a", time.Second)
			for _, s := range []struct {
				sum Summary
				v   byte
			}{{own, WireVersion}, {older, tc.cVersion}} {
				wire, err := s.sum.AppendVersion(nil, s.v)
				if err != nil {
					t.Fatal(err)
				}
				got, err := ParseSummary(wire)
				if err != nil {
					t.Fatal(err)
				}
				a.Heard(got, t0)
			}
			p := a.Pool(t0)
			if want := map[string]int{"a-ep1": 3, "a-ep2": 1, "a-ep3": 1}; !reflect.DeepEqual(p.Load, want) {
				t.Errorf("load %v, want %v", p.Load, want)
			}
			if !reflect.DeepEqual(p.LoadTokens, tc.tokens) || !reflect.DeepEqual(p.LoadUnsized, tc.unsized) {
				t.Errorf("tokens %v, unsized %v; want %v, %v", p.LoadTokens, p.LoadUnsized, tc.tokens, tc.unsized)
			}
		})
	}
}

// TestExchangeUnknownSizeUnsized: a request whose size its sender does not know is told with 0 tokens, which the owner
// counts as of unknown size (its endpoint's KV room then unknown), never as a request that holds nothing; beside
// requests of known size on the same endpoint too, whose sum would otherwise undercount what the endpoint holds.
func TestExchangeUnknownSizeUnsized(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	b := NewExchange("b", time.Second)
	b.SentTo("b1", "a-ep1", 0, ForPrefix, t0)
	b.SentTo("b2", "a-ep2", 500, ForPrefix, t0)
	b.SentTo("b3", "a-ep3", 700, ForPrefix, t0)
	b.SentTo("b4", "a-ep3", 0, ForPrefix, t0)
	wire, err := b.Next(Summary{}, t0).AppendVersion(nil, WireVersion)
	if err != nil {
		t.Fatal(err)
	}
	got, err := ParseSummary(wire)
	if err != nil {
		t.Fatal(err)
	}
	a := NewExchange("a", time.Second)
	a.Heard(got, t0)
	p := a.Pool(t0)
	if want := map[string]int{"a-ep2": 500}; !reflect.DeepEqual(p.LoadTokens, want) {
		t.Errorf("tokens %v, want %v", p.LoadTokens, want)
	}
	if want := map[string]int{"a-ep1": 1, "a-ep3": 2}; !reflect.DeepEqual(p.LoadUnsized, want) {
		t.Errorf("unsized %v, want %v", p.LoadUnsized, want)
	}
}
