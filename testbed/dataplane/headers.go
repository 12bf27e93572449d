package dataplane

import (
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	envoyhdr "sigs.k8s.io/gateway-api-inference-extension/pkg/common/envoy"
)

// hopByHop lists connection-specific headers (RFC 9110 section 7.6.1) that a
// proxy never forwards.
var hopByHop = []string{
	"Connection", "Keep-Alive", "Proxy-Connection", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade",
}

// removeHopByHop deletes hop-by-hop headers, including those that the
// Connection header names.
func removeHopByHop(h http.Header) {
	for _, v := range h.Values("Connection") {
		for tok := range strings.SplitSeq(v, ",") {
			if tok = strings.TrimSpace(tok); tok != "" {
				h.Del(tok)
			}
		}
	}
	for _, k := range hopByHop {
		h.Del(k)
	}
}

// requestHead is the mutable head of the request as the ext_proc protocol
// sees it: HTTP/2-style pseudo-headers plus ordinary headers.
type requestHead struct {
	method    string
	path      string // path and query, as in :path
	authority string
	scheme    string
	header    http.Header
}

// toHeaderMap renders the head the way Envoy does: lower-case keys,
// pseudo-headers first, values in raw_value, one entry per value.
func (h *requestHead) toHeaderMap() *corev3.HeaderMap {
	hm := &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
		{Key: ":method", RawValue: []byte(h.method)},
		{Key: ":path", RawValue: []byte(h.path)},
		{Key: ":authority", RawValue: []byte(h.authority)},
		{Key: ":scheme", RawValue: []byte(h.scheme)},
	}}
	hm.Headers = append(hm.Headers, headerValues(h.header)...)
	return hm
}

// responseHead is the mutable head of the upstream response.
type responseHead struct {
	status int
	header http.Header
}

func (h *responseHead) toHeaderMap() *corev3.HeaderMap {
	hm := &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
		{Key: ":status", RawValue: []byte(strconv.Itoa(h.status))},
	}}
	hm.Headers = append(hm.Headers, headerValues(h.header)...)
	return hm
}

// headerValues converts h to ext_proc header values in sorted key order so the
// EPP sees a deterministic message.
func headerValues(h http.Header) []*corev3.HeaderValue {
	keys := make([]string, 0, len(h))
	for k := range h {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var out []*corev3.HeaderValue
	for _, k := range keys {
		lk := strings.ToLower(k)
		for _, v := range h[k] {
			out = append(out, &corev3.HeaderValue{Key: lk, RawValue: []byte(v)})
		}
	}
	return out
}

// applyRequestMutation applies an ext_proc header mutation to the request
// head with Envoy's rules: x-envoy-* headers and :method, :authority,
// :scheme and host cannot be set; pseudo-headers and host cannot be removed;
// :path can be rewritten.
func applyRequestMutation(h *requestHead, m *extprocv3.HeaderMutation) {
	for _, opt := range m.GetSetHeaders() {
		key := strings.ToLower(opt.GetHeader().GetKey())
		value := envoyhdr.GetHeaderValue(opt.GetHeader())
		switch {
		case key == "" || strings.HasPrefix(key, "x-envoy") || key == "host":
		case key == ":path":
			if value != "" {
				h.path = value
			}
		case strings.HasPrefix(key, ":"):
		default:
			setHeaderOption(h.header, key, value, opt)
		}
	}
	for _, key := range m.GetRemoveHeaders() {
		key = strings.ToLower(key)
		if strings.HasPrefix(key, ":") || key == "host" {
			continue
		}
		h.header.Del(key)
	}
}

// applyResponseMutation applies an ext_proc header mutation to the response
// head. :status may be set to a valid status code; other pseudo-headers and
// x-envoy-* headers are ignored.
func applyResponseMutation(h *responseHead, m *extprocv3.HeaderMutation) {
	for _, opt := range m.GetSetHeaders() {
		key := strings.ToLower(opt.GetHeader().GetKey())
		value := envoyhdr.GetHeaderValue(opt.GetHeader())
		switch {
		case key == "" || strings.HasPrefix(key, "x-envoy"):
		case key == ":status":
			if code, err := strconv.Atoi(value); err == nil && code >= 200 && code <= 599 {
				h.status = code
			}
		case strings.HasPrefix(key, ":"):
		default:
			setHeaderOption(h.header, key, value, opt)
		}
	}
	for _, key := range m.GetRemoveHeaders() {
		if strings.HasPrefix(key, ":") {
			continue
		}
		h.header.Del(key)
	}
}

// setHeaderOption sets one header following HeaderValueOption.append_action
// as ext_proc applies it. The proto default (APPEND_IF_EXISTS_OR_ADD, also
// what an unset field reads as) overwrites, because the ext_proc API states
// that appending defaults to false in a HeaderMutation; GIE relies on this
// when it sets Content-Length. The deprecated append field is not read.
func setHeaderOption(h http.Header, key, value string, opt *corev3.HeaderValueOption) {
	key = http.CanonicalHeaderKey(key)
	_, exists := h[key]
	switch opt.GetAppendAction() {
	case corev3.HeaderValueOption_ADD_IF_ABSENT:
		if !exists {
			h.Set(key, value)
		}
	case corev3.HeaderValueOption_OVERWRITE_IF_EXISTS:
		if exists {
			h.Set(key, value)
		}
	default:
		h.Set(key, value)
	}
}

// appendForwardedFor adds the client address to X-Forwarded-For as Envoy
// does with use_remote_address: true.
func appendForwardedFor(h http.Header, remoteAddr string) {
	ip, _, err := net.SplitHostPort(remoteAddr)
	if err != nil {
		return
	}
	if prior := h.Values("X-Forwarded-For"); len(prior) > 0 {
		ip = strings.Join(prior, ", ") + ", " + ip
	}
	h.Set("X-Forwarded-For", ip)
}
