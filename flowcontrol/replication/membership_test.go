package replication

import (
	"slices"
	"strings"
	"testing"
	"time"
)

func TestMembershipLiveness(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	m, err := NewMembership("b:9003", []string{"c:9003", "a:9003", "b:9003", "a:9003"}, 100*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	// Steps at fixed instants, even backwards: what is heard, then who is live.
	for _, s := range []struct {
		ms          int
		heard       string
		known       bool
		unreachable string
		live        string
	}{
		{0, "", false, "", "b:9003"},                       // alone until a peer speaks
		{10, "a:9003", true, "", "a:9003,b:9003"},          // a heard
		{20, "x:9003", false, "", "a:9003,b:9003"},         // strangers are ignored
		{60, "c:9003", true, "", "a:9003,b:9003,c:9003"},   //
		{109, "", false, "", "a:9003,b:9003,c:9003"},       // a heard 99ms ago: still live
		{110, "", false, "", "b:9003,c:9003"},              // a silent for the timeout: gone
		{50, "a:9003", true, "", "a:9003,b:9003,c:9003"},   // a is back
		{5, "a:9003", true, "", "a:9003,b:9003,c:9003"},    // a message from the past does not move a's last word back
		{149, "", false, "", "a:9003,b:9003,c:9003"},       // a heard at 50, c at 60
		{150, "", false, "", "b:9003,c:9003"},              //
		{160, "", false, "", "b:9003"},                     // every peer gone: b decides alone
		{170, "c:9003", true, "", "b:9003,c:9003"},         // c is back
		{171, "a:9003", true, "", "a:9003,b:9003,c:9003"},  //
		{172, "", false, "c:9003", "a:9003,b:9003,c:9003"}, // a failed connection, c heard at 170, after 172-40ms: kept
		{215, "", false, "c:9003", "a:9003,b:9003"},        // a failed connection, c last heard at 170, before 215-40ms: gone before its timeout
		{216, "", false, "x:9003", "a:9003,b:9003"},        // strangers are ignored
		{217, "c:9003", true, "", "a:9003,b:9003,c:9003"},  // c is back once heard
	} {
		if s.unreachable != "" {
			m.Unreachable(s.unreachable, at(s.ms-40))
		}
		if s.heard != "" {
			if got := m.Heard(s.heard, at(s.ms)); got != s.known {
				t.Fatalf("t=%dms: Heard(%s) = %v, want %v", s.ms, s.heard, got, s.known)
			}
		}
		if got := strings.Join(m.Live(at(s.ms)), ","); got != s.live {
			t.Fatalf("t=%dms: live %s, want %s", s.ms, got, s.live)
		}
	}
}

func TestNewMembershipErrors(t *testing.T) {
	if _, err := NewMembership("", nil, time.Second); err == nil || !strings.Contains(err.Error(), "self") {
		t.Errorf("no self: %v", err)
	}
	if _, err := NewMembership("a:1", nil, 0); err == nil || !strings.Contains(err.Error(), "timeout") {
		t.Errorf("no timeout: %v", err)
	}
}

func TestParsePeers(t *testing.T) {
	for _, tc := range []struct {
		text string
		want []string
		err  string
	}{
		{"", nil, ""},
		{"epp-0.epp:9003,epp-1.epp:9003", []string{"epp-0.epp:9003", "epp-1.epp:9003"}, ""},
		{"# peers\n10.0.0.1:9003  # first\n\n10.0.0.2:9003, [::1]:9003\r\n", []string{"10.0.0.1:9003", "10.0.0.2:9003", "[::1]:9003"}, ""},
		{"epp-0", nil, `line 1: peer "epp-0" is not host:port`},
		{"a:1\n:9003", nil, `line 2: peer ":9003" is not host:port`},
		{"a:1,a:1", nil, `peer "a:1" listed twice`},
	} {
		got, err := ParsePeers(tc.text)
		switch {
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%q: error %v, want %q", tc.text, err, tc.err)
		case tc.err == "" && (err != nil || !slices.Equal(got, tc.want)):
			t.Errorf("%q: %q, %v; want %q", tc.text, got, err, tc.want)
		}
	}
}

// A peers file is operator input: any text parses to an error or to peers that are host:port, each once.
func FuzzParsePeers(f *testing.F) {
	f.Add("a:1,b:2\n# c\n[::1]:9003")
	f.Add("a:1,a:1")
	f.Fuzz(func(t *testing.T, text string) {
		peers, err := ParsePeers(text)
		if err != nil {
			return
		}
		seen := map[string]bool{}
		for _, p := range peers {
			if seen[p] || strings.ContainsAny(p, ", \t\n#") {
				t.Fatalf("%q gave peer %q (seen before: %v)", text, p, seen[p])
			}
			seen[p] = true
		}
	})
}
