# hack/image.mk: `make image` builds the EPP container image without Docker.
# Included by the top-level Makefile, which defines CACHE_DIR. The pipeline
# (hack/image/doc.go explains why each step exists):
#   1. bin/ko at KO_VERSION, installed from the Go module proxy;
#   2. go run ./hack/image base: a distroless-style nonroot base, stored in
#      $(KOCACHE)/img, where ko finds it by digest without any registry;
#   3. ko build ./cmd/epp (.ko.yaml: CGO_ENABLED=0, -trimpath, version
#      ldflags) into a temporary tarball;
#   4. go run ./hack/image finalize: /epp entrypoint, user 65532, ports,
#      OCI labels, written to $(IMAGE_TARBALL) (`docker load -i` works).
# Needs only the Go module proxy; every step is cached (go build cache,
# $(KOCACHE)), so a second run only relinks and repacks.

# Repository root, from this file's location, so `make -C` and includes
# from elsewhere work. Must stay above any other include.
IMAGE_ROOT := $(abspath $(dir $(lastword $(MAKEFILE_LIST)))/..)

CACHE_DIR ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/sluice
KO_VERSION ?= v0.18.0
KO ?= $(IMAGE_ROOT)/bin/ko
KOCACHE ?= $(CACHE_DIR)/ko
VERSION ?= $(shell git -C $(IMAGE_ROOT) describe --tags --always --dirty 2>/dev/null || echo dev)
# --verify --quiet: in a repository without commits plain `rev-parse HEAD`
# prints "HEAD" before failing, which would end up in the label.
COMMIT ?= $(shell git -C $(IMAGE_ROOT) rev-parse --verify --quiet HEAD 2>/dev/null || echo unknown)
# Timestamp ko writes into the image config and history (reproducible-builds
# convention): the commit time, or the Unix epoch before the first commit.
SOURCE_DATE_EPOCH ?= $(shell git -C $(IMAGE_ROOT) log -1 --format=%ct 2>/dev/null || echo 0)
IMAGE_REPO ?= sluice/epp
IMAGE_SOURCE ?= https://github.com/sluice-gw/sluice
IMAGE_TARBALL ?= $(IMAGE_ROOT)/bin/sluice-epp-image.tar

.PHONY: image image-test ko-install

# Phony, but cheap: reinstalls only when bin/ko is missing or was built
# from another ko version (read from the binary's embedded module info).
ko-install:
	@if go version -m "$(KO)" 2>/dev/null | grep -Eq '^[[:space:]]+mod[[:space:]]+github\.com/google/ko[[:space:]]+$(KO_VERSION)([[:space:]]|$$)'; then \
		:; \
	else \
		echo "installing ko $(KO_VERSION) into $(dir $(KO))"; \
		GOBIN="$(dir $(KO))" go install github.com/google/ko@$(KO_VERSION); \
	fi

# KO_DOCKER_REPO only names the intermediate image (--bare: no path
# suffix); it must not start with ko.local or kind.local, which would make
# ko talk to a Docker daemon. --sbom=none: a docker tarball cannot carry
# ko's SBOM attachment, so generating one would be wasted work.
image: ko-install
	@set -eu; \
	tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	cd "$(IMAGE_ROOT)"; \
	base=$$(go run ./hack/image base --cache "$(KOCACHE)"); \
	echo "base image: $$base"; \
	KOCACHE="$(KOCACHE)" \
	KO_DEFAULTBASEIMAGE="$$base" \
	KO_DOCKER_REPO="$(IMAGE_REPO)" \
	KO_CONFIG_PATH="$(IMAGE_ROOT)/.ko.yaml" \
	SLUICE_VERSION="$(VERSION)" \
	SLUICE_COMMIT="$(COMMIT)" \
	SOURCE_DATE_EPOCH="$(SOURCE_DATE_EPOCH)" \
	KO_DATA_DATE_EPOCH="$(SOURCE_DATE_EPOCH)" \
	CGO_ENABLED=0 \
	"$(KO)" build ./cmd/epp --platform=linux/amd64 --push=false --bare --sbom=none \
		--tags=ko-intermediate --tarball="$$tmp/ko.tar" >/dev/null; \
	go run ./hack/image finalize --in "$$tmp/ko.tar" --out "$(IMAGE_TARBALL)" \
		--tag "$(IMAGE_REPO):$(VERSION)" --version "$(VERSION)" --revision "$(COMMIT)" \
		--source "$(IMAGE_SOURCE)"

# Inspects the tarball `image` just wrote (hack/image/image_test.go).
image-test: image
	cd "$(IMAGE_ROOT)" && \
	SLUICE_IMAGE_TARBALL="$(IMAGE_TARBALL)" \
	SLUICE_IMAGE_VERSION="$(VERSION)" \
	SLUICE_IMAGE_REVISION="$(COMMIT)" \
	go test -count=1 ./hack/image
