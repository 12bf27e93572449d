// Package immediateresponse builds the parts of an ext_proc ImmediateResponse
// that Sluice answers itself (rejections and errors): headers such as
// Retry-After, and OpenAI-style JSON error bodies that HTTP clients and SDKs
// can parse.
package immediateresponse
