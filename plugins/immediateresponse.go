package plugins

// Parts of the ext_proc ImmediateResponses Sluice answers itself (rejections and errors): headers such as
// Retry-After, and OpenAI-style JSON error bodies that HTTP clients and SDKs can parse.

import (
	"encoding/json"
	"net/http"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
)

// SetImmediateHeader sets (replaces) a header on an immediate response.
func SetImmediateHeader(resp *extprocv3.ImmediateResponse, key, value string) {
	if resp.Headers == nil {
		resp.Headers = &extprocv3.HeaderMutation{}
	}
	for _, h := range resp.Headers.SetHeaders {
		if h.Header != nil && strings.EqualFold(h.Header.Key, key) {
			h.Header.RawValue, h.Header.Value = []byte(value), ""
			return
		}
	}
	resp.Headers.SetHeaders = append(resp.Headers.SetHeaders, &corev3.HeaderValueOption{
		Header:       &corev3.HeaderValue{Key: key, RawValue: []byte(value)},
		AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
	})
}

// OpenAIError renders {"error":{"message","type","param","code"}} for an HTTP
// status. code is a short machine-readable code; empty renders as null.
func OpenAIError(status int, message, code string) []byte {
	type errorObject struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    any     `json:"code"`
	}
	var c any
	if code != "" {
		c = code
	}
	body, _ := json.Marshal(struct {
		Error errorObject `json:"error"`
	}{errorObject{Message: message, Type: OpenAIErrorType(status), Code: c}})
	return body
}

// OpenAIErrorType maps an HTTP status to the error type names OpenAI uses.
func OpenAIErrorType(status int) string {
	switch {
	case status == http.StatusUnauthorized:
		return "authentication_error"
	case status == http.StatusForbidden:
		return "permission_error"
	case status == http.StatusNotFound:
		return "not_found_error"
	case status == http.StatusTooManyRequests:
		return "rate_limit_error"
	case status == http.StatusServiceUnavailable:
		return "service_unavailable_error"
	case status >= 500:
		return "server_error"
	default:
		return "invalid_request_error"
	}
}
