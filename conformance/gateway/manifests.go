package gateway

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"testing/fstest"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"

	inferenceconformance "sigs.k8s.io/gateway-api-inference-extension/conformance"
)

// BaseManifestPath is where upstream's suite reads its base manifests from
// its embedded file system (conformance.go: baseManifestsValue).
const BaseManifestPath = "resources/base.yaml"

// eppContainer is the name of the EPP container in upstream's EPP
// Deployments.
const eppContainer = "epp"

// BaseManifest returns upstream's resources/base.yaml, byte for byte, from
// the conformance module's embedded file system.
func BaseManifest() ([]byte, error) {
	return fs.ReadFile(inferenceconformance.Manifests, BaseManifestPath)
}

// Manifests returns upstream's embedded manifests with the EPP image in
// resources/base.yaml replaced by image and every other file unchanged: the
// file system upstream's suite applies (ConformanceOptions.ManifestFS).
func Manifests(image string) (fs.FS, error) {
	out := fstest.MapFS{}
	err := fs.WalkDir(inferenceconformance.Manifests, ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := fs.ReadFile(inferenceconformance.Manifests, path)
		if err != nil {
			return err
		}
		if path == BaseManifestPath {
			if data, err = ReplaceEPPImage(data, image); err != nil {
				return err
			}
		}
		out[path] = &fstest.MapFile{Data: data, Mode: 0o444}
		return nil
	})
	return out, err
}

// ReplaceEPPImage replaces the image of every EPP container in base with
// image. Only those lines change: the result is otherwise byte-identical,
// which VerifyPatched checks.
func ReplaceEPPImage(base []byte, image string) ([]byte, error) {
	if strings.TrimSpace(image) == "" || strings.ContainsAny(image, " \t\n\"'") {
		return nil, fmt.Errorf("invalid EPP image %q", image)
	}
	deps, err := EPPDeployments(base)
	if err != nil {
		return nil, err
	}
	old := map[string]bool{}
	for _, d := range deps {
		old[d.Image] = true
	}
	lines := bytes.SplitAfter(base, []byte("\n"))
	replaced := 0
	for i, line := range lines {
		key, value, ok := imageLine(line)
		if ok && old[value] {
			lines[i] = []byte(key + image + strings.TrimPrefix(string(line), key+value))
			replaced++
		}
	}
	if replaced != len(deps) {
		return nil, fmt.Errorf("replaced %d image lines, want one per EPP Deployment (%d): the EPP image is also used elsewhere", replaced, len(deps))
	}
	return bytes.Join(lines, nil), nil
}

// imageLine splits a manifest line "<indent>image: <value>" into its prefix
// (up to the value) and the value.
func imageLine(line []byte) (prefix, value string, ok bool) {
	s := strings.TrimRight(string(line), "\r\n")
	trimmed := strings.TrimLeft(s, " ")
	if !strings.HasPrefix(trimmed, "image: ") {
		return "", "", false
	}
	prefix = s[:len(s)-len(trimmed)] + "image: "
	return prefix, strings.TrimSpace(strings.TrimPrefix(trimmed, "image: ")), true
}

// VerifyPatched checks that patched is base with exactly the EPP
// containers' image lines changed, to image.
func VerifyPatched(base, patched []byte, image string) error {
	deps, err := EPPDeployments(base)
	if err != nil {
		return err
	}
	bl, pl := bytes.SplitAfter(base, []byte("\n")), bytes.SplitAfter(patched, []byte("\n"))
	if len(bl) != len(pl) {
		return fmt.Errorf("patched manifest has %d lines, upstream's %d", len(pl), len(bl))
	}
	var errs []error
	changed := 0
	for i := range bl {
		if bytes.Equal(bl[i], pl[i]) {
			continue
		}
		changed++
		bk, _, bok := imageLine(bl[i])
		pk, pv, pok := imageLine(pl[i])
		if !bok || !pok || bk != pk || pv != image {
			errs = append(errs, fmt.Errorf("line %d differs beyond the EPP image:\n- %s+ %s", i+1, bl[i], pl[i]))
		}
	}
	if changed != len(deps) {
		errs = append(errs, fmt.Errorf("%d lines changed, want %d (one image per EPP Deployment)", changed, len(deps)))
	}
	pdeps, err := EPPDeployments(patched)
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	for _, d := range pdeps {
		if d.Image != image {
			errs = append(errs, fmt.Errorf("EPP Deployment %s still runs %s", d.Name, d.Image))
		}
	}
	return errors.Join(errs...)
}

// EPPDeployment is one EPP Deployment of the manifests: its name, the EPP
// container's image and arguments, and the gRPC health service its probes
// ask for.
type EPPDeployment struct {
	Name, Image  string
	Args         []string
	ProbeService string
}

// EPPDeployments lists the Deployments of manifest that run an EPP
// container, in document order.
func EPPDeployments(manifest []byte) ([]EPPDeployment, error) {
	var out []EPPDeployment
	err := eachDocument(manifest, func(kind string, doc []byte) error {
		if kind != "Deployment" {
			return nil
		}
		var d appsv1.Deployment
		if err := yaml.UnmarshalStrict(doc, &d); err != nil {
			return err
		}
		for _, c := range d.Spec.Template.Spec.Containers {
			if c.Name != eppContainer {
				continue
			}
			e := EPPDeployment{Name: d.Name, Image: c.Image, Args: c.Args}
			if p := c.ReadinessProbe; p != nil && p.GRPC != nil && p.GRPC.Service != nil {
				e.ProbeService = *p.GRPC.Service
			}
			out = append(out, e)
		}
		return nil
	})
	if err == nil && len(out) == 0 {
		err = errors.New("no EPP Deployment in the manifest")
	}
	return out, err
}

// EndpointPickerConfig returns the EPP configuration the manifest's EPPs
// mount: conformance-plugins.yaml of the plugins-config ConfigMap.
func EndpointPickerConfig(manifest []byte) (string, error) {
	var cfg string
	err := eachDocument(manifest, func(kind string, doc []byte) error {
		if kind != "ConfigMap" {
			return nil
		}
		var cm corev1.ConfigMap
		if err := yaml.UnmarshalStrict(doc, &cm); err != nil {
			return err
		}
		if cm.Name == "plugins-config" {
			cfg = cm.Data["conformance-plugins.yaml"]
		}
		return nil
	})
	if err == nil && cfg == "" {
		err = errors.New("no plugins-config ConfigMap with conformance-plugins.yaml in the manifest")
	}
	return cfg, err
}

// EPPRBAC returns the Role and RoleBinding the manifest grants its EPPs.
func EPPRBAC(manifest []byte) (*rbacv1.Role, *rbacv1.RoleBinding, error) {
	var role *rbacv1.Role
	var binding *rbacv1.RoleBinding
	err := eachDocument(manifest, func(kind string, doc []byte) error {
		switch kind {
		case "Role":
			role = &rbacv1.Role{}
			return yaml.UnmarshalStrict(doc, role)
		case "RoleBinding":
			binding = &rbacv1.RoleBinding{}
			return yaml.UnmarshalStrict(doc, binding)
		}
		return nil
	})
	if err == nil && (role == nil || binding == nil) {
		err = errors.New("the manifest grants its EPPs no Role and RoleBinding")
	}
	return role, binding, err
}

// eachDocument calls fn with the kind and text of each YAML document.
func eachDocument(manifest []byte, fn func(kind string, doc []byte) error) error {
	for i, doc := range bytes.Split(manifest, []byte("\n---")) {
		var meta struct {
			Kind string `json:"kind"`
		}
		if err := yaml.Unmarshal(doc, &meta); err != nil {
			return fmt.Errorf("document %d: %w", i+1, err)
		}
		if meta.Kind == "" {
			continue
		}
		if err := fn(meta.Kind, doc); err != nil {
			return fmt.Errorf("document %d (%s): %w", i+1, meta.Kind, err)
		}
	}
	return nil
}
