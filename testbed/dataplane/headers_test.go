package dataplane

import (
	"net/http"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
)

func TestApplyRequestMutation(t *testing.T) {
	opt := func(k, v string, a corev3.HeaderValueOption_HeaderAppendAction) *corev3.HeaderValueOption {
		return &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: k, RawValue: []byte(v)}, AppendAction: a}
	}
	h := &requestHead{method: "POST", path: "/a", authority: "gw", scheme: "http", header: http.Header{
		"Content-Length": {"10"}, "X-Keep": {"1"}, "X-Present": {"old"}, "X-Drop": {"x"},
	}}
	applyRequestMutation(h, &extprocv3.HeaderMutation{
		SetHeaders: []*corev3.HeaderValueOption{
			opt("content-length", "12", corev3.HeaderValueOption_APPEND_IF_EXISTS_OR_ADD), // default: overwrite
			opt("x-present", "new", corev3.HeaderValueOption_ADD_IF_ABSENT),
			opt("x-absent", "added", corev3.HeaderValueOption_ADD_IF_ABSENT),
			opt("x-only-if", "no", corev3.HeaderValueOption_OVERWRITE_IF_EXISTS),
			opt("x-keep", "2", corev3.HeaderValueOption_OVERWRITE_IF_EXISTS),
			opt(":method", "GET", 0), opt(":authority", "evil", 0), opt(":scheme", "https", 0), opt("host", "evil", 0),
			opt("x-envoy-original-path", "x", 0), opt(":path", "/b?q=1", 0),
			{Header: &corev3.HeaderValue{Key: "x-string-value", Value: "sv"}},
		},
		RemoveHeaders: []string{"x-drop", ":path", "host"},
	})
	want := map[string]string{"Content-Length": "12", "X-Present": "old", "X-Absent": "added", "X-Keep": "2", "X-String-Value": "sv"}
	for k, v := range want {
		if got := h.header.Get(k); got != v {
			t.Errorf("%s = %q, want %q", k, got, v)
		}
	}
	for _, k := range []string{"X-Only-If", "X-Drop", "X-Envoy-Original-Path", "Host"} {
		if v, ok := h.header[k]; ok {
			t.Errorf("%s present: %v", k, v)
		}
	}
	if h.method != "POST" || h.authority != "gw" || h.scheme != "http" || h.path != "/b?q=1" {
		t.Errorf("pseudo-headers %+v: only :path may change", h)
	}
}

func TestApplyResponseMutation(t *testing.T) {
	h := &responseHead{status: 200, header: http.Header{"X-A": {"1"}}}
	applyResponseMutation(h, &extprocv3.HeaderMutation{
		SetHeaders:    setHeaders(":status", "503", "x-b", "2"),
		RemoveHeaders: []string{"x-a", ":status"},
	})
	if h.status != 503 || h.header.Get("X-B") != "2" || h.header.Get("X-A") != "" {
		t.Errorf("got %+v", h)
	}
	applyResponseMutation(h, &extprocv3.HeaderMutation{SetHeaders: setHeaders(":status", "99")})
	if h.status != 503 {
		t.Errorf("invalid :status applied: %d", h.status)
	}
}

func TestRemoveHopByHop(t *testing.T) {
	h := http.Header{"Connection": {"keep-alive, X-Private"}, "X-Private": {"1"}, "Keep-Alive": {"5"}, "Te": {"trailers"}, "X-Public": {"1"}}
	removeHopByHop(h)
	if len(h) != 1 || h.Get("X-Public") != "1" {
		t.Errorf("left %v", h)
	}
}

func TestHeaderMapIsDeterministicAndLowerCase(t *testing.T) {
	h := &requestHead{method: "POST", path: "/p", authority: "a", scheme: "http", header: http.Header{"X-B": {"2", "3"}, "X-A": {"1"}}}
	got := h.toHeaderMap().GetHeaders()
	var keys []string
	for _, v := range got {
		keys = append(keys, v.GetKey()+"="+string(v.GetRawValue()))
	}
	want := []string{":method=POST", ":path=/p", ":authority=a", ":scheme=http", "x-a=1", "x-b=2", "x-b=3"}
	if len(keys) != len(want) {
		t.Fatalf("headers %v, want %v", keys, want)
	}
	for i := range want {
		if keys[i] != want[i] {
			t.Fatalf("headers %v, want %v", keys, want)
		}
	}
}
