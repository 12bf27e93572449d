package decisiontrace

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"reflect"
	"sync"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

var t0 = time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)

func newRecorder(t *testing.T, cfg Config) (*Recorder, *clocktesting.FakeClock) {
	t.Helper()
	clk := clocktesting.NewFakeClock(t0)
	cfg.Clock = clk
	r, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r, clk
}

// TestTraceRecordsOneDecision follows one request through the hooks in the order the EPP calls them and checks the
// committed record.
func TestTraceRecordsOneDecision(t *testing.T) {
	r, clk := newRecorder(t, Config{Size: 4})
	ctx, tr := r.Start(context.Background())
	if FromContext(ctx) != tr {
		t.Fatal("the context does not carry the trace")
	}
	tr.Begin("req-1", false)
	tr.Request("base", "critical", 2)
	tr.Admitted(Admission{Band: "Critical", Outcome: "Dispatched", WaitSeconds: 0.25, Headroom: []string{"a", "c"}})
	tr.BeginProfile("default", []string{"a", "b", "c"})
	tr.Filtered("served-model", []string{"a", "b", "c"}, []string{"a", "c"})
	tr.Filtered("headroom", []string{"a", "c"}, []string{"a", "c"})
	tr.Scored("queue", 2, map[string]float64{"a": 0.5, "c": 1})
	tr.Scored("kv", 1, map[string]float64{"a": 1, "c": 0})
	tr.Weighed(map[string]float64{"a": 2, "c": 2.5})
	tr.EndProfile([]string{"c"}, nil)
	clk.Step(time.Second)
	tr.Routed("c")
	tr.Answered(500, "", "", "too late: committed") // ignored

	got := r.Records("", 0)
	want := []*Record{{
		RequestID: "req-1", Received: t0, Decided: t0.Add(time.Second), Model: "base", Objective: "critical", Priority: 2,
		Admission: &Admission{Band: "Critical", Outcome: "Dispatched", WaitSeconds: 0.25, Headroom: []string{"a", "c"}},
		Profiles: []Profile{{
			Name: "default", Candidates: []string{"a", "b", "c"},
			Filters: []Filter{{Plugin: "served-model", Kept: 2, Removed: []string{"b"}}, {Plugin: "headroom", Kept: 2}},
			Scorers: []Scorer{{Plugin: "queue", Weight: 2}, {Plugin: "kv", Weight: 1}},
			Endpoints: []EndpointScores{
				{Endpoint: "c", Scores: map[string]float64{"queue": 1, "kv": 0}, Total: 2.5},
				{Endpoint: "a", Scores: map[string]float64{"queue": 0.5, "kv": 1}, Total: 2},
			},
			Picked: []string{"c"},
		}},
		Outcome: Routed, Endpoint: "c",
	}}
	if !reflect.DeepEqual(got, want) {
		a, _ := json.MarshalIndent(got, "", " ")
		b, _ := json.MarshalIndent(want, "", " ")
		t.Fatalf("records:\n%s\nwant:\n%s", a, b)
	}
	if tr.Active() {
		t.Error("the trace is still active after its commit")
	}
}

func TestTraceOutcomes(t *testing.T) {
	tests := []struct {
		name string
		run  func(*Trace)
		want Record
	}{
		{"shed by admission", func(tr *Trace) {
			tr.Admitted(Admission{Band: "Sheddable", Outcome: "Rejected", Reason: "saturated", RetryAfterSeconds: 3})
			tr.Answered(429, "saturated", "3", "Request not admitted")
		}, Record{Admission: &Admission{Band: "Sheddable", Outcome: "Rejected", Reason: "saturated", RetryAfterSeconds: 3},
			Outcome: Answered, Status: 429, ShedReason: "saturated", RetryAfter: "3", Error: "Request not admitted"}},
		{"every candidate filtered out", func(tr *Trace) {
			tr.BeginProfile("default", []string{"a"})
			tr.Filtered("f", []string{"a"}, nil)
			tr.EndProfile(nil, errors.New("no endpoints available"))
			tr.Answered(429, "", "", "failed to find target endpoint")
		}, Record{Profiles: []Profile{{Name: "default", Candidates: []string{"a"}, Filters: []Filter{{Plugin: "f", Removed: []string{"a"}}},
			Error: "no endpoints available"}}, Outcome: Answered, Status: 429, Error: "failed to find target endpoint"}},
		{"answered while a profile ran", func(tr *Trace) {
			tr.BeginProfile("default", []string{"a"})
			tr.End()
		}, Record{Profiles: []Profile{{Name: "default", Candidates: []string{"a"}}}, Outcome: Ended}},
		{"the client went away in the queue", func(tr *Trace) { tr.End() }, Record{Outcome: Ended}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, _ := newRecorder(t, Config{Size: 1})
			_, tr := r.Start(context.Background())
			tr.Begin("id", false)
			tt.run(tr)
			tt.want.RequestID, tt.want.Received, tt.want.Decided = "id", t0, t0
			if got := r.Records("", 0); len(got) != 1 || !reflect.DeepEqual(*got[0], tt.want) {
				t.Fatalf("records %+v, want %+v", got, tt.want)
			}
		})
	}
}

// TestSelection: who decides what is traced. Nothing is recorded for a request that is not selected.
func TestSelection(t *testing.T) {
	tests := []struct {
		name    string
		cfg     Config
		optedIn []bool        // one request each, in order
		step    time.Duration // clock step between requests
		want    int           // records kept
	}{
		{"every request without a header", Config{Size: 10}, []bool{false, false, true}, 0, 3},
		{"only opted-in requests with a header", Config{Size: 10, Header: "x-trace"}, []bool{false, true, false, true}, 0, 2},
		{"the rate bounds a client opting in every request", Config{Size: 10, Header: "x-trace", Rate: 2},
			[]bool{true, true, true, true, true}, 0, 2},
		{"the bucket refills with time", Config{Size: 10, Header: "x-trace", Rate: 2},
			[]bool{true, true, true, true, true}, 500 * time.Millisecond, 5},
		{"a rate below one still traces one", Config{Size: 10, Rate: 0.5}, []bool{false, false}, time.Second, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, clk := newRecorder(t, tt.cfg)
			for i, opted := range tt.optedIn {
				_, tr := r.Start(context.Background())
				tr.Begin(fmt.Sprint(i), opted)
				tr.Request("m", "", 0)
				tr.Routed("a")
				clk.Step(tt.step)
			}
			if got := len(r.Records("", 0)); got != tt.want {
				t.Fatalf("%d records, want %d", got, tt.want)
			}
		})
	}
}

func TestUntracedRequestsRecordNothing(t *testing.T) {
	var nilTrace *Trace
	nilTrace.Begin("x", true)
	nilTrace.Routed("a")
	if FromContext(context.Background()) != nil || nilTrace.Active() {
		t.Fatal("a context without a trace yields one")
	}
	r, _ := newRecorder(t, Config{Size: 2, Header: "x-trace"})
	_, tr := r.Start(context.Background())
	tr.Begin("not-opted-in", false)
	tr.Admitted(Admission{Band: "Standard"})
	tr.BeginProfile("p", []string{"a"})
	tr.EndProfile([]string{"a"}, nil)
	tr.Routed("a")
	tr.End()
	if got := r.Records("", 0); len(got) != 0 {
		t.Fatalf("records %+v for a request that was not selected", got)
	}
}

// TestRingKeepsTheNewest: memory is bounded by Size whatever the traffic.
func TestRingKeepsTheNewest(t *testing.T) {
	r, _ := newRecorder(t, Config{Size: 3})
	for i := range 7 {
		_, tr := r.Start(context.Background())
		tr.Begin(fmt.Sprint(i), false)
		tr.End()
	}
	var ids []string
	for _, rec := range r.Records("", 0) {
		ids = append(ids, rec.RequestID)
	}
	if want := []string{"6", "5", "4"}; !reflect.DeepEqual(ids, want) {
		t.Fatalf("kept %v, want %v", ids, want)
	}
	if got := r.Records("5", 0); len(got) != 1 || got[0].RequestID != "5" {
		t.Fatalf("by id: %+v", got)
	}
	if got := r.Records("", 2); len(got) != 2 || got[0].RequestID != "6" {
		t.Fatalf("limit 2: %+v", got)
	}
	if cap(r.ring) != 3 {
		t.Fatalf("ring capacity %d", cap(r.ring))
	}
}

func TestConfigValidate(t *testing.T) {
	for _, cfg := range []Config{{Size: 0}, {Size: MaxSize + 1}, {Size: 1, Rate: -1}} {
		if _, err := New(cfg); err == nil {
			t.Errorf("%+v accepted", cfg)
		}
	}
}

func TestServeHTTP(t *testing.T) {
	r, _ := newRecorder(t, Config{Size: 5, Header: "x-trace"})
	for _, id := range []string{"a", "b", "c"} {
		_, tr := r.Start(context.Background())
		tr.Begin(id, true)
		tr.Routed("10.0.0.1:8000")
	}
	tests := []struct {
		method, query string
		status        int
		ids           []string
	}{
		{"GET", "", 200, []string{"c", "b", "a"}},
		{"GET", "?request_id=b", 200, []string{"b"}},
		{"GET", "?request_id=zzz", 200, nil},
		{"GET", "?limit=1", 200, []string{"c"}},
		{"GET", "?limit=-1", 400, nil},
		{"GET", "?limit=x", 400, nil},
		{"POST", "", 405, nil},
	}
	for _, tt := range tests {
		t.Run(tt.method+tt.query, func(t *testing.T) {
			w := httptest.NewRecorder()
			r.ServeHTTP(w, httptest.NewRequest(tt.method, "/debug/sluice/decisions"+tt.query, nil))
			if w.Code != tt.status {
				t.Fatalf("status %d, want %d: %s", w.Code, tt.status, w.Body)
			}
			if tt.status != http.StatusOK {
				return
			}
			var page Page
			if err := json.Unmarshal(w.Body.Bytes(), &page); err != nil {
				t.Fatal(err)
			}
			var ids []string
			for _, d := range page.Decisions {
				ids = append(ids, d.RequestID)
			}
			if !reflect.DeepEqual(ids, tt.ids) || page.Capacity != 5 || page.Recorded != 3 || page.Header != "x-trace" {
				t.Fatalf("page %+v, want decisions %v of 3 recorded", page, tt.ids)
			}
			if page.Decisions == nil {
				t.Fatal("decisions must be a JSON array, also when empty")
			}
		})
	}
}

// TestConcurrentRequests: many requests traced at once, each its hooks on two goroutines as in the EPP (the proxy's
// messages on one, the decision on another); run with -race.
func TestConcurrentRequests(t *testing.T) {
	r, _ := newRecorder(t, Config{Size: 16})
	var wg sync.WaitGroup
	for i := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, tr := r.Start(context.Background())
			tr.Begin(fmt.Sprint(i), false)
			done := make(chan struct{})
			go func() {
				defer close(done)
				tr.BeginProfile("p", []string{"a", "b"})
				tr.Scored("s", 1, map[string]float64{"a": 1})
				tr.Weighed(map[string]float64{"a": 1, "b": 0})
				tr.EndProfile([]string{"a"}, nil)
			}()
			<-done
			tr.Routed("a")
			_ = r.Records("", 1)
		}()
	}
	wg.Wait()
	if got := len(r.Records("", 0)); got != 16 {
		t.Fatalf("%d records kept, want 16", got)
	}
}
