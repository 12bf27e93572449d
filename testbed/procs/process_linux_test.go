package procs

import (
	"os"
	"strings"
	"testing"
	"time"
)

func TestParseStatCPU(t *testing.T) {
	for _, tc := range []struct {
		name, stat string
		want       time.Duration
		err        string
	}{
		{"plain", "4242 (epp) S 1 4242 4242 0 -1 4194560 1234 0 0 0 150 37 0 0 20 0 12 0 99 0 0", 1870 * time.Millisecond, ""},
		{"command with spaces and parentheses", "7 (a (b) c) R 1 7 7 0 -1 0 0 0 0 0 3 4 0 0 20 0", 70 * time.Millisecond, ""},
		{"no command name", "7 epp R 1", 0, "no command name"},
		{"cut short", "7 (epp) R 1 7 7 0 -1 0 0 0 0 0 3", 0, "want at least 13"},
		{"not a number", "7 (epp) R 1 7 7 0 -1 0 0 0 0 0 x 4 0", 0, "invalid syntax"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseStatCPU([]byte(tc.stat))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %v, %v; want %v", got, err, tc.want)
			}
		})
	}
}

// TestCPUTimeOfThisProcess reads a live /proc entry: this test binary has
// used CPU time, and a busy loop adds to it.
func TestCPUTimeOfThisProcess(t *testing.T) {
	before, err := cpuTime(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	for after := before; after <= before; {
		x := 0
		for i := range 10_000_000 {
			x += i
		}
		_ = x
		if after, err = cpuTime(os.Getpid()); err != nil {
			t.Fatal(err)
		}
	}
}
