package conformance

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Names of the implementations `make conformance` compares. Differences
// and Findings refer to them.
const (
	// Upstream is GIE v1.5.0's own EPP, built unmodified from the module
	// (bin/upstream-epp): the reference every other implementation is
	// compared with.
	Upstream = "upstream-v1.5.0"
	// Sluice is Sluice's EPP with its defaults: a drop-in for Upstream.
	Sluice = "sluice"
	// SluiceAll is Sluice's EPP with every Sluice feature on: admission
	// (priority bands, queueing, shedding with Retry-After), Sluice's
	// default profile (which admission brings when no --config-file is
	// given), InferenceModelRewrites with sticky sessions (always on in
	// Kubernetes mode) and the rewrite guardrail.
	SluiceAll = "sluice-all-features"
)

// SluiceAllArgs are the flags that turn every Sluice feature on.
var SluiceAllArgs = []string{"--sluice-admission", "--model-rewrite-guardrail"}

// Implementation is an EPP binary and the arguments it runs with. The suite
// adds upstream's flags for the pool, ports and serving mode (see the
// package documentation); Args come first, so a fixture's own flags win.
type Implementation struct {
	Name   string
	Binary string
	Args   []string
	// Reference marks the implementation the others are compared with.
	Reference bool
	// Version is reported as the implementation's version.
	Version string
	// CRDs are directories of CRD manifests the implementation's features
	// need beyond GIE's, installed after the Startup group (which checks
	// that it starts without them, as upstream's manifests deploy it).
	CRDs []string
	// RBAC are manifests of a Role and RoleBinding the implementation's
	// features need beyond upstream's EPP Role, granted beside it where the
	// suite runs the EPP under RBAC (GatewayProfileManifest).
	RBAC []string
	// Compatible makes the differential strict for this implementation:
	// every observation that differs from the reference's must be an
	// intended difference listed in Differences (Sluice's compatibility
	// statement). Other implementations' differences are only reported.
	Compatible bool
}

// Selection is where the implementations under test come from: an explicit
// EPP (the -epp flag, for anyone's EPP), or the binaries `make test` builds.
type Selection struct {
	// EPP is the path of an EPP binary to test; EPPArgs its extra flags,
	// EPPName its name in reports (default "epp").
	EPP, EPPArgs, EPPName string
	// Reference, with EPP, is an EPP to compare it with (upstream's).
	Reference string
	// SluiceRoot is the root of Sluice's repository: SluiceAll's admission
	// watches FlowControlPolicies (crds/manifests) and needs their RBAC
	// (examples/flowcontrolpolicy-rbac.yaml).
	SluiceRoot string
	// Getenv reads SLUICE_EPP_BINARY, SLUICE_UPSTREAM_EPP_BINARY and
	// SLUICE_VERSION when EPP is empty; nil means os.Getenv.
	Getenv func(string) string
}

// ErrNoImplementation is returned when nothing names an EPP to test: the
// suite fails rather than pass having tested nothing.
var ErrNoImplementation = errors.New("no EPP implementation to test: pass -epp=/path/to/epp " +
	"(go test ./conformance -args -epp=...), or run `make conformance`, which builds bin/epp and bin/upstream-epp " +
	"and sets SLUICE_EPP_BINARY and SLUICE_UPSTREAM_EPP_BINARY")

// Implementations resolves s into the implementations to run: with EPP,
// that binary (and the reference, when given); otherwise upstream's EPP
// and Sluice's, with its defaults and with every feature on, from the
// environment. It fails when there is none, or a binary does not exist.
func (s Selection) Implementations() ([]Implementation, error) {
	getenv := s.Getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	var impls []Implementation
	if s.EPP != "" {
		name := s.EPPName
		if name == "" {
			name = "epp"
		}
		if s.Reference != "" {
			impls = append(impls, Implementation{Name: Upstream, Binary: s.Reference, Reference: true, Version: GIEVersion})
		}
		impls = append(impls, Implementation{Name: name, Binary: s.EPP, Args: strings.Fields(s.EPPArgs)})
	} else {
		if up := getenv("SLUICE_UPSTREAM_EPP_BINARY"); up != "" {
			impls = append(impls, Implementation{Name: Upstream, Binary: up, Reference: true, Version: GIEVersion})
		}
		if sl := getenv("SLUICE_EPP_BINARY"); sl != "" {
			v := getenv("SLUICE_VERSION")
			impls = append(impls,
				Implementation{Name: Sluice, Binary: sl, Compatible: true, Version: v},
				Implementation{Name: SluiceAll, Binary: sl, Args: SluiceAllArgs, Compatible: true, Version: v,
					CRDs: []string{filepath.Join(s.SluiceRoot, "crds", "manifests")},
					RBAC: []string{filepath.Join(s.SluiceRoot, "examples", "flowcontrolpolicy-rbac.yaml")}})
		}
	}
	if len(impls) == 0 {
		return nil, ErrNoImplementation
	}
	var errs []error
	seen := map[string]bool{}
	for _, im := range impls {
		if seen[im.Name] {
			errs = append(errs, fmt.Errorf("two implementations named %q", im.Name))
		}
		seen[im.Name] = true
		if st, err := os.Stat(im.Binary); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", im.Name, err))
		} else if st.IsDir() || st.Mode()&0o111 == 0 {
			errs = append(errs, fmt.Errorf("%s: %s is not an executable file", im.Name, im.Binary))
		}
	}
	return impls, errors.Join(errs...)
}
