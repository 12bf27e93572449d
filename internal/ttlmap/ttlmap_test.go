package ttlmap

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// op is one step of a table: at t0+at, do what is set, then compare the results and the map's content.
type op struct {
	at   time.Duration
	do   string // put, get, take, delete, drop, expire
	key  string
	val  int
	want string // the call's result: "-" for none, "7" for a value, "a=7" for DropOldest
	// expired lists the entries onExpire received during the call, "k=v" in order.
	expired []string
	// keys is the map's content after the call, oldest first.
	keys []string
}

func TestMap(t *testing.T) {
	tests := []struct {
		name string
		ops  []op
	}{
		{"put, get, take, delete", []op{
			{do: "put", key: "a", val: 1, want: "-", keys: []string{"a"}},
			{do: "put", key: "b", val: 2, want: "-", keys: []string{"a", "b"}},
			{do: "get", key: "a", want: "1", keys: []string{"a", "b"}},
			{do: "get", key: "x", want: "-", keys: []string{"a", "b"}},
			{do: "take", key: "a", want: "1", keys: []string{"b"}},
			{do: "take", key: "a", want: "-", keys: []string{"b"}},
			{do: "delete", key: "b", want: "2", keys: nil},
			{do: "delete", key: "b", want: "-", keys: nil},
		}},
		{"an entry expires exactly ttl after it was stored", []op{
			{do: "put", key: "a", val: 1, want: "-", keys: []string{"a"}},
			{at: 30 * time.Second, do: "put", key: "b", val: 2, want: "-", keys: []string{"a", "b"}},
			{at: time.Minute - 1, do: "get", key: "a", want: "1", keys: []string{"a", "b"}},
			{at: time.Minute, do: "get", key: "a", want: "-", expired: []string{"a=1"}, keys: []string{"b"}},
			{at: 90 * time.Second, do: "expire", expired: []string{"b=2"}, keys: nil},
		}},
		{"storing again replaces the value and resets the age", []op{
			{do: "put", key: "a", val: 1, want: "-", keys: []string{"a"}},
			{at: 10 * time.Second, do: "put", key: "b", val: 2, want: "-", keys: []string{"a", "b"}},
			{at: 50 * time.Second, do: "put", key: "a", val: 3, want: "1", keys: []string{"b", "a"}},
			{at: 70 * time.Second, do: "get", key: "a", want: "3", expired: []string{"b=2"}, keys: []string{"a"}},
			{at: 110 * time.Second, do: "expire", expired: []string{"a=3"}, keys: nil},
		}},
		{"every call that takes now expires first", []op{
			{do: "put", key: "a", val: 1, want: "-", keys: []string{"a"}},
			{do: "put", key: "b", val: 2, want: "-", keys: []string{"a", "b"}},
			{at: time.Minute, do: "put", key: "c", val: 3, want: "-", expired: []string{"a=1", "b=2"}, keys: []string{"c"}},
			{at: 2 * time.Minute, do: "take", key: "c", want: "-", expired: []string{"c=3"}, keys: nil},
		}},
		{"update changes a value in place, keeping its age", []op{
			{do: "put", key: "a", val: 1, want: "-", keys: []string{"a"}},
			{at: 10 * time.Second, do: "put", key: "b", val: 2, want: "-", keys: []string{"a", "b"}},
			{at: 50 * time.Second, do: "update", key: "a", val: 5, want: "5", keys: []string{"a", "b"}},
			{at: 50 * time.Second, do: "update", key: "x", val: 5, want: "-", keys: []string{"a", "b"}},
			{at: time.Minute, do: "update", key: "a", val: 6, want: "-", expired: []string{"a=5"}, keys: []string{"b"}},
		}},
		{"an expired entry is not replaced but stored anew", []op{
			{do: "put", key: "a", val: 1, want: "-", keys: []string{"a"}},
			{at: time.Minute, do: "put", key: "a", val: 2, want: "-", expired: []string{"a=1"}, keys: []string{"a"}},
		}},
		{"delete and drop remove without onExpire", []op{
			{do: "put", key: "a", val: 1, want: "-", keys: []string{"a"}},
			{do: "put", key: "b", val: 2, want: "-", keys: []string{"a", "b"}},
			{do: "put", key: "c", val: 3, want: "-", keys: []string{"a", "b", "c"}},
			{do: "drop", want: "a=1", keys: []string{"b", "c"}},
			{at: 2 * time.Minute, do: "delete", key: "b", want: "2", keys: []string{"c"}},
			{at: 2 * time.Minute, do: "drop", want: "c=3", keys: nil},
			{at: 2 * time.Minute, do: "drop", want: "-", keys: nil},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var expired []string
			m := New(time.Minute, func(k string, v int) { expired = append(expired, fmt.Sprintf("%s=%d", k, v)) })
			for i, o := range tt.ops {
				expired = nil
				now := t0.Add(o.at)
				got := "-"
				show := func(v int, ok bool) {
					if ok {
						got = fmt.Sprint(v)
					}
				}
				switch o.do {
				case "put":
					show(m.Put(now, o.key, o.val))
				case "get":
					show(m.Get(now, o.key))
				case "take":
					show(m.Take(now, o.key))
				case "update":
					var after int
					show(after, m.Update(now, o.key, func(v *int) { *v, after = o.val, o.val }))
				case "delete":
					show(m.Delete(o.key))
				case "drop":
					if k, v, ok := m.DropOldest(); ok {
						got = fmt.Sprintf("%s=%d", k, v)
					}
				case "expire":
					m.Expire(now)
				default:
					t.Fatalf("op %d: unknown op %q", i, o.do)
				}
				if o.do != "expire" && got != o.want {
					t.Errorf("op %d (%s %s at %v): got %s, want %s", i, o.do, o.key, o.at, got, o.want)
				}
				if !slices.Equal(expired, o.expired) {
					t.Errorf("op %d (%s %s at %v): onExpire got %v, want %v", i, o.do, o.key, o.at, expired, o.expired)
				}
				if keys := keysOf(m); !slices.Equal(keys, o.keys) || m.Len() != len(o.keys) {
					t.Errorf("op %d (%s %s at %v): keys %v (Len %d), want %v", i, o.do, o.key, o.at, keys, m.Len(), o.keys)
				}
			}
		})
	}
}

// keysOf lists m's keys in expiry order.
func keysOf[V any](m *Map[string, V]) []string {
	var out []string
	for el := m.order.Front(); el != nil; el = el.Next() {
		out = append(out, el.Value.(*entry[string, V]).key)
	}
	return out
}

// TestMapAgainstModel checks Map against a plain map of (value, stored at) over seeded random operations and clock
// steps: every result and every expiry agrees, and the index and the order hold the same entries.
func TestMapAgainstModel(t *testing.T) {
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 7))
		const ttl = 10 * time.Second
		type stored struct {
			v  int
			at time.Time
		}
		model := map[int]stored{}
		expireModel := func(now time.Time) int {
			n := 0
			for k, s := range model {
				if !now.Before(s.at.Add(ttl)) {
					delete(model, k)
					n++
				}
			}
			return n
		}
		expired := 0
		m := New(ttl, func(int, int) { expired++ })
		now := t0
		for i := range 5000 {
			now = now.Add(time.Duration(rng.IntN(300)) * time.Millisecond)
			k, v := rng.IntN(200), rng.Int()
			before := expired
			var wantExpired int
			switch rng.IntN(4) {
			case 0, 1:
				wantExpired = expireModel(now)
				old, wasThere := model[k]
				got, replaced := m.Put(now, k, v)
				if replaced != wasThere || (replaced && got != old.v) {
					t.Fatalf("seed %d op %d: Put replaced %v (%d), model %v (%d)", seed, i, replaced, got, wasThere, old.v)
				}
				model[k] = stored{v, now}
			case 2:
				wantExpired = expireModel(now)
				want, ok := model[k]
				delete(model, k)
				if got, gotOK := m.Take(now, k); gotOK != ok || got != want.v {
					t.Fatalf("seed %d op %d: Take %d, %v; model %d, %v", seed, i, got, gotOK, want.v, ok)
				}
			default:
				wantExpired = expireModel(now)
				want, ok := model[k]
				if got, gotOK := m.Get(now, k); gotOK != ok || got != want.v {
					t.Fatalf("seed %d op %d: Get %d, %v; model %d, %v", seed, i, got, gotOK, want.v, ok)
				}
			}
			if expired-before != wantExpired {
				t.Fatalf("seed %d op %d: %d entries expired, model %d", seed, i, expired-before, wantExpired)
			}
			if m.Len() != len(model) || len(m.entries) != len(model) {
				t.Fatalf("seed %d op %d: Len %d, index %d, model %d", seed, i, m.Len(), len(m.entries), len(model))
			}
		}
	}
}

func BenchmarkPutTake(b *testing.B) {
	m := New[string, int](time.Minute, nil)
	ids := make([]string, 1024)
	for i := range ids {
		ids[i] = fmt.Sprint("request-", i)
	}
	now := t0
	i := 0
	for b.Loop() {
		id := ids[i%len(ids)]
		m.Put(now, id, i)
		m.Take(now, id)
		now = now.Add(time.Microsecond)
		i++
	}
}
