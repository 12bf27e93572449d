package gateway

import (
	"io/fs"
	"reflect"
	"slices"
	"strings"
	"testing"

	inferenceconformance "sigs.k8s.io/gateway-api-inference-extension/conformance"
)

const testImage = "sluice/epp:conformance-test"

// TestManifestsReplaceOnlyTheEPPImage checks what `make conformance-gateway`
// applies: upstream's base manifest with the five EPP images replaced and
// every other byte as upstream ships it, and every other embedded file
// unchanged.
func TestManifestsReplaceOnlyTheEPPImage(t *testing.T) {
	base, err := BaseManifest()
	if err != nil {
		t.Fatal(err)
	}
	mfs, err := Manifests(testImage)
	if err != nil {
		t.Fatal(err)
	}
	patched, err := fs.ReadFile(mfs, BaseManifestPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := VerifyPatched(base, patched, testImage); err != nil {
		t.Fatal(err)
	}
	deps, err := EPPDeployments(patched)
	if err != nil {
		t.Fatal(err)
	}
	if len(deps) != 5 {
		t.Errorf("%d EPP Deployments, want upstream's 5 (primary, secondary, appprotocol http and h2c, dp)", len(deps))
	}
	upstreamDeps, _ := EPPDeployments(base)
	for i, d := range deps {
		if !slices.Equal(d.Args, upstreamDeps[i].Args) || d.ProbeService != upstreamDeps[i].ProbeService {
			t.Errorf("%s: arguments or probes changed", d.Name)
		}
	}
	var files int
	err = fs.WalkDir(inferenceconformance.Manifests, ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		files++
		want, _ := fs.ReadFile(inferenceconformance.Manifests, path)
		got, err := fs.ReadFile(mfs, path)
		if err != nil {
			t.Errorf("%s missing from the patched file system: %v", path, err)
		} else if path != BaseManifestPath && !reflect.DeepEqual(got, want) {
			t.Errorf("%s changed", path)
		}
		return nil
	})
	if err != nil || files < 2 {
		t.Fatalf("walking upstream's manifests: %d files, %v", files, err)
	}
}

// TestVerifyPatchedCatchesOtherChanges makes sure the check above can fail.
func TestVerifyPatchedCatchesOtherChanges(t *testing.T) {
	base, _ := BaseManifest()
	patched, err := ReplaceEPPImage(base, testImage)
	if err != nil {
		t.Fatal(err)
	}
	for name, mutate := range map[string]func(string) string{
		"an argument": func(s string) string { return strings.Replace(s, `"4"`, `"2"`, 1) },
		"one image left": func(s string) string {
			return strings.Replace(s, testImage, "registry.k8s.io/gateway-api-inference-extension/epp:v1.5.0-rc.1", 1)
		},
		"a line added": func(s string) string { return s + "# extra\n" },
		"the config": func(s string) string {
			return strings.Replace(s, "header-based-testing-filter\n", "random-picker\n", 1)
		},
	} {
		if err := VerifyPatched(base, []byte(mutate(string(patched))), testImage); err == nil {
			t.Errorf("%s: VerifyPatched accepted it", name)
		}
	}
	if _, err := ReplaceEPPImage(base, "bad image"); err == nil {
		t.Error("an image with a space was accepted")
	}
}

// TestManifestFacts pins what the EPP profile's GatewayProfileManifest
// group reads from the manifest.
func TestManifestFacts(t *testing.T) {
	base, _ := BaseManifest()
	cfg, err := EndpointPickerConfig(base)
	if err != nil || !strings.Contains(cfg, "header-based-testing-filter") || !strings.Contains(cfg, "destination-endpoint-served-verifier") {
		t.Errorf("EndpointPickerConfig = %q, %v", cfg, err)
	}
	role, binding, err := EPPRBAC(base)
	if err != nil || len(role.Rules) == 0 || binding.RoleRef.Name != role.Name {
		t.Errorf("EPPRBAC: %v", err)
	}
	deps, _ := EPPDeployments(base)
	if deps[0].ProbeService != "inference-extension" {
		t.Errorf("primary EPP probes service %q", deps[0].ProbeService)
	}
}
