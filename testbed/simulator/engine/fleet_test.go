package engine

import (
	"strings"
	"testing"
)

func TestParseFleet(t *testing.T) {
	for _, tc := range []struct {
		spec    string
		want    []FleetEntry
		wantErr string
	}{
		{spec: "h100:2,a10g:1", want: []FleetEntry{{"h100", 2}, {"a10g", 1}}},
		{spec: " a10g:3 ", want: []FleetEntry{{"a10g", 3}}},
		{spec: "h100", wantErr: "profile:count"},
		{spec: "h100:0", wantErr: "positive"},
		{spec: "h100:x", wantErr: "positive"},
		{spec: "tpu:1", wantErr: "unknown hardware profile"},
		{spec: "", wantErr: "profile:count"},
	} {
		got, err := ParseFleet(tc.spec)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%q: error %v, want %q", tc.spec, err, tc.wantErr)
			}
			continue
		}
		if err != nil || len(got) != len(tc.want) {
			t.Fatalf("%q: got %v, %v", tc.spec, got, err)
		}
		for i := range got {
			if got[i] != tc.want[i] {
				t.Errorf("%q: entry %d is %v, want %v", tc.spec, i, got[i], tc.want[i])
			}
		}
	}
	cfgs, err := FleetConfigs("a10g:1,h100:2")
	if err != nil || len(cfgs) != 3 {
		t.Fatalf("FleetConfigs: %d configs, %v", len(cfgs), err)
	}
	a10g, _ := Profile("a10g")
	h100, _ := Profile("h100")
	if cfgs[0] != a10g || cfgs[1] != h100 || cfgs[2] != h100 {
		t.Fatal("FleetConfigs does not follow the spec order")
	}
}
