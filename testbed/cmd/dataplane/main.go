// Command dataplane runs Sluice's test data plane: an HTTP reverse proxy that
// consults an Endpoint Picker over ext_proc the way Envoy does with GIE's
// reference configuration (see package dataplane), or rotates round-robin
// over fixed endpoints as the benchmark baseline. Production uses Envoy; see
// examples/envoy.
//
// Usage:
//
//	dataplane --listen 127.0.0.1:8081 --epp 127.0.0.1:9002 --epp-tls \
//	    [--failure-mode-allow --endpoints 127.0.0.1:8000,127.0.0.1:8001]
//	dataplane --listen 127.0.0.1:8081 --round-robin --endpoints 127.0.0.1:8000,127.0.0.1:8001
//	dataplane --listen 127.0.0.1:8081 --epp 127.0.0.1:9002,127.0.0.1:9012 --epp-balance random
//
// With several --epp addresses (replicas of one EPP) every request's ext_proc
// stream goes to one of them, round-robin or at random, as Envoy balances the
// streams of an ext_proc cluster.
//
// --metrics-listen serves Prometheus metrics; with --enable-pprof it also
// serves Go's profiles (/debug/pprof/, the CPU profile at
// /debug/pprof/profile?seconds=N), for finding where the data plane's CPU goes
// in a benchmark.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/sluice-gw/sluice/testbed/dataplane"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "dataplane:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("dataplane", flag.ContinueOnError)
	var (
		listen        = fs.String("listen", "127.0.0.1:8081", "address to serve HTTP on")
		epp           = fs.String("epp", "", "EPP ext_proc address host:port (EPP mode), or a comma-separated list of the EPP's replicas")
		eppBalance    = fs.String("epp-balance", dataplane.BalanceRoundRobin, "how ext_proc streams are spread over the EPP's replicas, one per request: round-robin or random")
		bodyMode      = fs.String("request-body-mode", string(dataplane.BodyFullDuplexStreamed), "how request bodies go to the EPP, as Envoy's ext_proc request_body_mode: full-duplex-streamed (GIE's) or buffered")
		observer      = fs.Bool("response-observer", false, "skip the response on the routing ext_proc stream and show it to the EPP on a second stream in observability mode, as Envoy with examples/envoy/envoy-response-observer.yaml (the EPP needs --response-observer-wait)")
		eppTLS        = fs.Bool("epp-tls", false, "dial the EPP over TLS without verifying its (self-signed) certificate")
		roundRobin    = fs.Bool("round-robin", false, "no EPP: rotate over --endpoints (benchmark baseline)")
		endpoints     = fs.String("endpoints", "", "comma-separated model server addresses host:port (round-robin targets; fail-open targets in EPP mode)")
		failOpen      = fs.Bool("failure-mode-allow", false, "fail open: when the EPP fails, send requests round-robin to --endpoints instead of answering 500")
		eppRetryAfter = fs.Duration("epp-failure-retry-after", 0, "failing closed, answer an EPP failure 503 instead of 500, and give the proxy's own 503s without a Retry-After this one, as Envoy with examples/envoy/epp-failure-503.yaml (0: off)")
		subsetHint    = fs.String("subset-hint", "", "comma-separated endpoints sent to the EPP as the envoy.lb.subset_hint subset")
		subsetHeader  = fs.Bool("subset-hint-header", false, "take the subset hint per request from the x-gateway-destination-endpoint-subset header (tests)")
		servedHeader  = fs.Bool("served-header", true, "add x-gateway-destination-endpoint-served to responses")
		requestID     = fs.Bool("request-id-in-response", true, "add the request's x-request-id to its response (Envoy's always_set_request_id_in_response), which the EPP's decision trace is keyed by")
		allowRemote   = fs.Bool("allow-non-loopback-upstreams", false, "allow upstream endpoints outside the loopback interface")
		msgTimeout    = fs.Duration("message-timeout", dataplane.DefaultMessageTimeout, "how long to wait for the EPP's routing decision")
		connTimeout   = fs.Duration("connect-timeout", dataplane.DefaultConnectTimeout, "timeout of one upstream connect before the next endpoint is tried")
		maxBody       = fs.Int64("max-request-body-bytes", dataplane.DefaultMaxRequestBodyBytes, "largest accepted request body")
		grace         = fs.Duration("shutdown-grace", dataplane.DefaultShutdownGrace, "how long in-flight requests may finish after SIGINT/SIGTERM")
		metricsListen = fs.String("metrics-listen", "", "address to serve Prometheus /metrics on (off when empty)")
		enablePprof   = fs.Bool("enable-pprof", false, "also serve Go's profiles under /debug/pprof/ on --metrics-listen")
		logLevel      = fs.String("log-level", "info", "debug, info, warn or error")
	)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *enablePprof && *metricsListen == "" {
		return errors.New("--enable-pprof needs --metrics-listen")
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %v", fs.Args())
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))

	epps := dataplane.SplitEndpointList(*epp)
	var eppAddress string
	if len(epps) > 0 {
		eppAddress = epps[0]
	}
	cfg := dataplane.Config{
		EPPAddress:                eppAddress,
		EPPReplicas:               epps[min(1, len(epps)):],
		EPPBalance:                *eppBalance,
		EPPTLS:                    *eppTLS,
		RequestBodyMode:           dataplane.BodyMode(*bodyMode),
		ResponseObserver:          *observer,
		RoundRobin:                *roundRobin,
		Endpoints:                 dataplane.SplitEndpointList(*endpoints),
		FailureModeAllow:          *failOpen,
		EPPFailureRetryAfter:      *eppRetryAfter,
		SubsetHint:                dataplane.SplitEndpointList(*subsetHint),
		SubsetHintFromHeader:      *subsetHeader,
		ReportServedHeader:        *servedHeader,
		RequestIDInResponse:       *requestID,
		AllowNonLoopbackUpstreams: *allowRemote,
		MessageTimeout:            *msgTimeout,
		ConnectTimeout:            *connTimeout,
		MaxRequestBodyBytes:       *maxBody,
		ShutdownGrace:             *grace,
		Logger:                    logger,
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	var metricsSrv *http.Server
	if *metricsListen != "" {
		reg := prometheus.NewRegistry()
		reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
		rec, err := dataplane.NewPrometheusRecorder(reg)
		if err != nil {
			return err
		}
		cfg.Recorder = rec
		ml, err := net.Listen("tcp", *metricsListen)
		if err != nil {
			return fmt.Errorf("metrics listener: %w", err)
		}
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
		if *enablePprof {
			mux.HandleFunc("/debug/pprof/", pprof.Index)
			mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		}
		metricsSrv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		go func() {
			if err := metricsSrv.Serve(ml); err != nil && !errors.Is(err, http.ErrServerClosed) {
				logger.Error("metrics server failed", "error", err)
			}
		}()
		logger.Info("serving metrics", "address", ml.Addr().String())
	}

	proxy, err := dataplane.New(cfg)
	if err != nil {
		return err
	}
	defer func() { _ = proxy.Close() }()
	l, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("listener: %w", err)
	}
	mode := "epp " + *epp
	if len(epps) > 1 {
		mode += ", streams balanced " + *eppBalance
	}
	if *roundRobin {
		mode = "round-robin"
	}
	logger.Info("data plane listening", "address", l.Addr().String(), "mode", mode)
	err = proxy.Serve(ctx, l)
	if metricsSrv != nil {
		_ = metricsSrv.Close()
	}
	return err
}
