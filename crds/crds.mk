# crds.mk: code generation for the CRDs in crds/. Included by the top-level Makefile; paths are relative to the
# repository root. `make generate` rewrites crds/zz_generated.deepcopy.go and crds/manifests/; `make verify-generate`
# regenerates both into a temporary directory and fails if the committed files differ.

GO ?= go
BIN ?= $(CURDIR)/bin
CONTROLLER_GEN_VERSION ?= v0.20.1
CONTROLLER_GEN := $(BIN)/controller-gen-$(CONTROLLER_GEN_VERSION)
CRD_PACKAGES := ./crds
CRD_MANIFESTS := crds/manifests

# allowDangerousTypes: the spec mirrors flowcontrol.APIConfig, whose ceilings, thresholds, jitter and weights are
# bounded fractions (float64). Their range checks make the usual float portability concern moot.
CONTROLLER_GEN_CRD_OPTIONS := crd:allowDangerousTypes=true

.PHONY: generate verify-generate

$(CONTROLLER_GEN):
	@mkdir -p $(BIN)
	GOBIN=$(BIN) $(GO) install sigs.k8s.io/controller-tools/cmd/controller-gen@$(CONTROLLER_GEN_VERSION)
	mv $(BIN)/controller-gen $@

generate: $(CONTROLLER_GEN) ## Regenerate deepcopy code and CRD manifests from crds/.
	$(CONTROLLER_GEN) object paths=$(CRD_PACKAGES) $(CONTROLLER_GEN_CRD_OPTIONS) paths=$(CRD_PACKAGES) \
		output:crd:dir=$(CRD_MANIFESTS)

verify-generate: $(CONTROLLER_GEN) ## Fail if crds/ generated files are stale.
	@tmp="$$(mktemp -d)"; trap 'rm -rf "$$tmp"' EXIT; \
	$(CONTROLLER_GEN) object paths=$(CRD_PACKAGES) output:object:dir="$$tmp/object" \
		$(CONTROLLER_GEN_CRD_OPTIONS) paths=$(CRD_PACKAGES) output:crd:dir="$$tmp/manifests" && \
	if ! diff -u crds/zz_generated.deepcopy.go "$$tmp/object/zz_generated.deepcopy.go" || \
	   ! diff -ru $(CRD_MANIFESTS) "$$tmp/manifests"; then \
		echo "crds/: generated files are stale; run 'make generate' and commit the result" >&2; exit 1; \
	fi
