package dataplane

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
)

// Defaults applied by New to zero-valued Config fields.
const (
	// DefaultMessageTimeout matches message_timeout in GIE v1.5.0's reference
	// Envoy configuration (config/charts/standalone/values.yaml). It is long
	// because an EPP with queued admission answers the request headers only
	// when it dispatches the request.
	DefaultMessageTimeout = 1000 * time.Second
	// DefaultConnectTimeout bounds one TCP connect to one upstream endpoint;
	// after it the next endpoint in the EPP's list is tried.
	DefaultConnectTimeout = 5 * time.Second
	// DefaultMaxRequestBodyBytes bounds the buffered client request body.
	DefaultMaxRequestBodyBytes = 32 << 20
	// DefaultShutdownGrace is how long Serve waits for in-flight requests
	// after its context ends before it closes their connections.
	DefaultShutdownGrace = 30 * time.Second
)

// BodyMode is how the proxy sends a request body to the EPP: Envoy's
// ext_proc ProcessingMode.BodySendMode, of which two are implemented.
type BodyMode string

const (
	// BodyFullDuplexStreamed is FULL_DUPLEX_STREAMED: the body in chunks as
	// it arrives, without waiting for the EPP, which streams the body back.
	BodyFullDuplexStreamed BodyMode = "full-duplex-streamed"
	// BodyBuffered is BUFFERED: the proxy waits for the answer to the request
	// headers, then sends the whole body in one message; the EPP's one answer
	// may change headers and replace the body, and otherwise the proxy
	// forwards the body it holds.
	BodyBuffered BodyMode = "buffered"
)

// Config configures a Proxy. Exactly one of EPPAddress and RoundRobin selects
// the mode.
type Config struct {
	// EPPAddress is the host:port of the ext_proc server (the EPP). Setting it
	// selects EPP mode.
	EPPAddress string
	// EPPReplicas are further ext_proc servers, replicas of the same EPP
	// (one InferencePool's EPP pods behind one Envoy cluster): each request's
	// ext_proc stream goes to one of EPPAddress and EPPReplicas, picked per
	// stream by EPPBalance, as Envoy's cluster load balancer picks a host for
	// every new stream.
	EPPReplicas []string
	// EPPBalance is BalanceRoundRobin (the default, Envoy's ROUND_ROBIN) or
	// BalanceRandom (Envoy's RANDOM).
	EPPBalance string
	// RequestBodyMode is how the request body goes to the EPP, as Envoy's
	// ext_proc filter setting processing_mode.request_body_mode:
	// BodyFullDuplexStreamed (the default, GIE's reference configuration) or
	// BodyBuffered (doc.go, "BUFFERED request bodies").
	RequestBodyMode BodyMode
	// ResponseObserver plays Envoy with the routing filter's response phase skipped and a second ext_proc filter in
	// observability mode showing the EPP the response (observer.go); the EPP needs --response-observer-wait.
	ResponseObserver bool
	// EPPTLS dials the EPP over TLS without verifying its certificate: the
	// upstream EPP serves a self-signed certificate by default, and GIE's
	// reference Envoy configuration accepts it the same way (an empty
	// validation_context).
	EPPTLS bool
	// RoundRobin selects the baseline mode: no EPP, requests rotate over
	// Endpoints.
	RoundRobin bool
	// Endpoints are host:port model-server addresses. Round-robin mode
	// rotates over them; in EPP mode they are where fail-open requests go.
	Endpoints []string
	// FailureModeAllow is Envoy's failure_mode_allow (GIE's FailOpen): when
	// the EPP is unreachable, errors or times out, the request goes to
	// Endpoints round-robin without the EPP instead of failing. Requires
	// Endpoints.
	FailureModeAllow bool
	// EPPFailureRetryAfter, when set, plays Envoy with examples/envoy/epp-failure-503.yaml merged into its
	// configuration: failing closed, an EPP failure is answered 503 (the ext_proc filter's status_on_error) instead of
	// 500, and every 503 the gateway answers itself without a Retry-After (an EPP failure's, an EPP's
	// ImmediateResponse, no endpoint picked) gets this one, in whole seconds rounded up (a local reply mapping), so
	// that a client retries what an EPP replica lost when it died. Zero answers as GIE's reference configuration.
	EPPFailureRetryAfter time.Duration
	// SubsetHint, when non-empty, is sent on every ext_proc message as filter
	// metadata envoy.lb.subset_hint/x-gateway-destination-endpoint-subset:
	// the EPP must pick only from these host:port endpoints.
	SubsetHint []string
	// SubsetHintFromHeader takes the subset hint from the request header
	// x-gateway-destination-endpoint-subset (a comma-separated list; it
	// overrides SubsetHint) and removes the header. It exists for tests that
	// vary the subset per request; production gateways derive the subset
	// from their own configuration.
	SubsetHintFromHeader bool
	// ReportServedHeader adds x-gateway-destination-endpoint-served with the
	// endpoint that served the request to the client response, so load
	// generators can see where each request went. Envoy does not do this;
	// the EPP learns the served endpoint from metadata either way. It also
	// adds EPPTimeHeader, the time the request waited on the EPP.
	ReportServedHeader bool
	// RequestIDInResponse adds the request's x-request-id to its response, as Envoy's HCM does with
	// always_set_request_id_in_response, so a load generator can join its records with the EPP's decision trace,
	// which is keyed by that ID.
	RequestIDInResponse bool
	// AllowNonLoopbackUpstreams permits upstream endpoints outside
	// 127.0.0.0/8, ::1 and "localhost". Off by default: this proxy is a
	// benchmark and test tool, and its traffic stays on the machine unless
	// asked otherwise.
	AllowNonLoopbackUpstreams bool
	// MessageTimeout bounds how long the proxy waits for the EPP's answers to
	// the request headers and body. Zero means DefaultMessageTimeout.
	MessageTimeout time.Duration
	// ConnectTimeout bounds one upstream TCP connect. Zero means
	// DefaultConnectTimeout.
	ConnectTimeout time.Duration
	// MaxRequestBodyBytes bounds the client request body; larger bodies get
	// 413. Zero means DefaultMaxRequestBodyBytes.
	MaxRequestBodyBytes int64
	// ShutdownGrace is how long Serve drains after its context ends. Zero
	// means DefaultShutdownGrace.
	ShutdownGrace time.Duration
	// Logger receives warnings and errors; nil discards them.
	Logger *slog.Logger
	// Recorder receives per-request outcomes; nil records nothing.
	Recorder Recorder
	// NewRequestID generates every request's x-request-id, replacing any the
	// client sent, as Envoy does at the edge (use_remote_address, and
	// preserve_external_request_id false, its default). Nil means random UUIDs.
	NewRequestID func() string
}

// withDefaults returns a copy of c with zero fields set to their defaults.
func (c Config) withDefaults() Config {
	if c.MessageTimeout == 0 {
		c.MessageTimeout = DefaultMessageTimeout
	}
	if c.RequestBodyMode == "" {
		c.RequestBodyMode = BodyFullDuplexStreamed
	}
	if c.ConnectTimeout == 0 {
		c.ConnectTimeout = DefaultConnectTimeout
	}
	if c.MaxRequestBodyBytes == 0 {
		c.MaxRequestBodyBytes = DefaultMaxRequestBodyBytes
	}
	if c.ShutdownGrace == 0 {
		c.ShutdownGrace = DefaultShutdownGrace
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Recorder == nil {
		c.Recorder = noRecorder{}
	}
	if c.NewRequestID == nil {
		c.NewRequestID = uuid.NewString
	}
	return c
}

// validate reports every problem in c at once.
func (c Config) validate() error {
	var errs []error
	switch {
	case c.RoundRobin && c.EPPAddress != "":
		errs = append(errs, errors.New("round-robin mode and an EPP address are mutually exclusive"))
	case !c.RoundRobin && c.EPPAddress == "":
		errs = append(errs, errors.New("set an EPP address or select round-robin mode"))
	}
	if c.RoundRobin && len(c.Endpoints) == 0 {
		errs = append(errs, errors.New("round-robin mode needs at least one endpoint"))
	}
	if c.FailureModeAllow && len(c.Endpoints) == 0 {
		errs = append(errs, errors.New("failure-mode-allow needs endpoints to send requests to when the EPP fails"))
	}
	if c.EPPFailureRetryAfter < 0 {
		errs = append(errs, fmt.Errorf("EPP failure Retry-After %v is negative", c.EPPFailureRetryAfter))
	}
	if c.RoundRobin && (len(c.SubsetHint) > 0 || c.SubsetHintFromHeader) {
		errs = append(errs, errors.New("a subset hint is only meaningful with an EPP"))
	}
	if c.EPPAddress != "" {
		if _, err := parseHostPort(c.EPPAddress); err != nil {
			errs = append(errs, fmt.Errorf("EPP address: %w", err))
		}
	}
	if len(c.EPPReplicas) > 0 && c.EPPAddress == "" {
		errs = append(errs, errors.New("EPP replicas need an EPP address (the first replica)"))
	}
	for _, r := range c.EPPReplicas {
		if _, err := parseHostPort(r); err != nil {
			errs = append(errs, fmt.Errorf("EPP replica: %w", err))
		}
	}
	switch c.RequestBodyMode {
	case "", BodyFullDuplexStreamed, BodyBuffered:
	default:
		errs = append(errs, fmt.Errorf("request body mode %q is not %s or %s", c.RequestBodyMode, BodyFullDuplexStreamed, BodyBuffered))
	}
	switch c.EPPBalance {
	case "", BalanceRoundRobin, BalanceRandom:
	default:
		errs = append(errs, fmt.Errorf("EPP balance %q is not %s or %s", c.EPPBalance, BalanceRoundRobin, BalanceRandom))
	}
	for _, ep := range c.Endpoints {
		if err := checkEndpoint(ep, c.AllowNonLoopbackUpstreams); err != nil {
			errs = append(errs, fmt.Errorf("endpoint: %w", err))
		}
	}
	for _, ep := range c.SubsetHint {
		if _, err := parseHostPort(ep); err != nil {
			errs = append(errs, fmt.Errorf("subset hint: %w", err))
		}
	}
	if c.MessageTimeout < 0 || c.ConnectTimeout < 0 || c.ShutdownGrace < 0 {
		errs = append(errs, errors.New("timeouts must not be negative"))
	}
	if c.MaxRequestBodyBytes < 0 {
		errs = append(errs, errors.New("max request body bytes must not be negative"))
	}
	return errors.Join(errs...)
}

// parseHostPort checks that s is host:port with a numeric port in 1..65535
// and returns the host.
func parseHostPort(s string) (string, error) {
	host, port, err := net.SplitHostPort(strings.TrimSpace(s))
	if err != nil {
		return "", fmt.Errorf("%q is not host:port: %w", s, err)
	}
	if host == "" {
		return "", fmt.Errorf("%q has an empty host", s)
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 1 || n > 65535 {
		return "", fmt.Errorf("%q has an invalid port", s)
	}
	return host, nil
}

// checkEndpoint validates an upstream address and, unless allowRemote,
// requires it to be on the loopback interface.
func checkEndpoint(ep string, allowRemote bool) error {
	host, err := parseHostPort(ep)
	if err != nil {
		return err
	}
	if !allowRemote && !IsLoopbackHost(host) {
		return fmt.Errorf("%q is not a loopback address (127.0.0.0/8, ::1 or localhost)", ep)
	}
	return nil
}

// IsLoopbackHost reports whether host (an IP literal or name, without port)
// names the local machine: an IP in 127.0.0.0/8 or ::1, or "localhost". Other
// names are not resolved and count as non-loopback.
func IsLoopbackHost(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(strings.Trim(host, "[]"))
	return ip != nil && ip.IsLoopback()
}

// SplitEndpointList splits a comma-separated endpoint list as the EPP writes
// it in x-gateway-destination-endpoint, dropping empty items.
func SplitEndpointList(s string) []string {
	var out []string
	for item := range strings.SplitSeq(s, ",") {
		if item = strings.TrimSpace(item); item != "" {
			out = append(out, item)
		}
	}
	return out
}
