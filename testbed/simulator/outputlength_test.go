package simulator

import (
	"math/rand/v2"
	"testing"
)

func TestParseOutputLength(t *testing.T) {
	tests := []struct {
		in      string
		want    OutputLength
		wantErr bool
	}{
		{"", OutputExact, false},
		{"exact", OutputExact, false},
		{"ceiling", OutputCeiling, false},
		{"uniform", "", true},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParseOutputLength(tc.in)
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Fatalf("ParseOutputLength(%q) = %q, %v; want %q, error %v", tc.in, got, err, tc.want, tc.wantErr)
			}
		})
	}
}

// TestOutputLengthDraw: exact answers are max_tokens long and draw nothing from the server's random source (so
// existing runs keep their sequences); ceiling answers are uniform in [1, max_tokens], stopped unless they reach it,
// the same for the same seed.
func TestOutputLengthDraw(t *testing.T) {
	const maxTokens, draws = 128, 20000
	tests := []struct {
		name             string
		length           OutputLength
		wantMin, wantMax int
		wantMean         [2]float64 // bounds of the mean length
	}{
		{"unset is exact", "", maxTokens, maxTokens, [2]float64{maxTokens, maxTokens}},
		{"exact", OutputExact, maxTokens, maxTokens, [2]float64{maxTokens, maxTokens}},
		{"ceiling", OutputCeiling, 1, maxTokens, [2]float64{62, 67}}, // (1+128)/2 = 64.5
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rng, witness := rand.New(rand.NewPCG(1, 2)), rand.New(rand.NewPCG(1, 2))
			lo, hi, sum := maxTokens, 0, 0
			for range draws {
				n, stopped := tc.length.Draw(rng, maxTokens)
				if stopped != (n < maxTokens) {
					t.Fatalf("Draw = %d, stopped %v: stopped must say the answer ended before max_tokens", n, stopped)
				}
				lo, hi, sum = min(lo, n), max(hi, n), sum+n
			}
			mean := float64(sum) / draws
			if lo != tc.wantMin || hi != tc.wantMax || mean < tc.wantMean[0] || mean > tc.wantMean[1] {
				t.Fatalf("lengths in [%d, %d], mean %.1f; want [%d, %d], mean in %v", lo, hi, mean, tc.wantMin, tc.wantMax, tc.wantMean)
			}
			if tc.length != OutputCeiling && rng.Uint64() != witness.Uint64() {
				t.Fatal("exact answers drew from the random source")
			}
		})
	}
	a, b := rand.New(rand.NewPCG(7, 7)), rand.New(rand.NewPCG(7, 7))
	for range 100 {
		x, _ := OutputCeiling.Draw(a, maxTokens)
		y, _ := OutputCeiling.Draw(b, maxTokens)
		if x != y {
			t.Fatal("the same seed drew different lengths")
		}
	}
}
