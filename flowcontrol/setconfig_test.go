package flowcontrol

import (
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

func TestSetConfig(t *testing.T) {
	batchSheddable := func(c *Config) {
		c.Tenants = map[string]TenantPolicy{"batch": {Weight: 1, MaxBand: Sheddable}}
		c.Bands[Sheddable].SaturationCeiling = 0.2
	}
	tests := []struct {
		name    string
		initial func(*Config)
		run     func(t *testing.T, h *harness)
	}{{
		name: "a tenant cap applies to the next arrival",
		run: func(t *testing.T, h *harness) {
			h.scrape(ep("a", 2)) // saturation 0.4
			h.admit(0, "batch", 1).wantOutcome(t, Dispatched, ReasonNone)
			if err := h.c.SetConfig(testConfig(t, batchSheddable)); err != nil {
				t.Fatal(err)
			}
			d := h.admit(0, "batch", 1).wantOutcome(t, Rejected, ReasonSaturated)
			if d.Band != Sheddable || !d.Capped {
				t.Fatalf("decision %+v, want capped to Sheddable", d)
			}
			h.admit(0, "other", 1).wantOutcome(t, Dispatched, ReasonNone)
		},
	}, {
		name: "waiting requests keep their band and admission",
		run: func(t *testing.T, h *harness) {
			h.scrape(ep("a", 5)) // saturated: Standard waits
			waiting := h.admit(0, "batch", 1)
			if err := h.c.SetConfig(testConfig(t, batchSheddable)); err != nil {
				t.Fatal(err)
			}
			waiting.wantWaiting(t)
			h.step(10 * time.Millisecond)
			h.scrape(ep("a", 4)) // headroom for Standard only
			if d := waiting.wantOutcome(t, Dispatched, ReasonNone); d.Band != Standard || d.Capped {
				t.Fatalf("decision %+v, want dispatched in Standard, uncapped", d)
			}
		},
	}, {
		name: "a raised ceiling dispatches waiting requests at once",
		run: func(t *testing.T, h *harness) {
			h.scrape(ep("a", 5))
			s := h.admit(0, "t", 1)
			s.wantWaiting(t)
			if err := h.c.SetConfig(testConfig(t, func(c *Config) {
				c.Bands[Critical].SaturationCeiling = 2
				c.Bands[Standard].SaturationCeiling = 2
			})); err != nil {
				t.Fatal(err)
			}
			synctest.Wait()
			s.wantOutcome(t, Dispatched, ReasonNone)
		},
	}, {
		name: "a raised queue-depth threshold recomputes saturation",
		run: func(t *testing.T, h *harness) {
			h.scrape(ep("a", 5))
			s := h.admit(0, "t", 1)
			if err := h.c.SetConfig(testConfig(t, func(c *Config) { c.Endpoint.QueueDepth = 10 })); err != nil {
				t.Fatal(err)
			}
			synctest.Wait()
			s.wantOutcome(t, Dispatched, ReasonNone)
		},
	}, {
		name:    "a shortened maximum queue time answers overdue requests now",
		initial: func(c *Config) { c.Bands[Standard].MaxQueueTime = 15 * time.Second },
		run: func(t *testing.T, h *harness) {
			h.scrape(ep("a", 5))
			old := h.admit(0, "t", 1)
			h.step(3 * time.Second)
			young := h.admit(0, "t", 1)
			if err := h.c.SetConfig(testConfig(t, func(c *Config) { c.Bands[Standard].MaxQueueTime = 2 * time.Second })); err != nil {
				t.Fatal(err)
			}
			synctest.Wait()
			if d := old.wantOutcome(t, Rejected, ReasonQueueTimeout); d.Waited != 3*time.Second {
				t.Fatalf("waited %v, want 3s", d.Waited)
			}
			young.wantWaiting(t)
			h.step(2*time.Second - time.Nanosecond)
			young.wantWaiting(t)
			h.step(time.Nanosecond)
			young.wantOutcome(t, Rejected, ReasonQueueTimeout)
		},
	}, {
		name:    "a lengthened maximum queue time extends waiting requests",
		initial: func(c *Config) { c.Bands[Standard].MaxQueueTime = 2 * time.Second },
		run: func(t *testing.T, h *harness) {
			h.scrape(ep("a", 5))
			s := h.admit(0, "t", 1)
			h.step(time.Second)
			if err := h.c.SetConfig(testConfig(t, func(c *Config) { c.Bands[Standard].MaxQueueTime = 10 * time.Second })); err != nil {
				t.Fatal(err)
			}
			h.step(2 * time.Second) // past the old deadline: the early timer re-arms
			s.wantWaiting(t)
			h.step(7*time.Second - time.Nanosecond)
			s.wantWaiting(t)
			h.step(time.Nanosecond)
			if d := s.wantOutcome(t, Rejected, ReasonQueueTimeout); d.Waited != 10*time.Second {
				t.Fatalf("waited %v, want 10s", d.Waited)
			}
		},
	}, {
		name: "a lowered capacity evicts nobody and refuses arrivals",
		run: func(t *testing.T, h *harness) {
			h.scrape(ep("a", 5))
			waiting := []*call{h.admit(0, "t", 1), h.admit(0, "t", 1), h.admit(0, "t", 1)}
			if err := h.c.SetConfig(testConfig(t, func(c *Config) { c.Bands[Standard].MaxQueuedRequests = 1 })); err != nil {
				t.Fatal(err)
			}
			for _, cl := range waiting {
				cl.wantWaiting(t)
			}
			h.admit(0, "t", 1).wantOutcome(t, Rejected, ReasonQueueFull)
			if s := h.c.Stats(); s.Queued != [NumBands]int{0, 3, 0} {
				t.Fatalf("queued %v", s.Queued)
			}
		},
	}, {
		name: "new Retry-After bounds apply to the next rejection",
		run: func(t *testing.T, h *harness) {
			h.scrape(ep("a", 5))
			if d := h.admit(-1, "t", 1).wantOutcome(t, Rejected, ReasonSaturated); d.RetryAfter != time.Second {
				t.Fatalf("Retry-After %v, want the default minimum 1s", d.RetryAfter)
			}
			if err := h.c.SetConfig(testConfig(t, func(c *Config) { c.Bands[Sheddable].RetryAfterMin = 7 * time.Second })); err != nil {
				t.Fatal(err)
			}
			if d := h.admit(-1, "t", 1).wantOutcome(t, Rejected, ReasonSaturated); d.RetryAfter != 7*time.Second {
				t.Fatalf("Retry-After %v, want the new minimum 7s", d.RetryAfter)
			}
		},
	}, {
		name: "a new weight for a backlogged tenant keeps fair-queuing sums consistent",
		run: func(t *testing.T, h *harness) {
			h.scrape(ep("a", 5))
			h.admit(0, "heavy", 1)
			h.admit(0, "light", 1)
			if err := h.c.SetConfig(testConfig(t, func(c *Config) {
				c.Tenants = map[string]TenantPolicy{"heavy": {Weight: 4, MaxBand: Critical}}
			})); err != nil {
				t.Fatal(err)
			}
			h.admit(0, "heavy", 1)
			h.c.mu.Lock()
			got := h.c.bands[Standard].activeWeight
			h.c.mu.Unlock()
			if got != 5 {
				t.Fatalf("active weight %v, want 5 (heavy 4 + light 1)", got)
			}
		},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h := newHarness(t, testConfig(t, tc.initial))
				tc.run(t, h)
			})
		})
	}
}

func TestSetConfigRejectsInvalidAndCopies(t *testing.T) {
	c, err := New(nil, Deps{})
	if err != nil {
		t.Fatal(err)
	}
	before := c.Config()
	if err := c.SetConfig(nil); err == nil {
		t.Error("SetConfig(nil) was accepted")
	}
	bad := DefaultConfig()
	bad.Bands[Sheddable].SaturationCeiling = 2 // above Standard's: inverted
	if err := c.SetConfig(bad); err == nil || !strings.Contains(err.Error(), "inverted ceilings") {
		t.Errorf("SetConfig(inverted ceilings) = %v, want a validation error", err)
	}
	if c.Config() != before {
		t.Fatal("a rejected configuration replaced the one in force")
	}
	good := DefaultConfig()
	good.Tenants = map[string]TenantPolicy{"batch": {Weight: 1, MaxBand: Sheddable}}
	if err := c.SetConfig(good); err != nil {
		t.Fatal(err)
	}
	good.Tenants["batch"] = TenantPolicy{Weight: 1, MaxBand: Critical} // the caller keeps its value
	if got := c.Config().Tenants["batch"].MaxBand; got != Sheddable {
		t.Fatalf("caller's later change leaked into the controller: maxBand %v", got)
	}
}
