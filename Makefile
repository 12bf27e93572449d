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
K8S_VERSION ?= 1.35.4
ETCD_VERSION ?= 3.6.16
ENVTEST_ASSETS = $(CACHE_DIR)/envtest/k8s-$(K8S_VERSION)_etcd-$(ETCD_VERSION)

BINARIES := epp
# Upstream's EPP, unmodified, at the version go.mod pins: the tests and
# benchmarks that compare Sluice with upstream run it side by side.
UPSTREAM_EPP := sigs.k8s.io/gateway-api-inference-extension/cmd/epp

.PHONY: all build test lint vet staticcheck envtest run fuzz clean help

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

# The whole suite. The process tests run bin/epp as a real process against a
# real API server (envtest); hack/image's test inspects the image tarball.
test: lint verify-generate envtest build image ## The whole suite: lint, unit, integration (real API server), image and race tests.
	KUBEBUILDER_ASSETS=$(ENVTEST_ASSETS) SLUICE_EPP_BINARY=$(BIN)/epp SLUICE_UPSTREAM_EPP_BINARY=$(BIN)/upstream-epp \
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

run: build ## Start a local simulated fleet, the EPP (static mode) and the data plane; send a demo load.
	BIN=$(BIN) examples/local-fleet/run.sh

.PHONY: bench
bench: build ## Benchmark suite, every scenario (SCENARIO=name,... for some; ENGINE=virtual for virtual time, SCENARIO=scale for the scale study, ENGINE=virtual SEEDS=1,2,3 for a seed sweep); report in bench-results/<time>/.
	$(BIN)/bench --bin=$(BIN) --scenarios=testbed/bench/scenarios $(if $(ENGINE),--engine=$(ENGINE)) $(if $(SCENARIO),--scenario=$(SCENARIO)) $(if $(BENCH_OUT),--out=$(BENCH_OUT)) $(if $(SEEDS),--seeds=$(SEEDS))

clean:
	rm -rf $(BIN)

include hack/image.mk
include crds/crds.mk
