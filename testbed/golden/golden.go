package golden

import (
	"bufio"
	"flag"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/testbed/loadgen"
)

var update = flag.Bool("update", false, "rewrite the golden files of the regression guards with the figures measured now")

// Figures are named figures in the order they were added. Names have no spaces; a name is added once.
type Figures struct {
	names  []string
	values map[string]string
}

// Add records value under name: a time.Duration as its exact String, a float64 as its shortest exact decimal, any
// other value as fmt prints it.
func (f *Figures) Add(name string, value any) {
	if f.values == nil {
		f.values = map[string]string{}
	}
	if strings.ContainsAny(name, " \t\n") || name == "" {
		panic(fmt.Sprintf("golden: figure name %q is empty or has spaces", name))
	}
	if _, dup := f.values[name]; dup {
		panic(fmt.Sprintf("golden: figure %s added twice", name))
	}
	var s string
	switch v := value.(type) {
	case time.Duration:
		s = v.String()
	case float64:
		s = strconv.FormatFloat(v, 'g', -1, 64)
	default:
		s = fmt.Sprint(v)
	}
	f.names = append(f.names, name)
	f.values[name] = s
}

// Class records a class summary's figures under prefix: requests, successes, shed requests and those served later,
// TTFT P50/P95/P99, E2E P99, throughput and goodput. A class without requests or without a single measured TTFT
// fails t: its latencies would be no measurement at all.
func (f *Figures) Class(t testing.TB, prefix string, s loadgen.ClassSummary) {
	t.Helper()
	if s.Requests == 0 || s.TTFT.Count == 0 {
		t.Fatalf("%s produced no samples (%d requests, %d with a TTFT): nothing to guard", prefix, s.Requests, s.TTFT.Count)
	}
	f.Add(prefix+"/requests", s.Requests)
	f.Add(prefix+"/succeeded", s.Succeeded)
	f.Add(prefix+"/shed", s.Shed)
	f.Add(prefix+"/shed_served", s.ShedServed)
	f.Add(prefix+"/ttft_p50", s.TTFT.P50)
	f.Add(prefix+"/ttft_p95", s.TTFT.P95)
	f.Add(prefix+"/ttft_p99", s.TTFT.P99)
	f.Add(prefix+"/e2e_p99", s.E2E.P99)
	f.Add(prefix+"/throughput", s.Throughput)
	f.Add(prefix+"/goodput", s.Goodput)
}

// Sheds records, under prefix, how many attempts of class (every class if "") were answered 429 or 503 and how many
// of those carried a Retry-After, and returns both.
func (f *Figures) Sheds(prefix string, records []loadgen.Record, class string) (shed, withRetryAfter int) {
	for _, r := range records {
		if class != "" && r.Class != class {
			continue
		}
		if r.Status == http.StatusTooManyRequests || r.Status == http.StatusServiceUnavailable {
			shed++
			if r.RetryAfterSet {
				withRetryAfter++
			}
		}
	}
	f.Add(prefix+"/shed_attempts", shed)
	f.Add(prefix+"/shed_attempts_with_retry_after", withRetryAfter)
	return shed, withRetryAfter
}

// Check compares f with the golden file at path (conventionally testdata/<test>.golden) and fails t naming every
// figure that moved, appeared or disappeared. With -update it writes f to path instead.
func Check(t testing.TB, path string, f *Figures) {
	t.Helper()
	if len(f.names) == 0 {
		t.Fatal("no figures to compare: the guard measured nothing")
	}
	if *update {
		write(t, path, f)
		return
	}
	want, err := read(path)
	if err != nil {
		t.Fatalf("%v (run with -update to write it)", err)
	}
	moved := 0
	for _, name := range f.names {
		got := f.values[name]
		w, ok := want.values[name]
		switch {
		case !ok:
			t.Errorf("new figure %s = %s (not in %s)", name, got, path)
		case w != got:
			t.Errorf("%s moved from %s to %s", name, w, got)
		default:
			continue
		}
		moved++
	}
	for _, name := range want.names {
		if _, ok := f.values[name]; !ok {
			t.Errorf("figure %s (%s in %s) is no longer measured", name, want.values[name], path)
			moved++
		}
	}
	if moved > 0 {
		t.Errorf("%d of %d figures differ from %s. The engine is deterministic, so something changed what it measures: "+
			"if that is intended, rerun this test with -update and commit the file with the change.", moved, len(f.names), path)
	}
}

func read(path string) (*Figures, error) {
	file, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer file.Close()
	f := &Figures{}
	sc := bufio.NewScanner(file)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, value, ok := strings.Cut(line, " ")
		if !ok {
			return nil, fmt.Errorf("%s:%d: want \"name value\", got %q", path, n, line)
		}
		f.Add(name, strings.TrimSpace(value))
	}
	return f, sc.Err()
}

func write(t testing.TB, path string, f *Figures) {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "# Figures measured by %s in virtual time, compared exactly.\n", t.Name())
	fmt.Fprintf(&b, "# Regenerate: go test -run '^%s$' -update (then read the diff).\n", t.Name())
	for _, name := range f.names {
		fmt.Fprintf(&b, "%s %s\n", name, f.values[name])
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote %d figures to %s", len(f.names), path)
}
