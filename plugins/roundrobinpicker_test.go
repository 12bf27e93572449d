package plugins

import (
	"context"
	"slices"
	"sync"
	"testing"

	fwksched "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/scheduling"
)

func TestRoundRobinPickerFactory(t *testing.T) {
	for _, tc := range []struct {
		raw     string
		want    int
		wantErr bool
	}{
		{raw: "", want: 1},
		{raw: "null", want: 1},
		{raw: "{}", want: 1},
		{raw: `{"maxNumOfEndpoints":3}`, want: 3},
		{raw: `{"maxNumOfEndpoints":0}`, wantErr: true},
		{raw: `{"maxNumOfEndpoints":-1}`, wantErr: true},
		{raw: `{"maxEndpoints":2}`, wantErr: true},
		{raw: `[1]`, wantErr: true},
	} {
		p, err := RoundRobinPickerFactory("", []byte(tc.raw), nil)
		if tc.wantErr {
			if err == nil {
				t.Errorf("parameters %s: no error", tc.raw)
			}
			continue
		}
		if err != nil {
			t.Errorf("parameters %q: %v", tc.raw, err)
			continue
		}
		rr := p.(*RoundRobinPicker)
		if rr.maxEndpoints != tc.want || rr.TypedName().Type != RoundRobinPickerType || rr.TypedName().Name != RoundRobinPickerType {
			t.Errorf("parameters %q: maxEndpoints %d, name %v; want %d and the type as name", tc.raw, rr.maxEndpoints, rr.TypedName(), tc.want)
		}
	}
}

// scoredIn wraps endpoints as the scheduler hands them to a picker: in map order (here: the order given), with
// scores a score-based picker would follow.
func scoredIn(eps []fwksched.Endpoint, scores ...float64) []*fwksched.ScoredEndpoint {
	out := make([]*fwksched.ScoredEndpoint, len(eps))
	for i, ep := range eps {
		out[i] = &fwksched.ScoredEndpoint{Endpoint: ep, Score: scores[i]}
	}
	return out
}

func pickedNames(r *fwksched.ProfileRunResult) []string {
	return names(r.TargetEndpoints)
}

// TestRoundRobinPicker: picks rotate over the candidates by address whatever order and scores they come in, a pick
// of several returns the following ones as fallbacks, and a changing candidate set keeps one rotation.
func TestRoundRobinPicker(t *testing.T) {
	ctx := context.Background()
	a, b, c := candidates("10.0.0.1"), candidates("10.0.0.2"), candidates("10.0.0.3")
	abc := []fwksched.Endpoint{a[0], b[0], c[0]}
	shuffled := []fwksched.Endpoint{c[0], a[0], b[0]}

	p, err := RoundRobinPickerFactory("rr", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	rr := p.(*RoundRobinPicker)
	var got []string
	for i := range 6 {
		in := abc
		if i%2 == 1 {
			in = shuffled
		}
		got = append(got, pickedNames(rr.Pick(ctx, nil, scoredIn(in, 0.1, 0.9, 0.5)))...)
	}
	want := []string{"10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000", "10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"}
	if !slices.Equal(got, want) {
		t.Errorf("picks %v, want %v", got, want)
	}

	if r := rr.Pick(ctx, nil, nil); len(r.TargetEndpoints) != 0 {
		t.Errorf("no candidates: picked %v", pickedNames(r))
	}
	// Two candidates left (a filter removed 10.0.0.2): the rotation continues modulo two.
	got = nil
	for range 3 {
		got = append(got, pickedNames(rr.Pick(ctx, nil, scoredIn([]fwksched.Endpoint{c[0], a[0]}, 1, 0)))...)
	}
	if want := []string{"10.0.0.1:8000", "10.0.0.3:8000", "10.0.0.1:8000"}; !slices.Equal(got, want) {
		t.Errorf("over two candidates: picks %v, want %v", got, want)
	}

	p, err = RoundRobinPickerFactory("rr2", []byte(`{"maxNumOfEndpoints":2}`), nil)
	if err != nil {
		t.Fatal(err)
	}
	rr2 := p.(*RoundRobinPicker)
	var pairs [][]string
	for range 3 {
		pairs = append(pairs, pickedNames(rr2.Pick(ctx, nil, scoredIn(shuffled, 0, 0, 0))))
	}
	wantPairs := [][]string{{"10.0.0.1:8000", "10.0.0.2:8000"}, {"10.0.0.2:8000", "10.0.0.3:8000"}, {"10.0.0.3:8000", "10.0.0.1:8000"}}
	if !slices.EqualFunc(pairs, wantPairs, slices.Equal) {
		t.Errorf("picks of two %v, want %v", pairs, wantPairs)
	}
	if r := rr2.Pick(ctx, nil, scoredIn(a, 0)); !slices.Equal(pickedNames(r), []string{"10.0.0.1:8000"}) {
		t.Errorf("one candidate, maxNumOfEndpoints 2: picked %v", pickedNames(r))
	}
}

// TestRoundRobinPickerConcurrent: concurrent picks share one rotation, so every endpoint gets exactly its share.
func TestRoundRobinPickerConcurrent(t *testing.T) {
	p, err := RoundRobinPickerFactory("", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	rr := p.(*RoundRobinPicker)
	eps := candidates("10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4")
	const workers, each = 8, 100
	var mu sync.Mutex
	count := map[string]int{}
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for range each {
				name := pickedNames(rr.Pick(context.Background(), nil, scoredIn(eps, 0, 0, 0, 0)))[0]
				mu.Lock()
				count[name]++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	for _, ep := range eps {
		if n := count[EndpointName(ep.GetMetadata())]; n != workers*each/len(eps) {
			t.Errorf("%s picked %d times, want %d (all: %v)", EndpointName(ep.GetMetadata()), n, workers*each/len(eps), count)
		}
	}
}
