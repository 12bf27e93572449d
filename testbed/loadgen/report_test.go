package loadgen

import (
	"strings"
	"testing"
	"time"
)

func TestWriteComparison(t *testing.T) {
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	// The same three requests of class a through two gateways: one sheds a request with Retry-After and answers
	// the others fast; the other serves every request slowly, and one fails.
	sluice := Summarize([]Record{
		{Seq: 0, Attempt: 1, Final: true, Class: "a", Status: 200, TTFT: ms(100), E2E: ms(200)},
		{Seq: 1, Attempt: 1, Final: true, Class: "a", Status: 200, TTFT: ms(300), E2E: ms(400)},
		{Seq: 2, Attempt: 1, Final: true, Class: "a", Status: 429, Error: "HTTP 429", RetryAfterSet: true, RetryAfter: time.Second},
	}, SummaryOptions{Duration: time.Second})
	rr := Summarize([]Record{
		{Seq: 0, Attempt: 1, Final: true, Class: "a", Status: 200, TTFT: ms(2500), E2E: ms(3000)},
		{Seq: 1, Attempt: 1, Final: true, Class: "a", Status: 200, TTFT: ms(4000), E2E: ms(5000)},
		{Seq: 2, Attempt: 1, Final: true, Class: "a", Status: 0, Error: "context deadline exceeded"},
	}, SummaryOptions{Duration: time.Second})
	var b strings.Builder
	if err := WriteComparison(&b, []Contender{{"sluice", sluice}, {"round-robin", rr}}); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimRight(b.String(), "\n"), "\n")
	if len(lines) != 4 {
		t.Fatalf("want a header of two lines, class a and all; got\n%s", b.String())
	}
	fields := strings.Fields(lines[2])
	want := []string{"a", "2/3", "1", "(1)", "0", "200", "ms", "298", "ms", "2/3", "0", "(0)", "1", "3.2", "s", "4.0", "s"}
	if strings.Join(fields, " ") != strings.Join(want, " ") {
		t.Fatalf("class a line %q, want fields %q\n%s", lines[2], want, b.String())
	}
	if !strings.HasPrefix(strings.TrimSpace(lines[3]), AllClasses+" ") || !strings.Contains(lines[0], "sluice") || !strings.Contains(lines[0], "round-robin") {
		t.Fatalf("header or overall line missing:\n%s", b.String())
	}
}
