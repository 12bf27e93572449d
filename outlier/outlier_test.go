package outlier

import (
	"slices"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func at(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }

// step is one response observed, or one pick checked: at ms, endpoint answered status; when status is 0, the
// candidates in pick are offered and want names those left out.
type step struct {
	ms       int
	endpoint string
	status   int
	pick     []string
	want     []string
}

func TestDetector(t *testing.T) {
	cfg := Config{Consecutive5xx: 3, BaseEjectionTime: time.Second, MaxEjectionTime: 3 * time.Second, MaxEjectionPercent: 50}
	local := cfg
	local.LocalConsecutive5xx = 2
	abc := []string{"a", "b", "c"}
	tests := []struct {
		name  string
		cfg   Config
		steps []step
	}{
		{name: "below the threshold nothing is ejected", cfg: cfg, steps: []step{
			{ms: 0, endpoint: "a", status: 500}, {ms: 1, endpoint: "a", status: 503},
			{ms: 2, pick: abc, want: nil},
		}},
		{name: "the threshold ejects for the base time", cfg: cfg, steps: []step{
			{ms: 0, endpoint: "a", status: 500}, {ms: 1, endpoint: "a", status: 500}, {ms: 2, endpoint: "a", status: 502},
			{ms: 2, pick: abc, want: []string{"a"}},
			{ms: 1001, pick: abc, want: []string{"a"}},
			{ms: 1002, pick: abc, want: nil},
		}},
		{name: "a success in between resets the count", cfg: cfg, steps: []step{
			{ms: 0, endpoint: "a", status: 500}, {ms: 1, endpoint: "a", status: 500}, {ms: 2, endpoint: "a", status: 200},
			{ms: 3, endpoint: "a", status: 500}, {ms: 4, endpoint: "a", status: 500},
			{ms: 5, pick: abc, want: nil},
		}},
		{name: "4xx counts as success", cfg: cfg, steps: []step{
			{ms: 0, endpoint: "a", status: 500}, {ms: 1, endpoint: "a", status: 500}, {ms: 2, endpoint: "a", status: 429},
			{ms: 3, endpoint: "a", status: 500},
			{ms: 4, pick: abc, want: nil},
		}},
		{name: "statuses out of range are ignored", cfg: cfg, steps: []step{
			{ms: 0, endpoint: "a", status: 500}, {ms: 1, endpoint: "a", status: 500}, {ms: 2, endpoint: "a", status: 0},
			{ms: 2, endpoint: "a", status: 600}, {ms: 3, endpoint: "a", status: 500},
			{ms: 4, pick: abc, want: []string{"a"}},
		}},
		{name: "after an ejection one 5xx ejects again, for longer, up to the cap", cfg: cfg, steps: []step{
			{ms: 0, endpoint: "a", status: 500}, {ms: 0, endpoint: "a", status: 500}, {ms: 0, endpoint: "a", status: 500},
			{ms: 1000, pick: abc, want: nil},
			{ms: 1000, endpoint: "a", status: 500}, // 2nd ejection: 2 s
			{ms: 2999, pick: abc, want: []string{"a"}},
			{ms: 3000, pick: abc, want: nil},
			{ms: 3000, endpoint: "a", status: 500}, // 3rd: 3 s (the cap)
			{ms: 5999, pick: abc, want: []string{"a"}},
			{ms: 6000, endpoint: "a", status: 500}, // 4th: still 3 s
			{ms: 8999, pick: abc, want: []string{"a"}},
			{ms: 9000, pick: abc, want: nil},
		}},
		{name: "a success after an ejection starts over", cfg: cfg, steps: []step{
			{ms: 0, endpoint: "a", status: 500}, {ms: 0, endpoint: "a", status: 500}, {ms: 0, endpoint: "a", status: 500},
			{ms: 1000, endpoint: "a", status: 200},
			{ms: 1001, endpoint: "a", status: 500}, {ms: 1002, endpoint: "a", status: 500},
			{ms: 1003, pick: abc, want: nil},
			{ms: 1004, endpoint: "a", status: 500}, // a first ejection again: 1 s
			{ms: 2003, pick: abc, want: []string{"a"}},
			{ms: 2004, pick: abc, want: nil},
		}},
		{name: "5xx of requests sent before the ejection do not extend it", cfg: cfg, steps: []step{
			{ms: 0, endpoint: "a", status: 500}, {ms: 0, endpoint: "a", status: 500}, {ms: 0, endpoint: "a", status: 500},
			{ms: 500, endpoint: "a", status: 500}, {ms: 900, endpoint: "a", status: 500},
			{ms: 1000, pick: abc, want: nil},
		}},
		{name: "at most half the candidates, the longest-ejected first", cfg: cfg, steps: []step{
			{ms: 0, endpoint: "b", status: 500}, {ms: 0, endpoint: "b", status: 500}, {ms: 0, endpoint: "b", status: 500},
			{ms: 10, endpoint: "a", status: 500}, {ms: 10, endpoint: "a", status: 500}, {ms: 10, endpoint: "a", status: 500},
			{ms: 20, pick: abc, want: []string{"b"}},
			{ms: 20, pick: []string{"a", "b", "c", "d"}, want: []string{"a", "b"}},
			{ms: 20, pick: []string{"a", "c"}, want: []string{"a"}},
		}},
		{name: "never the only candidate", cfg: cfg, steps: []step{
			{ms: 0, endpoint: "a", status: 500}, {ms: 0, endpoint: "a", status: 500}, {ms: 0, endpoint: "a", status: 500},
			{ms: 1, pick: []string{"a"}, want: nil},
			{ms: 1, pick: nil, want: nil},
		}},
		{name: "at least one of two or more, however small the percent", cfg: Config{Consecutive5xx: 1, BaseEjectionTime: time.Second, MaxEjectionTime: time.Second, MaxEjectionPercent: 10}, steps: []step{
			{ms: 0, endpoint: "a", status: 500}, {ms: 0, endpoint: "b", status: 500},
			{ms: 1, pick: abc, want: []string{"a"}},
		}},
		{name: "0 percent ejects nothing", cfg: Config{Consecutive5xx: 1, BaseEjectionTime: time.Second, MaxEjectionTime: time.Second, MaxEjectionPercent: 0}, steps: []step{
			{ms: 0, endpoint: "a", status: 500},
			{ms: 1, pick: abc, want: nil},
		}},
		{name: "the local rule: two 5xx in a row eject while a peer's latest answer was a success", cfg: local, steps: []step{
			{ms: 0, endpoint: "b", status: 200}, {ms: 1, endpoint: "a", status: 500},
			{ms: 2, pick: abc, want: nil},
			{ms: 3, endpoint: "a", status: 500},
			{ms: 4, pick: abc, want: []string{"a"}},
			{ms: 1003, pick: abc, want: nil},
		}},
		{name: "the local rule: a peer that failed since does not count", cfg: local, steps: []step{
			{ms: 0, endpoint: "b", status: 200}, {ms: 1, endpoint: "b", status: 500},
			{ms: 2, endpoint: "a", status: 500}, {ms: 3, endpoint: "a", status: 500},
			{ms: 4, pick: abc, want: nil},
		}},
		{name: "the local rule: a peer's success older than the window does not count", cfg: local, steps: []step{
			{ms: 0, endpoint: "b", status: 200},
			{ms: 10001, endpoint: "a", status: 500}, {ms: 10002, endpoint: "a", status: 500},
			{ms: 10003, pick: abc, want: nil},
			{ms: 10004, endpoint: "c", status: 200}, {ms: 10005, endpoint: "a", status: 500},
			{ms: 10006, pick: abc, want: []string{"a"}},
		}},
		{name: "the local rule: a pool-wide failure needs the full count", cfg: local, steps: []step{
			{ms: 0, endpoint: "a", status: 500}, {ms: 1, endpoint: "b", status: 500}, {ms: 2, endpoint: "a", status: 500},
			{ms: 3, endpoint: "b", status: 500}, {ms: 4, pick: abc, want: nil},
			{ms: 5, endpoint: "a", status: 500}, {ms: 6, pick: abc, want: []string{"a"}},
		}},
		{name: "the local rule: the endpoint's own success is no peer's, and resets its count", cfg: local, steps: []step{
			{ms: 0, endpoint: "a", status: 500}, {ms: 1, endpoint: "a", status: 200}, {ms: 2, endpoint: "a", status: 500},
			{ms: 3, endpoint: "a", status: 500},
			{ms: 4, pick: abc, want: nil},
		}},
		{name: "the local rule off (0): only the full count ejects", cfg: cfg, steps: []step{
			{ms: 0, endpoint: "a", status: 500}, {ms: 1, endpoint: "b", status: 200}, {ms: 2, endpoint: "a", status: 500},
			{ms: 3, pick: abc, want: nil},
		}},
		{name: "the local rule at 1: one 5xx while a peer is healthy", cfg: Config{Consecutive5xx: 3, LocalConsecutive5xx: 1, BaseEjectionTime: time.Second, MaxEjectionTime: time.Second, MaxEjectionPercent: 50}, steps: []step{
			{ms: 0, endpoint: "a", status: 500}, {ms: 1, pick: abc, want: nil},
			{ms: 2, endpoint: "b", status: 200}, {ms: 1002, endpoint: "a", status: 500},
			{ms: 1003, pick: abc, want: []string{"a"}},
		}},
		{name: "100 percent still leaves one", cfg: Config{Consecutive5xx: 1, BaseEjectionTime: time.Second, MaxEjectionTime: time.Second, MaxEjectionPercent: 100}, steps: []step{
			{ms: 0, endpoint: "c", status: 500}, {ms: 1, endpoint: "b", status: 500}, {ms: 2, endpoint: "a", status: 500},
			{ms: 3, pick: abc, want: []string{"b", "c"}},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, err := New(tt.cfg)
			if err != nil {
				t.Fatal(err)
			}
			for i, s := range tt.steps {
				if s.status != 0 || s.endpoint != "" {
					d.Observe(at(s.ms), s.endpoint, s.status)
					continue
				}
				out := make([]bool, len(s.pick))
				n := d.Eject(at(s.ms), s.pick, out)
				var got []string
				for j, e := range out {
					if e {
						got = append(got, s.pick[j])
					}
				}
				if !slices.Equal(got, s.want) || n != len(s.want) {
					t.Errorf("step %d (at %d ms, candidates %v): left out %v (n=%d), want %v", i, s.ms, s.pick, got, n, s.want)
				}
			}
		})
	}
}

func TestForgetsIdleEndpoints(t *testing.T) {
	d, err := New(Config{Consecutive5xx: 1, BaseEjectionTime: time.Second, MaxEjectionTime: time.Second, MaxEjectionPercent: 50})
	if err != nil {
		t.Fatal(err)
	}
	d.Observe(at(0), "gone", 500)
	d.Observe(at(2000), "b", 500) // "gone" failed last 2 s ago: kept
	if len(d.endpoints) != 2 {
		t.Fatalf("records: %d, want 2", len(d.endpoints))
	}
	d.Observe(at(2001), "b", 500)
	if _, ok := d.endpoints["gone"]; ok {
		t.Error("an endpoint idle for more than twice the max ejection time is still recorded")
	}
	if d.Clean() {
		t.Error("Clean with a failing endpoint")
	}
	d.Observe(at(2002), "b", 200)
	if len(d.endpoints) != 0 || !d.Clean() {
		t.Errorf("a success left a record: %v", d.endpoints)
	}
	d.Observe(at(2003), "c", 200)
	d.Observe(at(20003), "b", 200) // a window later: c's success is pruned
	if len(d.healthy) != 1 {
		t.Errorf("healthy peers recorded: %v, want b only", d.healthy)
	}
}

func TestConfigValidate(t *testing.T) {
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatalf("default: %v", err)
	}
	bad := Config{Consecutive5xx: 0, LocalConsecutive5xx: 2, BaseEjectionTime: 0, MaxEjectionTime: -1, MaxEjectionPercent: 101}
	err := bad.Validate()
	if err == nil {
		t.Fatal("no error")
	}
	for _, field := range []string{"consecutive5xx", "localConsecutive5xx", "baseEjectionTime", "maxEjectionTime", "maxEjectionPercent"} {
		if !strings.Contains(err.Error(), field) {
			t.Errorf("error %q does not name %s", err, field)
		}
	}
	if _, err := New(bad); err == nil {
		t.Error("New accepted an invalid config")
	}
}

// TestObserveReportsEjections: Observe returns the length of the ejection a response starts, and 0 for every other
// response, so an ejection is reported once.
func TestObserveReportsEjections(t *testing.T) {
	d, err := New(Config{Consecutive5xx: 3, LocalConsecutive5xx: 2, BaseEjectionTime: time.Second, MaxEjectionTime: 2 * time.Second, MaxEjectionPercent: 50})
	if err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		ms       int
		endpoint string
		status   int
		want     Ejection
	}{
		{0, "a", 500, Ejection{}},
		{1, "a", 500, Ejection{}},
		{2, "a", 500, Ejection{time.Second, Consecutive5xxReason}},
		{3, "a", 500, Ejection{}}, // already ejected
		{1002, "a", 500, Ejection{2 * time.Second, RepeatReason}},
		{3002, "a", 500, Ejection{2 * time.Second, RepeatReason}}, // the cap
		{5002, "a", 200, Ejection{}},
		{5003, "a", 500, Ejection{}},
		{5004, "b", 200, Ejection{}},
		{5005, "a", 500, Ejection{time.Second, Local5xxReason}},
	}
	for i, s := range steps {
		if got := d.Observe(at(s.ms), s.endpoint, s.status); got != s.want {
			t.Errorf("step %d (%s %d at %d ms): %+v, want %+v", i, s.endpoint, s.status, s.ms, got, s.want)
		}
	}
	if got := d.Ejected(at(5005)); got != 1 {
		t.Errorf("Ejected: %d, want 1", got)
	}
	if got := d.Ejected(at(6005)); got != 0 {
		t.Errorf("Ejected once the ejection ended: %d, want 0", got)
	}
}

// TestSlowEjections: a slow ejection (ObserveSlow) is kept apart from the 5xx record: the slowed server's successful
// answers do not end it, an endpoint ejected for both counts once, a normal pace clears it only after it ended, and
// its repeats grow as 5xx ejections do.
func TestSlowEjections(t *testing.T) {
	d, err := New(paceConfig)
	if err != nil {
		t.Fatal(err)
	}
	abc := []string{"a", "b", "c"}
	out := make([]bool, len(abc))
	left := func(ms int) []string {
		d.Eject(at(ms), abc, out)
		var got []string
		for i, l := range out {
			if l {
				got = append(got, abc[i])
			}
		}
		return got
	}
	steps := []struct {
		name string
		do   func()
		ms   int
		want []string
		n    int // Ejected
	}{
		{"slow ejects", func() { d.ObserveSlow(at(0), "a") }, 1, []string{"a"}, 1},
		{"a success does not end it", func() { d.Observe(at(2), "a", 200) }, 3, []string{"a"}, 1},
		{"a normal pace during it does not clear it", func() {
			if d.ObservePaced(at(4), "a") {
				t.Error("ObservePaced cleared an ejection in course")
			}
		}, 5, []string{"a"}, 1},
		{"5xx too: counted once", func() {
			d.Observe(at(6), "a", 500)
			d.Observe(at(7), "a", 500)
			d.Observe(at(8), "a", 500)
			d.Observe(at(9), "a", 500)
			d.Observe(at(10), "a", 500)
		}, 11, []string{"a"}, 1},
		{"slow again at the end: twice as long", func() {
			if e := d.ObserveSlow(at(1005), "a"); e != (Ejection{2 * time.Second, SlowReason}) {
				t.Errorf("second slow ejection %+v", e)
			}
		}, 3004, []string{"a"}, 1},
		{"over", func() {}, 3005, nil, 0},
		{"a normal pace after it clears it", func() {
			if !d.ObservePaced(at(3006), "a") {
				t.Error("ObservePaced kept an ended ejection")
			}
			d.Observe(at(3006), "a", 200)
		}, 3007, nil, 0},
		{"then slow is a first ejection again", func() {
			if e := d.ObserveSlow(at(3008), "a"); e != (Ejection{time.Second, SlowReason}) {
				t.Errorf("slow ejection after a normal pace %+v", e)
			}
		}, 4007, []string{"a"}, 1},
	}
	for _, s := range steps {
		s.do()
		if got := left(s.ms); !slices.Equal(got, s.want) {
			t.Errorf("%s: left out %v, want %v", s.name, got, s.want)
		}
		if n := d.Ejected(at(s.ms)); n != s.n {
			t.Errorf("%s: Ejected %d, want %d", s.name, n, s.n)
		}
	}
	if d.Clean() {
		t.Error("Clean with a slow record")
	}
}
