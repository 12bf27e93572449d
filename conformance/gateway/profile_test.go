//go:build gateway

package gateway

import (
	"flag"
	"io/fs"
	"testing"

	inferenceconformance "sigs.k8s.io/gateway-api-inference-extension/conformance"
)

var eppImage = flag.String("epp-image", "", "EPP image to run in place of upstream's in resources/base.yaml (required)")

// TestGatewayProfile runs upstream's Gateway profile against the cluster of
// the current kubeconfig with the EPP image replaced. Every other flag is
// upstream's (-gateway-class, -report-output, -organization, ...).
func TestGatewayProfile(t *testing.T) {
	if *eppImage == "" {
		t.Fatal("-epp-image is required (make conformance-gateway sets it)")
	}
	manifests, err := Manifests(*eppImage)
	if err != nil {
		t.Fatal(err)
	}
	opts := inferenceconformance.DefaultOptions(t)
	opts.ManifestFS = []fs.FS{manifests}
	inferenceconformance.RunConformanceWithOptions(t, opts)
}
