package golden

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/testbed/loadgen"
)

// recorder is a testing.TB that keeps what a guard reports, so that the guard's failures can be checked.
type recorder struct {
	testing.TB
	mu     sync.Mutex
	errors []string
	fatal  bool
}

func (r *recorder) Helper()                   {}
func (r *recorder) Name() string              { return "TestGuard" }
func (r *recorder) Logf(string, ...any)       {}
func (r *recorder) Errorf(f string, a ...any) { r.add(f, a...) }
func (r *recorder) Error(a ...any)            { r.add(strings.Repeat("%v", len(a)), a...) }
func (r *recorder) Fatal(a ...any)            { r.add(strings.Repeat("%v", len(a)), a...); r.stop() }
func (r *recorder) Fatalf(f string, a ...any) {
	r.add(f, a...)
	r.stop()
}

func (r *recorder) add(f string, a ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errors = append(r.errors, fmt.Sprintf(f, a...))
}

func (r *recorder) stop() {
	r.mu.Lock()
	r.fatal = true
	r.mu.Unlock()
	runtime.Goexit()
}

// run calls guard with a recorder on its own goroutine (Fatal ends it) and returns what it reported.
func run(guard func(tb testing.TB)) *recorder {
	r := &recorder{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		guard(r)
	}()
	<-done
	return r
}

func figures(pairs ...any) *Figures {
	f := &Figures{}
	for i := 0; i < len(pairs); i += 2 {
		f.Add(pairs[i].(string), pairs[i+1])
	}
	return f
}

func TestCheck(t *testing.T) {
	path := filepath.Join(t.TempDir(), "testdata", "guard.golden")
	measured := figures("a/ttft_p99", 1500*time.Millisecond, "a/requests", 454, "a/throughput", 25.727733413533215)
	*update = true
	if r := run(func(tb testing.TB) { Check(tb, path, measured) }); len(r.errors) != 0 {
		t.Fatalf("-update reported %v", r.errors)
	}
	*update = false
	text, err := os.ReadFile(path)
	if err != nil || !strings.Contains(string(text), "a/ttft_p99 1.5s\na/requests 454\na/throughput 25.727733413533215\n") {
		t.Fatalf("golden file %q, %v", text, err)
	}

	for _, tc := range []struct {
		name string
		got  *Figures
		want []string // substrings of the reports, in order
	}{
		{"identical", measured, nil},
		{"one figure moved", figures("a/ttft_p99", 1501*time.Millisecond, "a/requests", 454, "a/throughput", 25.727733413533215),
			[]string{"a/ttft_p99 moved from 1.5s to 1.501s", "1 of 3 figures differ"}},
		{"a float's last bit", figures("a/ttft_p99", 1500*time.Millisecond, "a/requests", 454, "a/throughput",
			math.Nextafter(25.727733413533215, 26)),
			[]string{"a/throughput moved from 25.727733413533215 to 25.72773341353322", "1 of 3 figures differ"}},
		{"new and gone", figures("a/ttft_p99", 1500*time.Millisecond, "a/requests", 454, "b/requests", 3),
			[]string{"new figure b/requests = 3", "figure a/throughput (25.727733413533215 in", "2 of 3 figures differ"}},
	} {
		r := run(func(tb testing.TB) { Check(tb, path, tc.got) })
		if len(r.errors) != len(tc.want) {
			t.Errorf("%s: reported %q, want %d reports", tc.name, r.errors, len(tc.want))
			continue
		}
		for i, w := range tc.want {
			if !strings.Contains(r.errors[i], w) {
				t.Errorf("%s: report %d is %q, want it to say %q", tc.name, i, r.errors[i], w)
			}
		}
	}

	if r := run(func(tb testing.TB) { Check(tb, filepath.Join(t.TempDir(), "missing.golden"), measured) }); !r.fatal {
		t.Error("a missing golden file passed")
	}
	if r := run(func(tb testing.TB) { Check(tb, path, &Figures{}) }); !r.fatal {
		t.Error("a guard that measured nothing passed")
	}
}

func TestClassRefusesAClassWithoutSamples(t *testing.T) {
	served := loadgen.ClassSummary{Requests: 3, Succeeded: 3, TTFT: loadgen.Latency{Count: 3, P99: time.Second}}
	for _, tc := range []struct {
		name  string
		s     loadgen.ClassSummary
		fatal bool
	}{
		{"served", served, false},
		{"no requests", loadgen.ClassSummary{}, true},
		{"requests, none served", loadgen.ClassSummary{Requests: 5, Failed: 5}, true},
	} {
		var f Figures
		r := run(func(tb testing.TB) { f.Class(tb, "x/critical", tc.s) })
		if r.fatal != tc.fatal {
			t.Errorf("%s: fatal %v (%v), want %v", tc.name, r.fatal, r.errors, tc.fatal)
		}
		if !tc.fatal && f.values["x/critical/ttft_p99"] != "1s" {
			t.Errorf("%s: figures %v", tc.name, f.values)
		}
	}
}
