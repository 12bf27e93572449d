package dataplane

import (
	"encoding/json"
	"net/http"
	"strconv"
)

// Error types and codes the proxy itself answers with. Upstream and EPP
// answers are passed through unchanged.
const (
	errTypeInvalidRequest = "invalid_request_error"
	errTypeServer         = "server_error"

	codeBodyTooLarge       = "request_too_large"
	codeBodyUnreadable     = "request_body_unreadable"
	codeEPPUnavailable     = "endpoint_picker_unavailable"
	codeEPPTimeout         = "endpoint_picker_timeout"
	codeNoEndpoint         = "no_endpoint"
	codeUpstreamConnect    = "upstream_connect_failed"
	codeUpstreamFailed     = "upstream_failed"
	codeUpstreamNotAllowed = "upstream_not_allowed"
)

// apiError is the OpenAI error envelope:
// {"error":{"message":..,"type":..,"param":..,"code":..}}.
type apiError struct {
	Error apiErrorBody `json:"error"`
}

type apiErrorBody struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    string  `json:"code"`
}

// writeError answers with an OpenAI-style JSON error.
func writeError(w http.ResponseWriter, status int, errType, code, msg string) {
	body, err := json.Marshal(apiError{Error: apiErrorBody{Message: msg, Type: errType, Code: code}})
	if err != nil {
		// Marshalling four strings cannot fail; keep the answer well-formed anyway.
		body = []byte(`{"error":{"message":"internal error","type":"server_error","param":null,"code":"internal"}}`)
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, _ = w.Write(body)
}
