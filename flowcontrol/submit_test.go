package flowcontrol

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/testbed/eventclock"
)

// submitted collects Submit callbacks by request ID.
type submitted struct {
	t     *testing.T
	got   map[string][]Decision
	errs  map[string]error
	order []string
}

func newSubmitted(t *testing.T) *submitted {
	return &submitted{t: t, got: map[string][]Decision{}, errs: map[string]error{}}
}

func (s *submitted) callback(id string) func(Decision, error) {
	return func(d Decision, err error) {
		s.got[id] = append(s.got[id], d)
		s.errs[id] = err
		s.order = append(s.order, id)
	}
}

func (s *submitted) want(id string, o Outcome, r Reason) Decision {
	s.t.Helper()
	ds := s.got[id]
	if len(ds) != 1 {
		s.t.Fatalf("%s: %d callbacks, want 1", id, len(ds))
	}
	if ds[0].Outcome != o || ds[0].Reason != r {
		s.t.Fatalf("%s: got %s/%q, want %s/%q", id, ds[0].Outcome, ds[0].Reason, o, r)
	}
	if (s.errs[id] == nil) != (o == Dispatched) {
		s.t.Fatalf("%s: outcome %s with error %v", id, o, s.errs[id])
	}
	return ds[0]
}

func newStepController(t *testing.T, cfg *Config) (*Controller, *eventclock.Clock) {
	t.Helper()
	clk := eventclock.New(t0)
	c, err := New(cfg, Deps{Clock: clk, Rand: rand.New(rand.NewPCG(1, 2)), SynchronousTimers: true})
	if err != nil {
		t.Fatal(err)
	}
	return c, clk
}

func TestSubmitDecidesLikeAdmit(t *testing.T) {
	c, clk := newStepController(t, testConfig(t, nil))
	s := newSubmitted(t)
	scrape := func(waiting ...int) {
		var eps []Endpoint
		for i, w := range waiting {
			eps = append(eps, Endpoint{Name: fmt.Sprintf("e%d", i), WaitingQueue: w, ScrapedAt: clk.Now()})
		}
		if err := c.UpdateEndpoints(eps); err != nil {
			t.Fatal(err)
		}
	}

	// No fresh endpoint: Unavailable, before Submit returns.
	c.Submit(Request{ID: "none", Bytes: 1}, s.callback("none"))
	s.want("none", Unavailable, ReasonNoEndpoints)
	var fe *Error
	if !errors.As(s.errs["none"], &fe) || !errors.Is(fe, ErrUnavailable) {
		t.Fatalf("error %v, want an *Error matching ErrUnavailable", s.errs["none"])
	}

	// Headroom: dispatched on the fast path, before Submit returns.
	scrape(0, 9)
	c.Submit(Request{ID: "fast", Bytes: 1}, s.callback("fast"))
	if d := s.want("fast", Dispatched, ReasonNone); len(d.Endpoints) != 1 || d.Endpoints[0] != "e0" {
		t.Fatalf("fast path endpoints %v, want [e0]", d.Endpoints)
	}

	// Saturated: Standard waits, Sheddable is rejected at once.
	scrape(9, 9)
	c.Submit(Request{ID: "wait"}, s.callback("wait"))
	c.Submit(Request{ID: "shed", Priority: -1}, s.callback("shed"))
	if len(s.got["wait"]) != 0 {
		t.Fatal("a request without headroom was decided at once")
	}
	s.want("shed", Rejected, ReasonSaturated)

	// Headroom appears: the waiting request is decided inside UpdateEndpoints.
	clk.Step(time.Second)
	scrape(9, 0)
	if d := s.want("wait", Dispatched, ReasonNone); d.Waited != time.Second {
		t.Fatalf("waited %v, want 1s", d.Waited)
	}
	if !c.Bind("wait", "e1") || !c.Release("wait") {
		t.Fatal("a dispatched submitted request holds no reservation")
	}

	// Cancel withdraws a waiting request once.
	scrape(9, 9)
	c.Submit(Request{ID: "gone"}, s.callback("gone"))
	if !c.Cancel("gone") || c.Cancel("gone") || c.Cancel("unknown") {
		t.Fatal("Cancel must withdraw a waiting request exactly once")
	}
	s.want("gone", Cancelled, ReasonCancelled)
	if !errors.Is(s.errs["gone"], ErrWithdrawn) || !errors.Is(s.errs["gone"], ErrCancelled) {
		t.Fatalf("cancel error %v, want ErrWithdrawn and ErrCancelled", s.errs["gone"])
	}

	// The queue timeout fires on the clock, inline with SynchronousTimers.
	c.Submit(Request{ID: "late"}, s.callback("late"))
	clk.Step(testConfig(t, nil).Bands[Standard].MaxQueueTime)
	s.want("late", Rejected, ReasonQueueTimeout)
	if st := c.Stats(); st.Queued != [NumBands]int{} {
		t.Fatalf("queues %v after every request was decided", st.Queued)
	}
}

// TestSubmitRandomizedExactlyOneCallback drives random submissions, scrapes, releases, cancellations and clock steps
// from one goroutine, as a discrete-event simulation does: every submitted request gets exactly one callback, and
// the same seed yields the same decisions in the same order.
func TestSubmitRandomizedExactlyOneCallback(t *testing.T) {
	seed := testSeed(t)
	t.Logf("seed %d (rerun with FLOWCONTROL_SEED=%d)", seed, seed)
	run := func() []string {
		rng := rand.New(rand.NewPCG(seed, 7))
		cfg := randomConfig(rng)
		clk := eventclock.New(t0)
		c, err := New(cfg, Deps{Clock: clk, Rand: rand.New(rand.NewPCG(seed, 8)), SynchronousTimers: true})
		if err != nil {
			t.Fatal(err)
		}
		s := newSubmitted(t)
		var ids, dispatched []string
		for n := 0; n < 600; n++ {
			switch op := rng.IntN(10); {
			case op < 4:
				id := fmt.Sprintf("r%d", n)
				ids = append(ids, id)
				cb := s.callback(id)
				c.Submit(Request{ID: id, Tenant: fmt.Sprintf("t%d", rng.IntN(4)), Priority: rng.IntN(3) - 1,
					Bytes: int64(rng.IntN(200)), EstimatedCost: uint64(rng.IntN(500))}, func(d Decision, err error) {
					if d.Outcome == Dispatched {
						dispatched = append(dispatched, id)
					}
					cb(d, err)
				})
			case op < 6:
				var eps []Endpoint
				for _, name := range []string{"a", "b", "c"} {
					if rng.IntN(4) > 0 {
						eps = append(eps, Endpoint{Name: name, WaitingQueue: rng.IntN(2 * cfg.Endpoint.QueueDepth),
							ScrapedAt: clk.Now()})
					}
				}
				if err := c.UpdateEndpoints(eps); err != nil {
					t.Fatal(err)
				}
			case op < 7 && len(dispatched) > 0:
				i := rng.IntN(len(dispatched))
				c.Release(dispatched[i])
				dispatched = append(dispatched[:i], dispatched[i+1:]...)
			case op < 8 && len(ids) > 0:
				c.Cancel(ids[rng.IntN(len(ids))])
			default:
				clk.Step(time.Duration(rng.IntN(1500)) * time.Millisecond)
			}
			if err := checkInvariants(c); err != nil {
				t.Fatalf("after op %d: %v", n, err)
			}
		}
		<-c.Shutdown(0)
		for _, id := range ids {
			if len(s.got[id]) != 1 {
				t.Fatalf("%s: %d callbacks, want exactly 1", id, len(s.got[id]))
			}
			if err := checkDecision(cfg, s.got[id][0], s.errs[id]); err != nil {
				t.Fatalf("%s: %v", id, err)
			}
		}
		out := make([]string, len(s.order))
		for i, id := range s.order {
			d := s.got[id][0]
			out[i] = fmt.Sprintf("%s %s %s %v %v", id, d.Outcome, d.Reason, d.RetryAfter, d.Waited)
		}
		return out
	}
	first, second := run(), run()
	if fmt.Sprint(first) != fmt.Sprint(second) {
		t.Fatal("the same seed produced different decisions")
	}
}
