package plugins

import (
	"context"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	fwkrc "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/requestcontrol"
	fwksched "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/scheduling"
)

func TestInFlightScorerFactory(t *testing.T) {
	tests := []struct {
		raw     string
		wantErr bool
	}{
		{"", false}, {"null", false}, {`{}`, false}, {`{"ttl":"30s"}`, false},
		{`{"ttl":"0s"}`, true}, {`{"ttl":"-1s"}`, true}, {`{"tll":"30s"}`, true}, {`[`, true},
	}
	for _, tt := range tests {
		_, err := InFlightScorerFactory("s", []byte(tt.raw), nil)
		if (err != nil) != tt.wantErr {
			t.Errorf("parameters %q: error %v, want error %v", tt.raw, err, tt.wantErr)
		}
	}
}

// TestInFlightScorer: requests sent through the scorer's PreRequest count on their endpoint until their response
// ends, so a burst is spread at once instead of waiting for the next scrape, and a response that never ends stops
// counting after the TTL.
func TestInFlightScorer(t *testing.T) {
	p, err := InFlightScorerFactory("s", []byte(`{"ttl":"1m"}`), nil)
	if err != nil {
		t.Fatal(err)
	}
	s := p.(*InFlightScorer)
	clk := clocktesting.NewFakePassiveClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	s.clock = clk
	eps := candidates("10.0.0.1", "10.0.0.2", "10.0.0.3")
	ctx := context.Background()
	send := func(id string, to int) {
		s.PreRequest(ctx, &fwksched.LLMRequest{RequestId: id}, &fwksched.SchedulingResult{PrimaryProfileName: "default",
			ProfileResults: map[string]*fwksched.ProfileRunResult{"default": {TargetEndpoints: []fwksched.Endpoint{eps[to]}}}})
	}
	end := func(id string) {
		s.ResponseBody(ctx, &fwksched.LLMRequest{RequestId: id}, &fwkrc.Response{EndOfStream: true}, nil)
	}
	scores := func() []float64 {
		m := s.Score(ctx, nil, nil, eps)
		return []float64{m[eps[0]], m[eps[1]], m[eps[2]]}
	}
	want := func(step string, w ...float64) {
		t.Helper()
		got := scores()
		for i := range w {
			if got[i] != w[i] {
				t.Fatalf("%s: scores %v, want %v", step, got, w)
			}
		}
	}
	want("nothing sent", 1, 1, 1)
	send("a", 0)
	send("b", 0)
	send("c", 1)
	want("two on the first, one on the second", 0, 0.5, 1)
	s.ResponseBody(ctx, &fwksched.LLMRequest{RequestId: "a"}, &fwkrc.Response{EndOfStream: false}, nil)
	want("a chunk does not end a request", 0, 0.5, 1)
	end("a")
	end("a")
	want("one each on the first two", 0, 0, 1)
	clk.SetTime(clk.Now().Add(time.Minute + time.Nanosecond))
	want("lost completions expired", 1, 1, 1)
}
