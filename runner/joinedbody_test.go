package runner

import "testing"

// TestJoinInto: the chunks are joined in order into a buffer of their total length, which a race build clears as it
// is put back (poisonPutBack), so that a reader that kept it past its release fails under -race.
func TestJoinInto(t *testing.T) {
	tests := []struct {
		name   string
		chunks []string
	}{
		{name: "two chunks", chunks: []string{`{"model":`, `"m"}`}},
		{name: "an empty chunk between", chunks: []string{`{"a":`, ``, `1}`}},
		{name: "one byte each", chunks: []string{`{`, `}`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var chunks [][]byte
			want := ""
			for _, c := range tt.chunks {
				chunks = append(chunks, []byte(c))
				want += c
			}
			p := joinInto(chunks, len(want))
			body := *p
			if string(body) != want {
				t.Fatalf("joined %q, want %q", body, want)
			}
			if cap(body) < 1<<joinedMinShift {
				t.Errorf("capacity %d, want a pool class of at least %d", cap(body), 1<<joinedMinShift)
			}
			putJoinedBuffer(p)
			afterPut := want
			if poisonPutBack {
				afterPut = string(make([]byte, len(want)))
			}
			if string(body) != afterPut {
				t.Errorf("after the put back %q, want %q", body, afterPut)
			}
		})
	}
}
