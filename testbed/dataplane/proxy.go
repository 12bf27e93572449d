package dataplane

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/metadata"
)

// copyBufferSize is the read size for response bodies. Each read is written
// and flushed at once, so an SSE event reaches the client as soon as the
// upstream sends it.
const copyBufferSize = 32 << 10

// Proxy is the data plane: an http.Handler that routes each request to a
// model server chosen by the EPP (or round-robin).
type Proxy struct {
	cfg       Config
	epps      *eppReplicas // nil in round-robin mode
	transport *http.Transport
	next      atomic.Uint64 // round-robin position
}

var _ http.Handler = (*Proxy)(nil)

// New validates cfg, applies defaults and returns a Proxy. In EPP mode it
// creates a gRPC client for the EPP; the connection is made lazily, so New
// succeeds while the EPP is still starting. Call Close when done.
func New(cfg Config) (*Proxy, error) {
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("invalid data plane config: %w", err)
	}
	cfg = cfg.withDefaults()
	p := &Proxy{cfg: cfg}
	dialer := &net.Dialer{Timeout: cfg.ConnectTimeout, KeepAlive: 30 * time.Second}
	p.transport = &http.Transport{
		DialContext:         dialer.DialContext,
		MaxIdleConns:        4096,
		MaxIdleConnsPerHost: 1024,
		IdleConnTimeout:     90 * time.Second,
		// The client's Accept-Encoding passes through; the proxy neither adds
		// nor undoes compression.
		DisableCompression: true,
	}
	if cfg.EPPAddress != "" {
		creds := insecure.NewCredentials()
		if cfg.EPPTLS {
			// The EPP self-signs its certificate by default; GIE's reference
			// Envoy config accepts it without verification as well.
			creds = credentials.NewTLS(&tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}) //nolint:gosec // see comment above
		}
		epps, err := newEPPReplicas(append([]string{cfg.EPPAddress}, cfg.EPPReplicas...), cfg.EPPBalance, creds)
		if err != nil {
			return nil, err
		}
		p.epps = epps
	}
	return p, nil
}

// Close releases the EPP connection and idle upstream connections. In-flight
// requests fail once it is called.
func (p *Proxy) Close() error {
	p.transport.CloseIdleConnections()
	if p.epps != nil {
		return p.epps.Close()
	}
	return nil
}

// Serve serves HTTP on l until ctx ends, then stops accepting, waits up to
// ShutdownGrace for in-flight requests and closes the rest. It returns nil
// after a shutdown caused by ctx, or the error that stopped the server. It
// does not close the Proxy.
func (p *Proxy) Serve(ctx context.Context, l net.Listener) error {
	srv := &http.Server{Handler: p, ReadHeaderTimeout: 30 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(l) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.cfg.ShutdownGrace)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		_ = srv.Close()
	}
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// ServeHTTP answers every request exactly once: with the upstream response,
// an EPP ImmediateResponse, or a JSON error. A failure after the response
// headers went out aborts the connection, which is the only honest signal
// left at that point.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	ex := &exchange{p: p, w: w, r: r}
	outcome := ex.run()
	p.cfg.Recorder.RecordRequest(outcome, ex.failedOpen, time.Since(start))
	if outcome == OutcomeAborted {
		// Cut the connection: after partial headers or body, or when the
		// client is already gone, no well-formed answer is possible, and an
		// empty 200 from the server would be a lie.
		panic(http.ErrAbortHandler)
	}
}

// EPPTimeHeader is where the data plane reports, with ReportServedHeader, how long a request waited on the EPP
// before its response headers went to the client (seconds): the part of the time to first token the EPP hop adds,
// from the data plane's own clock, which a round-robin request (no EPP) does not spend. The first response body
// chunk's round trip through the EPP, also before the first token, is not in it.
const EPPTimeHeader = "x-dataplane-epp-seconds"

// exchange is the state of one client request.
type exchange struct {
	p          *Proxy
	w          http.ResponseWriter
	r          *http.Request
	failedOpen bool
	// eppTime is how long the request waited on the EPP before its response headers could go to the client: from
	// opening the ext_proc stream to the request phase's last answer, and from sending the response headers to the
	// EPP's answer to them. 0 without the EPP.
	eppTime time.Duration
	// requestID is the x-request-id the proxy gave the request ("" before requestHead).
	requestID string
}

func (ex *exchange) run() Outcome {
	p := ex.p
	body, err := io.ReadAll(io.LimitReader(ex.r.Body, p.cfg.MaxRequestBodyBytes+1))
	if err != nil {
		writeError(ex.w, http.StatusBadRequest, errTypeInvalidRequest, codeBodyUnreadable, "reading the request body: "+err.Error())
		return OutcomeBadRequest
	}
	if int64(len(body)) > p.cfg.MaxRequestBodyBytes {
		writeError(ex.w, http.StatusRequestEntityTooLarge, errTypeInvalidRequest, codeBodyTooLarge,
			fmt.Sprintf("request body exceeds %d bytes", p.cfg.MaxRequestBodyBytes))
		return OutcomeBadRequest
	}
	head := ex.requestHead()
	if p.cfg.RoundRobin {
		return ex.passthrough(head, body, p.rotation())
	}
	hint, hintSet := p.cfg.SubsetHint, len(p.cfg.SubsetHint) > 0
	if p.cfg.SubsetHintFromHeader {
		if v, ok := head.header[http.CanonicalHeaderKey(metadata.SubsetFilterKey)]; ok {
			hint, hintSet = SplitEndpointList(firstOr(v, "")), true
			head.header.Del(metadata.SubsetFilterKey)
		}
	}
	return ex.viaEPP(head, body, subsetHint{endpoints: hint, set: hintSet})
}

// requestHead builds the head that the EPP and the upstream see, adding the
// headers Envoy adds (x-request-id, x-forwarded-for, x-forwarded-proto) and
// dropping what a client must not choose: hop-by-hop headers, the
// destination headers, which only the EPP may set, and its own x-request-id,
// which the EPP keys per-request state by.
func (ex *exchange) requestHead() *requestHead {
	r := ex.r
	h := r.Header.Clone()
	removeHopByHop(h)
	h.Del("Host")
	h.Del(metadata.DestinationEndpointKey)
	h.Del(metadata.DestinationEndpointServedKey)
	ex.requestID = ex.p.cfg.NewRequestID()
	h.Set("X-Request-Id", ex.requestID)
	if ex.p.cfg.RequestIDInResponse {
		ex.w.Header().Set("X-Request-Id", ex.requestID)
	}
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	h.Set("X-Forwarded-Proto", scheme)
	appendForwardedFor(h, r.RemoteAddr)
	return &requestHead{
		method:    r.Method,
		path:      r.URL.RequestURI(),
		authority: r.Host,
		scheme:    scheme,
		header:    h,
	}
}

// rotation returns Endpoints starting at the next round-robin position, so
// a refused connection falls through to the following endpoint.
func (p *Proxy) rotation() []string {
	n := len(p.cfg.Endpoints)
	start := int((p.next.Add(1) - 1) % uint64(n))
	out := make([]string, 0, n)
	out = append(out, p.cfg.Endpoints[start:]...)
	return append(out, p.cfg.Endpoints[:start]...)
}

// passthrough sends the request to the first endpoint that accepts a
// connection and streams its response back unchanged.
func (ex *exchange) passthrough(head *requestHead, body []byte, endpoints []string) Outcome {
	upCtx, upCancel := context.WithCancel(ex.r.Context())
	defer upCancel()
	resp, served, outcome := ex.dispatch(upCtx, head, body, endpoints)
	if resp == nil {
		return outcome
	}
	defer func() { _ = resp.Body.Close() }()
	rh := &responseHead{status: resp.StatusCode, header: resp.Header}
	removeHopByHop(rh.header)
	ex.writeHead(rh, served)
	return ex.copyBody(resp.Body)
}

// copyBody streams r to the client, flushing after every read.
func (ex *exchange) copyBody(r io.Reader) Outcome { return ex.copyBodyShowing(r, nil) }

// copyBodyShowing is copyBody, handing shown (when not nil) each part once the client has it; shown must not keep
// the slice.
func (ex *exchange) copyBodyShowing(r io.Reader, shown func([]byte)) Outcome {
	buf := make([]byte, copyBufferSize)
	rc := http.NewResponseController(ex.w)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			if _, werr := ex.w.Write(buf[:n]); werr != nil {
				return OutcomeAborted
			}
			_ = rc.Flush()
			if shown != nil {
				shown(buf[:n])
			}
		}
		if errors.Is(err, io.EOF) {
			return OutcomeProxied
		}
		if err != nil {
			ex.p.cfg.Logger.Warn("upstream response body failed", "error", err)
			return OutcomeAborted
		}
	}
}

// writeHead writes the response status and headers to the client.
func (ex *exchange) writeHead(rh *responseHead, served string) {
	h := ex.w.Header()
	for k, v := range rh.header {
		h[k] = v
	}
	if ex.p.cfg.RequestIDInResponse && ex.requestID != "" {
		h.Set("X-Request-Id", ex.requestID)
	}
	h.Del(metadata.DestinationEndpointServedKey)
	if ex.p.cfg.ReportServedHeader && served != "" {
		h.Set(metadata.DestinationEndpointServedKey, served)
	}
	h.Del(EPPTimeHeader)
	if ex.p.cfg.ReportServedHeader && ex.eppTime > 0 {
		h.Set(EPPTimeHeader, strconv.FormatFloat(ex.eppTime.Seconds(), 'f', 6, 64))
	}
	ex.w.WriteHeader(rh.status)
}

// dispatch tries endpoints in order until one accepts a TCP connection and
// returns its response. Only connect failures move on to the next endpoint:
// once a request may have reached a server it is not sent again. On failure
// it has already answered the client and returns a nil response.
func (ex *exchange) dispatch(ctx context.Context, head *requestHead, body []byte, endpoints []string) (*http.Response, string, Outcome) {
	p := ex.p
	if len(endpoints) == 0 {
		ex.p.cfg.localReply(http.StatusServiceUnavailable, ex.w.Header())
		writeError(ex.w, http.StatusServiceUnavailable, errTypeServer, codeNoEndpoint, "no endpoint was picked for the request")
		return nil, "", OutcomeNoEndpoint
	}
	var lastErr error
	allowed := 0
	for _, ep := range endpoints {
		if err := checkEndpoint(ep, p.cfg.AllowNonLoopbackUpstreams); err != nil {
			p.cfg.Logger.Warn("skipping endpoint", "endpoint", ep, "error", err)
			lastErr = err
			continue
		}
		allowed++
		req, err := newUpstreamRequest(ctx, head, body, ep)
		if err != nil {
			lastErr = err
			continue
		}
		resp, err := p.transport.RoundTrip(req)
		if err == nil {
			return resp, ep, OutcomeProxied
		}
		if ctx.Err() != nil {
			// The client went away; nobody is left to answer.
			return nil, "", OutcomeAborted
		}
		if !isConnectError(err) {
			p.cfg.Logger.Warn("upstream request failed", "endpoint", ep, "error", err)
			writeError(ex.w, http.StatusBadGateway, errTypeServer, codeUpstreamFailed,
				fmt.Sprintf("upstream %s failed: %v", ep, err))
			return nil, "", OutcomeUpstreamError
		}
		lastErr = err
	}
	if allowed == 0 {
		writeError(ex.w, http.StatusBadGateway, errTypeServer, codeUpstreamNotAllowed,
			fmt.Sprintf("no usable endpoint among %v: %v", endpoints, lastErr))
		return nil, "", OutcomeUpstreamError
	}
	writeError(ex.w, http.StatusBadGateway, errTypeServer, codeUpstreamConnect,
		fmt.Sprintf("could not connect to any of %v: %v", endpoints, lastErr))
	return nil, "", OutcomeUpstreamError
}

// newUpstreamRequest builds the request for one endpoint. The body is a
// bytes.Reader so the transport may replay it on a connection that turned
// out dead before anything was written.
func newUpstreamRequest(ctx context.Context, head *requestHead, body []byte, endpoint string) (*http.Request, error) {
	u, err := url.ParseRequestURI(head.path)
	if err != nil {
		return nil, fmt.Errorf("invalid :path %q: %w", head.path, err)
	}
	u.Scheme, u.Host = "http", endpoint
	req, err := http.NewRequestWithContext(ctx, head.method, u.String(), bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header = head.header.Clone()
	req.Header.Del("Content-Length") // req.ContentLength is authoritative
	req.Host = head.authority
	if len(body) == 0 {
		req.Body, req.GetBody, req.ContentLength = http.NoBody, nil, 0
	}
	return req, nil
}

// isConnectError reports whether err happened while dialing, i.e. before
// any byte of the request could reach the endpoint.
func isConnectError(err error) bool {
	var opErr *net.OpError
	return errors.As(err, &opErr) && opErr.Op == "dial"
}

func firstOr(v []string, def string) string {
	if len(v) == 0 {
		return def
	}
	return v[0]
}
