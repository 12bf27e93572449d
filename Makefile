# Sluice: the two commands a newcomer needs are `make run` and `make test`.
# Everything they need (envtest binaries, linters, ko) is built from the Go
# module proxy on first use and cached under $(CACHE_DIR).

SHELL := /usr/bin/env bash -o pipefail
GO ?= go
CACHE_DIR ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/sluice
BIN := $(CURDIR)/bin
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT ?= $(shell git rev-parse --verify -q HEAD 2>/dev/null || echo unknown)
LDFLAGS := -X github.com/sluice-gw/sluice/runner.version=$(VERSION) -X github.com/sluice-gw/sluice/runner.commit=$(COMMIT)

STATICCHECK_VERSION ?= v0.8.2
# helm renders upstream's inferencepool chart in the chart tests. A pinned
# binary, not Helm's Go SDK: the SDK would pull Helm's dependency tree into
# the product's go.mod and raise its k8s.io modules to Helm's (v0.37).
HELM_VERSION ?= v3.22.0
HELM := $(CACHE_DIR)/tools/helm-$(HELM_VERSION)/helm
K8S_VERSION ?= 1.35.4
ETCD_VERSION ?= 3.6.16
ENVTEST_ASSETS = $(CACHE_DIR)/envtest/k8s-$(K8S_VERSION)_etcd-$(ETCD_VERSION)

BINARIES := epp
# Upstream's EPP, unmodified, at the version go.mod pins: the tests and
# benchmarks that compare Sluice with upstream run it side by side.
UPSTREAM_EPP := sigs.k8s.io/gateway-api-inference-extension/cmd/epp

.PHONY: all build test lint vet staticcheck envtest helm run fuzz clean help conformance conformance-gateway conformance-gateway-build

all: build

help: ## List targets.
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

build: ## Build every binary into bin/.
	@mkdir -p $(BIN)
	$(GO) build -trimpath -ldflags "$(LDFLAGS)" -o $(BIN)/ ./cmd/... ./testbed/cmd/...
	$(GO) build -trimpath -o $(BIN)/upstream-epp $(UPSTREAM_EPP)

envtest: $(ENVTEST_ASSETS)/kube-apiserver ## Build (once) a real kube-apiserver and etcd for envtest.

$(ENVTEST_ASSETS)/kube-apiserver:
	K8S_VERSION=$(K8S_VERSION) ETCD_VERSION=$(ETCD_VERSION) SLUICE_CACHE=$(CACHE_DIR) hack/envtest-binaries.sh

helm: $(HELM) ## Build (once) the pinned helm the chart tests render upstream's chart with.

$(HELM):
	@mkdir -p $(dir $@)
	GOBIN=$(dir $@) $(GO) install -trimpath -ldflags "-X helm.sh/helm/v3/internal/version.version=$(HELM_VERSION)" helm.sh/helm/v3/cmd/helm@$(HELM_VERSION)

# The whole suite. The process tests run bin/epp as a real process against a
# real API server (envtest); cmd/epp's chart tests render upstream's Helm
# chart with $(HELM); hack/image's test inspects the image tarball.
test: lint verify-generate envtest helm build image conformance-gateway-build ## The whole suite: lint, unit, integration (real API server), chart, conformance, image and race tests.
	KUBEBUILDER_ASSETS=$(ENVTEST_ASSETS) SLUICE_EPP_BINARY=$(BIN)/epp SLUICE_UPSTREAM_EPP_BINARY=$(BIN)/upstream-epp SLUICE_HELM_BINARY=$(HELM) \
	SLUICE_VERSION=$(VERSION) \
	SLUICE_IMAGE_TARBALL=$(IMAGE_TARBALL) SLUICE_IMAGE_VERSION=$(VERSION) SLUICE_IMAGE_REVISION=$(COMMIT) \
		$(GO) test -race -count=1 -timeout 30m ./...

lint: vet staticcheck ## go vet and staticcheck.

vet:
	$(GO) vet ./...

$(BIN)/staticcheck-$(STATICCHECK_VERSION):
	@mkdir -p $(BIN)
	GOBIN=$(BIN) $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)
	mv $(BIN)/staticcheck $@

staticcheck: $(BIN)/staticcheck-$(STATICCHECK_VERSION)
	$< ./...

# Not part of `make test`: `go test` replays each target's seed corpus
# (testdata/fuzz) instead.
fuzz: ## Fuzz every target for FUZZTIME each (default 30s; FUZZ=regexp, PKGS=dirs to narrow); a crasher lands in testdata/fuzz.
	GO=$(GO) $(if $(FUZZTIME),FUZZTIME=$(FUZZTIME)) $(if $(FUZZ),FUZZ='$(FUZZ)') $(if $(PKGS),PKGS='$(PKGS)') $(if $(FUZZMINIMIZETIME),FUZZMINIMIZETIME=$(FUZZMINIMIZETIME)) hack/fuzz.sh

run: build ## Start a local simulated fleet behind Sluice (admission, default profile); demo three priority classes at 2x capacity against round-robin.
	BIN=$(BIN) examples/local-fleet/run.sh

.PHONY: bench
bench: build ## Benchmark suite, every scenario (SCENARIO=name,... for some; ENGINE=virtual for virtual time, SCENARIO=scale for the scale study, ENGINE=virtual SEEDS=1,2,3 for a seed sweep); report in bench-results/<time>/.
	$(BIN)/bench --bin=$(BIN) --scenarios=testbed/bench/scenarios $(if $(ENGINE),--engine=$(ENGINE)) $(if $(SCENARIO),--scenario=$(SCENARIO)) $(if $(BENCH_OUT),--out=$(BENCH_OUT)) $(if $(SEEDS),--seeds=$(SEEDS))

# The EPP conformance profile (conformance/): upstream's EPP, Sluice with its
# defaults and Sluice with every feature on, one after the other, against a
# real API server; or EPP=/path/to/epp [EPP_ARGS="..."] [EPP_NAME=...] for anyone's EPP
# (compared with upstream's). Reports in $(CONFORMANCE_OUT).
CONFORMANCE_OUT ?= conformance-results
conformance: envtest build ## EPP conformance profile + differential with upstream (EPP=path for your own EPP); reports in conformance-results/.
	KUBEBUILDER_ASSETS=$(ENVTEST_ASSETS) SLUICE_EPP_BINARY=$(BIN)/epp SLUICE_UPSTREAM_EPP_BINARY=$(BIN)/upstream-epp \
	SLUICE_VERSION=$(VERSION) \
		$(GO) test -count=1 -timeout 30m ./conformance -args \
		-report-dir=$(abspath $(CONFORMANCE_OUT)) \
		$(if $(EPP),-epp=$(abspath $(EPP)) -epp-args="$(EPP_ARGS)" $(if $(EPP_NAME),-epp-name=$(EPP_NAME)) -reference-epp=$(BIN)/upstream-epp)
	$(GO) test -count=1 ./conformance/gateway
	@echo "reports: $(CONFORMANCE_OUT)/conformance-table.md, $(CONFORMANCE_OUT)/conformance-report-*.yaml"

# Upstream's Gateway profile (sigs.k8s.io/gateway-api-inference-extension/
# conformance v1.5.0), unchanged, with the EPP image in its manifests
# replaced by EPP_IMAGE, against the cluster of KUBECONFIG and its
# GATEWAY_CLASS. conformance/README.md has the steps for kind.
EPP_IMAGE ?= $(IMAGE_REPO):$(VERSION)
conformance-gateway-build: ## Build upstream's Gateway profile test binary (bin/conformance-gateway.test).
	@mkdir -p $(BIN)
	$(GO) vet -tags gateway ./conformance/gateway
	$(GO) test -tags gateway -c -o $(BIN)/conformance-gateway.test ./conformance/gateway

conformance-gateway: conformance-gateway-build ## Upstream's Gateway profile with Sluice's EPP image: GATEWAY_CLASS=... [KUBECONFIG=...] [EPP_IMAGE=...].
	@test -n "$(GATEWAY_CLASS)" || { echo "GATEWAY_CLASS is required: the GatewayClass of the gateway under test (e.g. eg, istio)" >&2; exit 2; }
	@mkdir -p $(CONFORMANCE_OUT)
	$(if $(KUBECONFIG),KUBECONFIG=$(KUBECONFIG)) $(BIN)/conformance-gateway.test -test.v -test.timeout 60m \
		-test.run TestGatewayProfile -gateway-class=$(GATEWAY_CLASS) -epp-image=$(EPP_IMAGE) \
		-report-output=$(abspath $(CONFORMANCE_OUT))/gateway-report.yaml $(GATEWAY_CONFORMANCE_ARGS)
# The chaos suite and the soak run real processes against the wall clock: each holds the machine-wide real-time
# lock (flock) while it measures, so two real-time runs never share the CPUs. `make test` runs the chaos suite's
# smoke cases only (testbed/chaos).
CHAOS_OUT ?= chaos-results/$(shell date -u +%Y%m%dT%H%M%SZ)
REALTIME_LOCK ?= /tmp/sluice-realtime.lock
RUN_CHAOS_TEST = $(GO) test -c -o $(BIN)/chaos.test ./testbed/chaos && cd testbed/chaos && \
	KUBEBUILDER_ASSETS=$(ENVTEST_ASSETS) SLUICE_EPP_BINARY=$(BIN)/epp flock $(REALTIME_LOCK) \
	$(BIN)/chaos.test -test.v -chaos.out $(abspath $(CHAOS_OUT))

.PHONY: chaos soak
chaos: envtest build ## Chaos suite: every fault in static and Kubernetes mode, full timeline (~20 min; SHORT=1 for the short one); report in chaos-results/<time>/.
	$(RUN_CHAOS_TEST) -test.run '^TestChaos$$' -test.timeout 90m $(if $(SHORT),-chaos.all,-chaos.full)

SOAK ?= 10m
soak: envtest build ## Soak: 3x the fleet's capacity for SOAK (default 10m) with clients honouring Retry-After; report and plot in chaos-results/<time>/.
	$(RUN_CHAOS_TEST) -test.run '^TestSoak$$' -test.timeout 2h -chaos.soak $(SOAK)

clean:
	rm -rf $(BIN)

include hack/image.mk
include crds/crds.mk
