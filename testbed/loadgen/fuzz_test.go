package loadgen

import (
	"strings"
	"testing"
	"time"
)

// FuzzParseRetryAfter: any header value yields a non-negative delay of at
// most a day, and a refusal means zero.
func FuzzParseRetryAfter(f *testing.F) {
	for _, s := range []string{"0", "120", "-3", "Wed, 21 Oct 2015 07:28:00 GMT", "soon", " 5 ", "99999999999999999999"} {
		f.Add(s)
	}
	now := time.Date(2025, 6, 1, 0, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, v string) {
		d, ok := ParseRetryAfter(v, now)
		if d < 0 || (!ok && d != 0) {
			t.Fatalf("ParseRetryAfter(%q) = %v, %v", v, d, ok)
		}
		if ok && d > 24*time.Hour && !strings.Contains(v, ",") && !strings.Contains(v, "GMT") {
			t.Fatalf("delay-seconds %q accepted as %v", v, d)
		}
	})
}

// FuzzReadStream: any response body is measured without panicking, and
// only a stream that ended with [DONE] counts as complete.
func FuzzReadStream(f *testing.F) {
	f.Add("data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: [DONE]\n\n")
	f.Add("data: {\"choices\":[{\"text\":\"a\"}],\"usage\":{\"completion_tokens\":7}}\n\n")
	f.Add("data: {\"error\":{\"message\":\"x\"}}\n\n")
	f.Add("data: not json\n\n")
	f.Add(": comment\r\ndata:[DONE]\r\n")
	f.Fuzz(func(t *testing.T, body string) {
		var rec Record
		readStream(strings.NewReader(body), time.Now(), &rec)
		if rec.Error == "" && !strings.Contains(body, "[DONE]") {
			t.Fatalf("stream without [DONE] accepted: %q", body)
		}
		if rec.OutputTokens < 0 || len(rec.ITL) > 0 && rec.TTFT < 0 {
			t.Fatalf("record %+v", rec)
		}
	})
}
