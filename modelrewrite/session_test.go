package modelrewrite

import (
	"strings"
	"testing"
)

func TestSessionKeys(t *testing.T) {
	tests := []struct {
		name    string
		header  string
		headers map[string]string
		body    map[string]any
		want    string
	}{
		{name: "default header", headers: map[string]string{"x-session-id": "abc"}, want: "abc"},
		{name: "header beats user", headers: map[string]string{"x-session-id": "abc"}, body: map[string]any{"user": "u1"}, want: "abc"},
		{name: "user field when no header", body: map[string]any{"user": "u1"}, want: "u1"},
		{name: "blank header falls back to user", headers: map[string]string{"x-session-id": "  "}, body: map[string]any{"user": "u1"}, want: "u1"},
		{name: "whitespace trimmed", headers: map[string]string{"x-session-id": " abc\t"}, want: "abc"},
		{name: "non-string user ignored", body: map[string]any{"user": 42.0}, want: ""},
		{name: "nothing", headers: map[string]string{"other": "x"}, body: map[string]any{"model": "m"}, want: ""},
		{name: "nil maps", want: ""},
		{name: "header name matched case-insensitively", headers: map[string]string{"X-Session-ID": "abc"}, want: "abc"},
		{name: "configured header", header: "X-Conversation", headers: map[string]string{"x-conversation": "c1", "x-session-id": "s1"}, want: "c1"},
		{name: "configured header absent, user used", header: "x-conversation", headers: map[string]string{"x-session-id": "s1"}, body: map[string]any{"user": "u1"}, want: "u1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sk, err := NewSessionKeys(tt.header)
			if err != nil {
				t.Fatalf("NewSessionKeys(%q): %v", tt.header, err)
			}
			if got := sk.Key(tt.headers, tt.body); got != tt.want {
				t.Errorf("Key = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestSessionKeysZeroValueReadsDefaultHeader(t *testing.T) {
	var sk SessionKeys
	if sk.Header() != DefaultSessionHeader {
		t.Errorf("Header() = %q, want %q", sk.Header(), DefaultSessionHeader)
	}
	if got := sk.Key(map[string]string{DefaultSessionHeader: "abc"}, nil); got != "abc" {
		t.Errorf("Key = %q, want abc", got)
	}
}

func TestNewSessionKeysRejectsBadHeaderNames(t *testing.T) {
	for _, h := range []string{"x session", "x-session:", "sess\nion", "é"} {
		if _, err := NewSessionKeys(h); err == nil {
			t.Errorf("NewSessionKeys(%q): want an error", h)
		} else if !strings.Contains(err.Error(), "HTTP field name") {
			t.Errorf("NewSessionKeys(%q): error %q does not say why", h, err)
		}
	}
}

// FuzzSessionKeys: any header name is either rejected or usable, and the key
// extracted is the trimmed header value, else the trimmed user field.
func FuzzSessionKeys(f *testing.F) {
	f.Add("x-session-id", "abc", "user")
	f.Add("X-Other", "", " u ")
	f.Add("bad name", "v", "")
	f.Fuzz(func(t *testing.T, header, value, user string) {
		sk, err := NewSessionKeys(header)
		if err != nil {
			return
		}
		got := sk.Key(map[string]string{strings.ToLower(sk.Header()): value}, map[string]any{"user": user})
		want := strings.TrimSpace(value)
		if want == "" {
			want = strings.TrimSpace(user)
		}
		if got != want {
			t.Fatalf("header %q value %q user %q: key %q, want %q", header, value, user, got, want)
		}
	})
}
