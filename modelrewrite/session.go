package modelrewrite

import (
	"fmt"
	"strings"
)

// DefaultSessionHeader is the request header that carries the session key
// unless configured otherwise.
const DefaultSessionHeader = "x-session-id"

// SessionKeys extracts a request's session key: the value of a configured
// header, else the OpenAI "user" field of the request body. The zero value
// reads DefaultSessionHeader.
type SessionKeys struct {
	header string // lower case; "" means DefaultSessionHeader
}

// NewSessionKeys returns an extractor reading header ("" selects
// DefaultSessionHeader). header must be an HTTP field name (RFC 9110 token).
func NewSessionKeys(header string) (SessionKeys, error) {
	if header == "" {
		header = DefaultSessionHeader
	}
	for i := 0; i < len(header); i++ {
		if !isTokenChar(header[i]) {
			return SessionKeys{}, fmt.Errorf("session header %q: byte %d (%q) is not allowed in an HTTP field name", header, i, header[i])
		}
	}
	return SessionKeys{header: strings.ToLower(header)}, nil
}

// Header is the lower-case header name the extractor reads.
func (s SessionKeys) Header() string {
	if s.header == "" {
		return DefaultSessionHeader
	}
	return s.header
}

// Key returns the session key of a request, or "" when it has none. headers
// is keyed by field name; Envoy's ext_proc delivers lower-case names, which
// are looked up first, and other spellings are matched case-insensitively.
// body is the decoded JSON request body (nil is allowed); its "user" field
// counts only when it is a string. Surrounding whitespace is not part of a
// key, and a blank value counts as absent.
func (s SessionKeys) Key(headers map[string]string, body map[string]any) string {
	header := s.Header()
	v, ok := headers[header]
	if !ok {
		for name, value := range headers {
			if strings.EqualFold(name, header) {
				v = value
				break
			}
		}
	}
	if k := strings.TrimSpace(v); k != "" {
		return k
	}
	if user, ok := body["user"].(string); ok {
		return strings.TrimSpace(user)
	}
	return ""
}

// isTokenChar reports whether c may appear in an HTTP token (RFC 9110 5.6.2).
func isTokenChar(c byte) bool {
	switch {
	case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}
